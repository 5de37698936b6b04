//! The request bodies of Courier's HTTP API, in one place for the daemon
//! (`courier-server`, which serves and documents them) and its clients (the
//! `courier` CLI, which sends them typed), and the validation that turns a
//! publish request into a [`NewMessage`](courier_core::NewMessage).
//!
//! Requests deserialise strictly (`deny_unknown_fields`) and serialise to
//! the JSON the daemon accepts. Their OpenAPI schemas (`utoipa::ToSchema`)
//! are derived here, so the document the daemon serves names them as they
//! are named here. A refused field is a [`RequestError`] naming the field
//! exactly as the daemon's error response does (`messages[2].topic`).

mod dead_letters;
mod error;
mod messages;
mod streams;

pub use dead_letters::{Affected, DeadLetterFilterBody, DeadLetterSelection};
pub use error::{RequestError, RequestErrorKind};
pub use messages::{BatchRequest, BatchResponse, PublishRequest, PublishResponse};
pub use streams::{
    AckRequest, AppendEntry, AppendRequest, ClaimRequest, GroupRequest, PendingParams, RangeQuery,
    ReadRequest, TrimRequest,
};

/// The documented schema of a payload: any JSON value, spelled as the list
/// of every JSON type (utoipa's own any-value schema, `{}`, does not read
/// back as a [`utoipa::openapi::OpenApi`]).
pub fn any_json_value() -> utoipa::openapi::schema::Object {
    use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
    ObjectBuilder::new()
        .description(Some("Any JSON value."))
        .schema_type(SchemaType::Array(vec![
            Type::Object,
            Type::Array,
            Type::String,
            Type::Number,
            Type::Boolean,
            Type::Null,
        ]))
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(tenant: &str, payload: serde_json::Value) -> PublishRequest {
        PublishRequest {
            tenant: tenant.to_owned(),
            topic: "invoice.paid".to_owned(),
            schema_version: None,
            payload: serde_json::value::to_raw_value(&payload).unwrap(),
            headers: None,
            ordering_key: None,
            idempotency_key: None,
            available_at: None,
            priority: None,
        }
    }

    #[test]
    fn a_priority_outside_0_to_9_is_refused_by_name() {
        let mut bad = request("acme", serde_json::json!({}));
        bad.priority = Some(10);
        let error = bad
            .validate_into("messages[1].", 1024, courier_core::MAX_HOLD, None)
            .unwrap_err();
        assert_eq!(error.kind, RequestErrorKind::Invalid);
        assert_eq!(error.field, "messages[1].priority");
        let mut good = request("acme", serde_json::json!({}));
        good.priority = Some(9);
        assert_eq!(good.into_message(1024).map(|m| m.priority), Ok(9));
    }

    #[test]
    fn refusals_name_the_field_under_the_prefix() {
        let error = request("bad tenant", serde_json::json!({}))
            .validate_into("messages[2].", 1024, courier_core::MAX_HOLD, None)
            .unwrap_err();
        assert_eq!(error.kind, RequestErrorKind::Invalid);
        assert_eq!(error.field, "messages[2].tenant");

        let error = request("acme", serde_json::json!("x".repeat(100)))
            .into_message(10)
            .unwrap_err();
        assert_eq!(error.kind, RequestErrorKind::TooLarge);
        assert_eq!(error.field, "payload");

        let mut headers = request("acme", serde_json::json!({}));
        headers.headers = Some(serde_json::json!({"x": 1}));
        let error = headers.into_message(1024).unwrap_err();
        assert_eq!(error.field, "headers.x");
    }

    #[test]
    fn requests_serialise_to_bodies_they_deserialise_from() {
        let publish = request("acme", serde_json::json!({"n": 1}));
        let text = serde_json::to_string(&publish).unwrap();
        let back: PublishRequest = serde_json::from_str(&text).unwrap();
        assert_eq!(back.into_message(1024).unwrap().payload, r#"{"n":1}"#);

        let selection = DeadLetterSelection {
            ids: None,
            filter: Some(DeadLetterFilterBody::default()),
            all: Some(true),
            dry_run: None,
        };
        let text = serde_json::to_string(&selection).unwrap();
        let back: DeadLetterSelection = serde_json::from_str(&text).unwrap();
        assert_eq!(back.all, Some(true));
        assert!(back.filter.is_some_and(|filter| filter.tenant.is_none()));
    }
}
