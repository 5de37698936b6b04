//! Secrets out of printed URLs: webhook URLs may carry `user:pass@` or a
//! query token, database and Redis URLs a password. Whatever the daemon
//! prints — config errors, start-up errors, delivery errors kept in the
//! error history (which every reader of the tenant sees) and the log — goes
//! through [`redact_urls`] first when it may hold such a URL.
//!
//! The redaction is textual, so a URL that does not parse (a bad port, a
//! stray character) is redacted too: the user information before `@` becomes
//! `***`, and every query value becomes `***` (the keys stay, so
//! `?sslmode=***` still tells what was set).

/// What replaces a secret.
pub const REDACTED: &str = "***";

/// `text` with the credentials and query values of every `scheme://…` URL
/// in it replaced by [`REDACTED`].
pub fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        // The scheme: the letters, digits, `+`, `-` and `.` before `://`.
        let scheme_start = rest[..at]
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map_or(at, |(i, _)| i);
        let body_start = at + 3;
        let body_len = rest[body_start..]
            .find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`'))
            .unwrap_or(rest.len() - body_start);
        if scheme_start == at {
            // No scheme: not a URL; keep the text.
            out.push_str(&rest[..body_start]);
            rest = &rest[body_start..];
            continue;
        }
        out.push_str(&rest[..body_start]);
        out.push_str(&redact_after_scheme(
            &rest[body_start..body_start + body_len],
        ));
        rest = &rest[body_start + body_len..];
    }
    out.push_str(rest);
    out
}

/// The part of a URL after `://`, with user information and query values redacted.
fn redact_after_scheme(body: &str) -> String {
    let authority_end = body.find(['/', '?', '#']).unwrap_or(body.len());
    let (authority, path) = body.split_at(authority_end);
    let mut out = String::with_capacity(body.len());
    match authority.rfind('@') {
        Some(at) => {
            out.push_str(REDACTED);
            out.push_str(&authority[at..]);
        }
        None => out.push_str(authority),
    }
    match path.find('?') {
        Some(question) => {
            out.push_str(&path[..=question]);
            let query_and_fragment = &path[question + 1..];
            let (query, fragment) = match query_and_fragment.find('#') {
                Some(hash) => query_and_fragment.split_at(hash),
                None => (query_and_fragment, ""),
            };
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) => format!("{key}={REDACTED}"),
                    None if pair.is_empty() => String::new(),
                    None => REDACTED.to_owned(),
                })
                .collect();
            out.push_str(&pairs.join("&"));
            out.push_str(fragment);
        }
        None => out.push_str(path),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_and_query_values_are_redacted() {
        assert_eq!(
            redact_urls("cannot reach postgres://app:hunter2@db:5432/courier?sslmode=require now"),
            "cannot reach postgres://***@db:5432/courier?sslmode=*** now"
        );
        assert_eq!(
            redact_urls("\"https://hook.example/h?token=abc&x\""),
            "\"https://hook.example/h?token=***&***\""
        );
        assert_eq!(
            redact_urls("redis://:pw@h:bad-port"),
            "redis://***@h:bad-port"
        );
        assert_eq!(
            redact_urls("no urls: here, a ://b"),
            "no urls: here, a ://b"
        );
        assert_eq!(
            redact_urls("http://127.0.0.1:7070/v1 and nats://n:4222"),
            "http://127.0.0.1:7070/v1 and nats://n:4222"
        );
    }
}
