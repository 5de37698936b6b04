//! Failure fingerprints: what groups dead letters by "what broke".
//!
//! A fingerprint is a short stable hash (FNV-1a, 64 bits, as 16 lowercase
//! hex digits) of the failure's [`ErrorKind`] and its message normalised by
//! [`normalise_error`]: numbers, ids (UUIDs, long hex), timestamps and quoted
//! values are replaced by placeholders, so that "order 17 failed" and "order
//! 18 failed" fall in one group while a timeout and a refusal do not. A
//! webhook's HTTP status is kept (`answered 503 …` and `answered 404 …` are
//! different failures), and the subscription named in a webhook's message is
//! left out: the subscriptions a failure touched are a property of its group,
//! not of the failure.
//!
//! The hash never changes between builds or platforms (it is written out
//! here, not taken from `std`'s randomly seeded hasher), so fingerprints
//! stored by one version keep matching the next. A change to the
//! normalisation splits groups across the change; such a change must say so.
//!
//! Dead letters stored before fingerprints existed have none; stores show
//! them under [`UNKNOWN_FINGERPRINT`].

use crate::{HandlerError, ValidationError};

/// The fingerprint of dead letters whose failure was recorded before
/// fingerprints were stored (or by a path that could not name one).
pub const UNKNOWN_FINGERPRINT: &str = "unknown";

/// What kind of failure a recorded error is; part of its fingerprint, so the
/// same text as a retryable and as a permanent failure groups apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A retryable handler failure ([`HandlerError::Retry`]), or a handler
    /// that did not finish.
    Retry,
    /// A retryable failure that named its delay ([`HandlerError::RetryAfter`]).
    RetryAfter,
    /// A failure that must not be retried ([`HandlerError::Permanent`]).
    Permanent,
    /// A snooze past the snooze bound ([`HandlerError::Snooze`]), which
    /// spends its attempt.
    Snooze,
    /// The worker's lease expired before it reported an outcome (a crash or
    /// a lost connection); recorded by the rescuer.
    LeaseExpired,
}

impl ErrorKind {
    /// The kind's stable name (`retry`, `retry_after`, `permanent`,
    /// `snooze`, `lease_expired`), as it enters the fingerprint.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Retry => "retry",
            ErrorKind::RetryAfter => "retry_after",
            ErrorKind::Permanent => "permanent",
            ErrorKind::Snooze => "snooze",
            ErrorKind::LeaseExpired => "lease_expired",
        }
    }
}

impl HandlerError {
    /// The kind of failure this is, for its fingerprint.
    pub fn kind(&self) -> ErrorKind {
        match self {
            HandlerError::Retry(_) => ErrorKind::Retry,
            HandlerError::RetryAfter { .. } => ErrorKind::RetryAfter,
            HandlerError::Permanent(_) => ErrorKind::Permanent,
            HandlerError::Snooze { .. } => ErrorKind::Snooze,
        }
    }
}

/// The fingerprint of a failure of `kind` described by `message`: 16
/// lowercase hex digits, a stable hash of the kind and
/// [`normalise_error`]`(message)`. Equal for messages that differ only in
/// numbers, ids, timestamps, quoted values, spacing or (for webhooks) the
/// subscription; different for different kinds and for different webhook
/// statuses.
pub fn error_fingerprint(kind: ErrorKind, message: &str) -> String {
    let mut hash = FNV_OFFSET;
    for byte in kind
        .as_str()
        .bytes()
        .chain(std::iter::once(b'\n'))
        .chain(normalise_error(message).bytes())
    {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(FNV_PRIME);
    }
    format!("{hash:016x}")
}

/// The fingerprint rescued deliveries get: every expired lease is one
/// failure, whichever worker held it.
pub fn lease_expired_fingerprint() -> String {
    error_fingerprint(ErrorKind::LeaseExpired, "lease expired")
}

/// Refuses a `field` that is neither a fingerprint ([`error_fingerprint`]'s
/// 16 lowercase hex digits) nor [`UNKNOWN_FINGERPRINT`].
pub fn validate_fingerprint(field: &'static str, value: &str) -> Result<(), ValidationError> {
    let hex = value.len() == 16
        && value
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if hex || value == UNKNOWN_FINGERPRINT {
        Ok(())
    } else {
        Err(ValidationError::new(
            field,
            format!(
                "{value:?} is not a fingerprint: 16 lowercase hex digits (as `dlq groups` shows) \
                 or {UNKNOWN_FINGERPRINT:?}"
            ),
        ))
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// `message` with what varies between occurrences of one failure replaced:
/// quoted values (`"…"`, `` `…` ``, `'…'`) by `<q>`, UUIDs by `<uuid>`,
/// timestamps (`2026-12-01T10:00:00Z`, `2026-12-01 10:00`) by `<time>`, hex
/// runs of 8 or more with a digit (hashes, trace ids, `0x…`) by `<hex>`, and
/// every other run of digits by `#` — except the status after `answered`
/// (how the daemon's webhooks report an HTTP answer). The subscription in
/// `webhook of subscription NAME` becomes `<subscription>`. Whitespace runs
/// become one space.
pub fn normalise_error(message: &str) -> String {
    let chars: Vec<char> = message.chars().collect();
    let mut words: Vec<String> = Vec::new();
    let mut current = String::new();
    let mut previous_word = String::new();
    let mut i = 0;
    let flush = |current: &mut String, words: &mut Vec<String>| {
        if !current.is_empty() {
            words.push(std::mem::take(current));
        }
    };
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            flush(&mut current, &mut words);
            i += 1;
            continue;
        }
        if let Some(end) = quoted_end(&chars, i) {
            current.push_str("<q>");
            i = end + 1;
            continue;
        }
        if c.is_alphanumeric() {
            let end = token_end(&chars, i);
            let token: String = chars[i..end].iter().collect();
            let after_webhook = previous_word == "subscription"
                && current.is_empty()
                && words.len() >= 3
                && words[words.len() - 3] == "webhook"
                && words[words.len() - 2] == "of";
            let replaced = if after_webhook {
                "<subscription>".to_owned()
            } else if previous_word == "answered"
                && current.is_empty()
                && token.len() == 3
                && token.bytes().all(|b| b.is_ascii_digit())
            {
                token.clone()
            } else {
                normalise_token(&token)
            };
            current.push_str(&replaced);
            previous_word = token;
            i = end;
            continue;
        }
        // Punctuation ends the word a status or a subscription follows.
        current.push(c);
        previous_word.clear();
        i += 1;
    }
    flush(&mut current, &mut words);
    words.join(" ")
}

/// Where the quoted value opening at `start` closes, if it is one: `"` and
/// `` ` `` close at their next occurrence; `'` only opens after a
/// non-alphanumeric character and closes before one (so "can't" is no
/// quote).
fn quoted_end(chars: &[char], start: usize) -> Option<usize> {
    let quote = chars[start];
    match quote {
        '"' | '`' => (start + 1..chars.len()).find(|&j| chars[j] == quote),
        '\'' => {
            if start > 0 && chars[start - 1].is_alphanumeric() {
                return None;
            }
            (start + 1..chars.len()).find(|&j| {
                chars[j] == '\'' && chars.get(j + 1).is_none_or(|next| !next.is_alphanumeric())
            })
        }
        _ => None,
    }
}

/// The end of the token starting at `start`: alphanumerics, `_` and `-`,
/// and `:`, `.`, `+` between alphanumerics (so a timestamp, a UUID or
/// `1.5` is one token, while `answered 503:` ends before the colon).
fn token_end(chars: &[char], start: usize) -> usize {
    let mut end = start;
    while end < chars.len() {
        let c = chars[end];
        let inner = matches!(c, ':' | '.' | '+')
            && chars
                .get(end + 1)
                .is_some_and(|next| next.is_alphanumeric())
            && end > start;
        if c.is_alphanumeric() || c == '_' || c == '-' || inner {
            end += 1;
        } else {
            break;
        }
    }
    // A trailing `-` or `_` is punctuation, not part of the token.
    while end > start + 1 && matches!(chars[end - 1], '-' | '_') {
        end -= 1;
    }
    end
}

fn normalise_token(token: &str) -> String {
    if is_uuid(token) {
        return "<uuid>".to_owned();
    }
    if is_timestamp(token) {
        return "<time>".to_owned();
    }
    if is_long_hex(token) {
        return "<hex>".to_owned();
    }
    let mut out = String::with_capacity(token.len());
    let mut in_digits = false;
    for c in token.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('#');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

fn is_uuid(token: &str) -> bool {
    let bytes = token.as_bytes();
    bytes.len() == 36
        && bytes.iter().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// `YYYY-MM-DD`, alone or followed by a time.
fn is_timestamp(token: &str) -> bool {
    let bytes = token.as_bytes();
    bytes.len() >= 10
        && bytes.iter().take(10).enumerate().all(|(i, b)| match i {
            4 | 7 => *b == b'-',
            _ => b.is_ascii_digit(),
        })
}

fn is_long_hex(token: &str) -> bool {
    let digits = token
        .strip_prefix("0x")
        .or_else(|| token.strip_prefix("0X"))
        .unwrap_or(token);
    digits.len() >= 8
        && digits.bytes().all(|b| b.is_ascii_hexdigit())
        && digits.bytes().any(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn same(kind: ErrorKind, a: &str, b: &str) {
        assert_eq!(
            error_fingerprint(kind, a),
            error_fingerprint(kind, b),
            "{a:?} and {b:?} should group together: {:?} vs {:?}",
            normalise_error(a),
            normalise_error(b)
        );
    }

    fn differ(kind_a: ErrorKind, a: &str, kind_b: ErrorKind, b: &str) {
        assert_ne!(
            error_fingerprint(kind_a, a),
            error_fingerprint(kind_b, b),
            "{a:?} and {b:?} should group apart: {:?}",
            normalise_error(a)
        );
    }

    #[test]
    fn numbers_are_normalised_away() {
        same(
            ErrorKind::Retry,
            "order 17 failed after 3 tries (1.5 s)",
            "order 20934 failed after 12 tries (0.25 s)",
        );
        same(
            ErrorKind::Retry,
            "timeout after 5000 ms",
            "timeout after 30000 ms",
        );
        assert_eq!(
            normalise_error("worker-17 on port 8080"),
            "worker-# on port #"
        );
    }

    #[test]
    fn uuids_and_hex_ids_are_normalised_away() {
        same(
            ErrorKind::Permanent,
            "permanent failure: customer 0190f3a4-7c1e-7d2a-9b3c-1234567890ab not found",
            "permanent failure: customer 01911111-2222-7333-8444-555566667777 not found",
        );
        same(
            ErrorKind::Retry,
            "trace 4bf92f3577b34da6a3ce929d0e0e4736 at 0x7ffd5e8c",
            "trace 00f067aa0ba902b7a3ce929d0e0e0000 at 0x1a2b3c4d",
        );
        assert_eq!(
            normalise_error("id 0190f3a4-7c1e-7d2a-9b3c-1234567890ab"),
            "id <uuid>"
        );
    }

    #[test]
    fn timestamps_are_normalised_away() {
        same(
            ErrorKind::Retry,
            "token expired at 2026-12-01T10:00:00Z",
            "token expired at 2026-12-04T13:51:14.123+01:00",
        );
        same(
            ErrorKind::Retry,
            "locked since 2026-12-01 10:00:00",
            "locked since 2025-01-31 23:59:59",
        );
        assert_eq!(
            normalise_error("expired at 2026-12-01T10:00:00Z."),
            "expired at <time>."
        );
    }

    #[test]
    fn quoted_values_are_normalised_away() {
        same(
            ErrorKind::Permanent,
            r#"permanent failure: unknown field "colour" in 'billing'"#,
            r#"permanent failure: unknown field "size" in 'shipping'"#,
        );
        same(
            ErrorKind::Retry,
            "relation `orders_2026` is locked",
            "relation `x` is locked",
        );
        // An apostrophe in a word is no quote.
        assert_eq!(
            normalise_error("can't reach 'db-1', won't retry"),
            "can't reach <q>, won't retry"
        );
    }

    #[test]
    fn whitespace_does_not_split_a_group() {
        same(
            ErrorKind::Retry,
            "connection  refused\n",
            "connection refused",
        );
    }

    #[test]
    fn a_webhook_s_status_is_kept_and_its_subscription_left_out() {
        let answered = |subscription: &str, status: &str, body: &str| {
            format!("webhook of subscription {subscription} answered {status}: {body}")
        };
        differ(
            ErrorKind::Retry,
            &answered("orders", "503 Service Unavailable", "busy"),
            ErrorKind::Retry,
            &answered("orders", "502 Bad Gateway", "busy"),
        );
        differ(
            ErrorKind::Permanent,
            &answered("orders", "404 Not Found", "no route"),
            ErrorKind::Permanent,
            &answered("orders", "410 Gone", "no route"),
        );
        same(
            ErrorKind::Retry,
            &answered("orders", "503 Service Unavailable", "request 81 queued"),
            &answered("billing-2", "503 Service Unavailable", "request 93 queued"),
        );
        assert_eq!(
            normalise_error(&answered("orders", "503 Service Unavailable", "try in 5 s")),
            "webhook of subscription <subscription> answered 503 Service Unavailable: try in # s"
        );
        same(
            ErrorKind::Retry,
            "webhook of subscription a timed out after 5000 ms",
            "webhook of subscription b timed out after 10000 ms",
        );
    }

    #[test]
    fn different_kinds_differ() {
        let kinds = [
            ErrorKind::Retry,
            ErrorKind::RetryAfter,
            ErrorKind::Permanent,
            ErrorKind::Snooze,
            ErrorKind::LeaseExpired,
        ];
        for (i, a) in kinds.iter().enumerate() {
            for b in &kinds[i + 1..] {
                differ(*a, "boom", *b, "boom");
            }
        }
        differ(
            ErrorKind::Retry,
            "connection refused",
            ErrorKind::Retry,
            "connection reset",
        );
    }

    #[test]
    fn a_fingerprint_is_stable_and_validates() {
        let fingerprint = error_fingerprint(ErrorKind::Retry, "boom");
        // Pinned: a stored fingerprint must keep matching after an upgrade.
        assert_eq!(fingerprint, "12d9332466744b46");
        assert_eq!(fingerprint.len(), 16);
        assert_eq!(validate_fingerprint("fingerprint", &fingerprint), Ok(()));
        assert_eq!(
            validate_fingerprint("fingerprint", UNKNOWN_FINGERPRINT),
            Ok(())
        );
        for bad in [
            "",
            "ABCDEF0123456789",
            "0123",
            "0123456789abcdeg",
            "unknown ",
        ] {
            let refused = validate_fingerprint("fingerprint", bad).unwrap_err();
            assert_eq!(refused.field, "fingerprint", "{bad:?}");
        }
    }

    #[test]
    fn handler_errors_name_their_kind() {
        assert_eq!(HandlerError::retry("x").kind(), ErrorKind::Retry);
        assert_eq!(HandlerError::permanent("x").kind(), ErrorKind::Permanent);
        let delay = std::time::Duration::from_secs(1);
        assert_eq!(
            HandlerError::retry_after(delay, "x").kind(),
            ErrorKind::RetryAfter
        );
        assert_eq!(HandlerError::snooze(delay, "x").kind(), ErrorKind::Snooze);
    }
}
