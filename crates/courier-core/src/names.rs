//! The grammar for tenant, topic, subscription, group and stream names.

use crate::ValidationError;

/// The longest name Courier accepts, in bytes (names are ASCII).
pub const NAME_MAX_LEN: usize = 128;

/// Checks `value` against Courier's name grammar `[A-Za-z0-9][A-Za-z0-9._-]{0,127}`.
///
/// `:` is reserved as the separator of derived keys, so it is refused like any
/// other character outside the grammar. The error names `field` and the reason.
pub fn validate_name(field: &'static str, value: &str) -> Result<(), ValidationError> {
    let invalid = |reason: String| ValidationError::new(field, reason);
    let Some(first) = value.chars().next() else {
        return Err(invalid("must not be empty".into()));
    };
    if value.len() > NAME_MAX_LEN {
        return Err(invalid(format!(
            "is {} bytes long; the limit is {NAME_MAX_LEN}",
            value.len()
        )));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(invalid(format!(
            "must start with an ASCII letter or digit, not {first:?}"
        )));
    }
    if let Some(bad) = value
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(invalid(format!(
            "may contain only ASCII letters, digits, '.', '_' and '-', found {bad:?}"
        )));
    }
    Ok(())
}

/// Whether a subscription's topic `pattern` (an exact topic, `prefix.*` for
/// the topics that start with `prefix.`, or `*` for all) takes `topic`, as
/// the fan-out decides what a subscription is owed.
pub fn topic_matches(pattern: &str, topic: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    match pattern.strip_suffix('*') {
        Some(prefix) if prefix.ends_with('.') => topic.starts_with(prefix),
        _ => pattern == topic,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_take_their_topics() {
        assert!(topic_matches("*", "invoice.paid"));
        assert!(topic_matches("invoice.*", "invoice.paid"));
        assert!(topic_matches("invoice.*", "invoice.paid.late"));
        assert!(!topic_matches("invoice.*", "invoice"));
        assert!(!topic_matches("invoice.*", "invoices.paid"));
        assert!(topic_matches("invoice.paid", "invoice.paid"));
        assert!(!topic_matches("invoice.paid", "invoice.void"));
    }

    #[test]
    fn accepts_the_grammar() {
        for name in [
            "a",
            "billing",
            "invoice.created",
            "wrong_questions_v1",
            "A-1.b_c",
        ] {
            assert!(validate_name("topic", name).is_ok(), "{name}");
        }
        assert!(validate_name("topic", &"a".repeat(128)).is_ok());
    }

    #[test]
    fn refuses_everything_else_and_names_the_field() {
        for name in ["", ".a", "_a", "a:b", "a b", "é", "a/b", "a*"] {
            let err = validate_name("tenant", name).expect_err(name);
            assert_eq!(err.field, "tenant");
        }
        assert!(validate_name("topic", &"a".repeat(129)).is_err());
    }
}
