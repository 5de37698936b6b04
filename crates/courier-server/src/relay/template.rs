//! Names rendered per message from a template over `{tenant}` and `{topic}`:
//! the stream a Redis or native relay appends to, the subject a NATS relay
//! publishes on.
//!
//! A template is literal text with the placeholders `{tenant}` and `{topic}`
//! (each any number of times, or not at all); any other `{` or `}` is
//! refused when the template is parsed. Whether the rendered text is a valid
//! name is checked twice: at start, by rendering with [`SAMPLE_NAME`] for
//! both placeholders (so a template that can never render a valid name stops
//! the daemon), and for every message (a long tenant or topic can still push
//! a name past its length limit: that message fails permanently).

use std::fmt;

use courier::validate_name;

/// What the placeholders are replaced with when a template is checked at start.
pub const SAMPLE_NAME: &str = "sample";

/// The longest NATS subject a relay publishes on, in bytes.
pub const MAX_SUBJECT_BYTES: usize = 1024;

/// The longest JetStream stream name accepted, in bytes.
pub const MAX_JETSTREAM_NAME_BYTES: usize = 255;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Tenant,
    Topic,
}

/// A parsed template over `{tenant}` and `{topic}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    pieces: Vec<Piece>,
}

impl Template {
    /// Parses `source`; refuses braces other than the two placeholders.
    pub fn parse(source: &str) -> Result<Self, String> {
        let mut pieces = Vec::new();
        let mut text = String::new();
        let mut rest = source;
        while let Some(at) = rest.find(['{', '}']) {
            text.push_str(&rest[..at]);
            let tail = &rest[at..];
            let (piece, length) = if tail.starts_with("{tenant}") {
                (Piece::Tenant, "{tenant}".len())
            } else if tail.starts_with("{topic}") {
                (Piece::Topic, "{topic}".len())
            } else {
                let shown: String = tail.chars().take(12).collect();
                return Err(format!(
                    "has {shown:?}: the only placeholders are {{tenant}} and {{topic}}, \
                     and braces may not appear otherwise"
                ));
            };
            if !text.is_empty() {
                pieces.push(Piece::Text(std::mem::take(&mut text)));
            }
            pieces.push(piece);
            rest = &tail[length..];
        }
        text.push_str(rest);
        if !text.is_empty() {
            pieces.push(Piece::Text(text));
        }
        Ok(Self {
            source: source.to_owned(),
            pieces,
        })
    }

    /// The template as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The text for a message of `tenant` on `topic`.
    pub fn render(&self, tenant: &str, topic: &str) -> String {
        let mut out = String::with_capacity(self.source.len() + tenant.len() + topic.len());
        for piece in &self.pieces {
            match piece {
                Piece::Text(text) => out.push_str(text),
                Piece::Tenant => out.push_str(tenant),
                Piece::Topic => out.push_str(topic),
            }
        }
        out
    }

    /// The stream name for `tenant`/`topic`, checked against the name grammar.
    pub fn stream_name(&self, tenant: &str, topic: &str) -> Result<String, String> {
        let name = self.render(tenant, topic);
        validate_name("stream", &name).map_err(|e| {
            format!(
                "the stream name {name:?} rendered from {:?} {}",
                self.source, e.reason
            )
        })?;
        Ok(name)
    }

    /// The NATS subject for `tenant`/`topic`, checked by [`validate_subject`].
    /// A tenant with a `.` is refused where the template places `{tenant}`:
    /// its tokens would be ambiguous (tenant `a.b` on topic `c` and tenant
    /// `a` on topic `b.c` would share a subject, and a subscriber to one
    /// tenant's subjects would get the other's messages).
    pub fn subject(&self, tenant: &str, topic: &str) -> Result<String, String> {
        if tenant.contains('.') && self.pieces.contains(&Piece::Tenant) {
            return Err(format!(
                "tenant {tenant:?} contains a '.', which the subject rendered from {:?} cannot \
                 tell from a topic's: tenant \"a.b\" on topic \"c\" and tenant \"a\" on topic \
                 \"b.c\" would share a subject; a NATS relay whose subject names the tenant takes \
                 tenants without dots",
                self.source
            ));
        }
        let subject = self.render(tenant, topic);
        validate_subject(&subject).map_err(|reason| {
            format!(
                "the subject {subject:?} rendered from {:?} {reason}",
                self.source
            )
        })?;
        Ok(subject)
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Parses a stream-name template and checks that it renders a valid name.
pub fn stream_template(source: &str) -> Result<Template, String> {
    let template = Template::parse(source)?;
    template.stream_name(SAMPLE_NAME, SAMPLE_NAME)?;
    Ok(template)
}

/// Parses a subject template and checks that it renders a valid subject.
/// `{tenant}` must not share a token (the text between dots) with another
/// placeholder: in `a.{tenant}-{topic}`, tenant `x-y` on topic `z` and
/// tenant `x` on topic `y-z` would share a subject.
pub fn subject_template(source: &str) -> Result<Template, String> {
    if let Some(token) = source
        .split('.')
        .find(|token| token.contains("{tenant}") && token.matches('{').count() > 1)
    {
        return Err(format!(
            "has the token {token:?}: {{tenant}} must be a token's only placeholder, or two \
             tenants' messages could share a subject"
        ));
    }
    let template = Template::parse(source)?;
    template.subject(SAMPLE_NAME, SAMPLE_NAME)?;
    Ok(template)
}

/// Checks a subject to publish on: at most [`MAX_SUBJECT_BYTES`], tokens
/// separated by `.`, none empty, printable ASCII other than space, and no
/// wildcard (`*`, `>`), which a publish may not use.
pub fn validate_subject(subject: &str) -> Result<(), String> {
    if subject.is_empty() {
        return Err("is empty".into());
    }
    if subject.len() > MAX_SUBJECT_BYTES {
        return Err(format!(
            "is {} bytes; the limit is {MAX_SUBJECT_BYTES}",
            subject.len()
        ));
    }
    if let Some(bad) = subject
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '*' | '>'))
    {
        return Err(format!(
            "contains {bad:?}: a subject to publish on is printable ASCII without spaces or wildcards (* and >)"
        ));
    }
    if subject.split('.').any(str::is_empty) {
        return Err("has an empty token (two dots in a row, or a dot at an end)".into());
    }
    Ok(())
}

/// Checks a JetStream stream name: 1 to [`MAX_JETSTREAM_NAME_BYTES`]
/// printable ASCII characters other than space, `.`, `*`, `>`, `/` and `\`.
pub fn validate_jetstream_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_JETSTREAM_NAME_BYTES {
        return Err(format!(
            "must be 1 to {MAX_JETSTREAM_NAME_BYTES} bytes, got {}",
            name.len()
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '.' | '*' | '>' | '/' | '\\'))
    {
        return Err(format!(
            "contains {bad:?}: a JetStream stream name is printable ASCII without spaces, `.`, `*`, `>`, `/` or `\\`"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_render_both_placeholders_any_number_of_times() {
        let template = Template::parse("{tenant}.{topic}.{topic}x").unwrap();
        assert_eq!(
            template.render("acme", "order.placed"),
            "acme.order.placed.order.placedx"
        );
        assert_eq!(Template::parse("fixed").unwrap().render("a", "b"), "fixed");
        assert_eq!(Template::parse("").unwrap().render("a", "b"), "");
    }

    #[test]
    fn stray_braces_and_unknown_placeholders_are_refused() {
        for bad in ["{tenants}", "{topic", "a}b", "{}", "{{tenant}}", "x{Topic}"] {
            let err = Template::parse(bad).unwrap_err();
            assert!(err.contains("placeholders"), "{bad}: {err}");
        }
    }

    #[test]
    fn stream_templates_must_render_valid_names() {
        assert!(stream_template("{topic}").is_ok());
        assert!(stream_template("relay-{tenant}.{topic}").is_ok());
        for bad in ["", "a:{topic}", ".{topic}", "{topic} x", "é{topic}"] {
            assert!(stream_template(bad).is_err(), "{bad}");
        }
        let long = stream_template("{topic}").unwrap();
        let err = long.stream_name("acme", &"t".repeat(129)).unwrap_err();
        assert!(err.contains("rendered from"), "{err}");
    }

    #[test]
    fn subjects_are_tokens_without_wildcards() {
        assert!(subject_template("courier.{tenant}.{topic}").is_ok());
        for bad in [
            "",
            "a..{topic}",
            "{topic}.",
            "a.*.{topic}",
            "a.>",
            "a b.{topic}",
        ] {
            assert!(subject_template(bad).is_err(), "{bad}");
        }
        // Two tenants' messages never share a subject: a tenant's dots
        // would make its tokens ambiguous.
        let template = subject_template("courier.{tenant}.{topic}").unwrap();
        assert_eq!(
            template.subject("acme", "eu.order").unwrap(),
            "courier.acme.eu.order"
        );
        let err = template.subject("acme.eu", "order").unwrap_err();
        assert!(err.contains("\"acme.eu\""), "{err}");
        // Nor could another placeholder in the tenant's token.
        for shared_token in [
            "x.{tenant}-{topic}",
            "x.{topic}{tenant}",
            "x.{tenant}{tenant}",
        ] {
            let err = subject_template(shared_token).unwrap_err();
            assert!(err.contains("only placeholder"), "{shared_token}: {err}");
        }
        assert!(subject_template("x.t-{tenant}.{topic}-v1").is_ok());
        // Without `{tenant}` in it, tenants share the subjects by design.
        let shared = subject_template("courier.{topic}").unwrap();
        assert_eq!(shared.subject("acme.eu", "order").unwrap(), "courier.order");
        assert!(validate_jetstream_name("ORDERS_1").is_ok());
        for bad in ["", "A.B", "A B", "A*", "A/B"] {
            assert!(validate_jetstream_name(bad).is_err(), "{bad}");
        }
    }
}
