//! The extractors every API route reads its input with, strict and naming
//! the field of what they refuse: [`ApiJson`] (a body capped before it is
//! read, declared as JSON, matching the type exactly), [`ApiPath`] and
//! [`ApiQuery`], and the batch body reader that checks the count and the size
//! of each item while it parses.
//!
//! A body that is not JSON is 400; a body of the wrong shape, an unknown
//! field or a wrong type is 422 naming the field (`messages[3].topic`); a
//! body over the route's cap is 413 (`body`); a declared content type other
//! than JSON is 415.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Path, Request};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use serde::de::DeserializeOwned;
use serde::Deserialize;

use super::MAX_BATCH_MESSAGES;
use crate::error::ApiError;
use crate::guard::is_json;

/// A JSON body parsed strictly, with errors that name the field.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = read_body(request, state).await?;
        parse_json(&bytes).map(ApiJson)
    }
}

/// The body of a request under the route's size cap, declared as JSON.
pub(super) async fn read_body<S: Send + Sync>(
    request: Request,
    state: &S,
) -> Result<Bytes, ApiError> {
    // The router's guard refuses state changes without JSON already;
    // this holds for bodies read under any other router too.
    if let Some(content_type) = request.headers().get(header::CONTENT_TYPE) {
        let content_type = String::from_utf8_lossy(content_type.as_bytes());
        if !is_json(&content_type) {
            return Err(ApiError::unsupported_media_type(format!(
                "the body must be application/json, not {content_type:?}"
            )));
        }
    }
    Bytes::from_request(request, state)
        .await
        .map_err(|rejection| {
            if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(
                    "body",
                    "the request body is over this route's size limit (see max_payload_bytes)",
                )
            } else {
                ApiError::malformed(format!("cannot read the request body: {rejection}"))
            }
        })
}

/// A batch body, checked as it is read: the items of `messages` are kept as
/// slices of the body, and reading stops at item [`MAX_BATCH_MESSAGES`] + 1,
/// so neither a long array nor a large item is built into JSON values first.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchEnvelope<'a> {
    #[serde(borrow)]
    messages: BatchItems<'a>,
}

/// At most [`MAX_BATCH_MESSAGES`] raw items.
struct BatchItems<'a>(Vec<&'a serde_json::value::RawValue>);

/// The deserialisation error of an array past [`MAX_BATCH_MESSAGES`].
const TOO_MANY_MESSAGES: &str = "the batch holds more messages than the limit";

impl<'de: 'a, 'a> Deserialize<'de> for BatchItems<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Items<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Items<'a> {
            type Value = BatchItems<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "an array of 1 to {MAX_BATCH_MESSAGES} messages")
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<&'a serde_json::value::RawValue>()? {
                    if items.len() == MAX_BATCH_MESSAGES {
                        return Err(serde::de::Error::custom(TOO_MANY_MESSAGES));
                    }
                    items.push(item);
                }
                Ok(BatchItems(items))
            }
        }
        deserializer.deserialize_seq(Items(std::marker::PhantomData))
    }
}

/// The raw items of a batch body (see [`BatchEnvelope`]), with errors that
/// name the field: 422 `messages` past [`MAX_BATCH_MESSAGES`] items.
pub(super) fn batch_items(bytes: &[u8]) -> Result<Vec<&serde_json::value::RawValue>, ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
            Ok(_) => Err(ApiError::invalid("body", "the body must be a JSON object")),
            Err(e) => Err(ApiError::malformed(format!(
                "the body is not valid JSON: {e}"
            ))),
        };
    }
    let envelope: BatchEnvelope<'_> = serde_json::from_slice(bytes).map_err(|error| {
        let message = strip_position(&error.to_string());
        match error.classify() {
            serde_json::error::Category::Data if message == TOO_MANY_MESSAGES => ApiError::invalid(
                "messages",
                format!("must hold 1 to {MAX_BATCH_MESSAGES} messages, got more"),
            ),
            serde_json::error::Category::Data => {
                let field = message
                    .strip_prefix("unknown field `")
                    .and_then(|rest| rest.split('`').next())
                    .unwrap_or("messages")
                    .to_owned();
                ApiError::invalid(field, message)
            }
            _ => ApiError::malformed(format!("the body is not valid JSON: {error}")),
        }
    })?;
    Ok(envelope.messages.0)
}

/// `error` of item `index` of a batch, its field under `messages[index]`.
pub(super) fn in_batch(index: usize, error: ApiError) -> ApiError {
    let field = match error.field.as_deref() {
        None | Some("body") => format!("messages[{index}]"),
        Some(field) => format!("messages[{index}].{field}"),
    };
    ApiError {
        field: Some(field),
        ..error
    }
}

/// Parses `bytes` as `T`, naming the field of any error.
pub(super) fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    // serde reads a struct from an array too; requests are objects only.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return match serde_json::from_slice::<serde::de::IgnoredAny>(bytes) {
            Ok(_) => Err(ApiError::invalid("body", "the body must be a JSON object")),
            Err(e) => Err(ApiError::malformed(format!(
                "the body is not valid JSON: {e}"
            ))),
        };
    }
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value: T = serde_path_to_error::deserialize(&mut deserializer).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                let message = inner.to_string();
                ApiError::invalid(field_of(&path, &message), strip_position(&message))
            }
            _ => ApiError::malformed(format!("the body is not valid JSON: {inner}")),
        }
    })?;
    deserializer
        .end()
        .map_err(|e| ApiError::malformed(format!("the body is not valid JSON: {e}")))?;
    Ok(value)
}

/// The field an error concerns: the path serde reports, or for a missing
/// field, the field named in the message under that path.
fn field_of(path: &str, message: &str) -> String {
    let base = if path == "." { "" } else { path };
    if let Some(rest) = message.strip_prefix("missing field `") {
        if let Some(name) = rest.split('`').next() {
            return if base.is_empty() {
                name.to_owned()
            } else {
                format!("{base}.{name}")
            };
        }
    }
    if base.is_empty() {
        "body".to_owned()
    } else {
        base.to_owned()
    }
}

fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(index) => message[..index].to_owned(),
        None => message.to_owned(),
    }
}

/// A path parameter, percent-decoded; a parameter that is not UTF-8 once
/// decoded (`/v1/messages/%FF`) is refused 422 naming the parameter.
pub struct ApiPath<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiPath<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Send,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        use axum::extract::path::ErrorKind;
        use axum::extract::rejection::PathRejection;
        match Path::<T>::from_request_parts(parts, state).await {
            Ok(Path(value)) => Ok(ApiPath(value)),
            Err(PathRejection::FailedToDeserializePathParams(error)) => {
                let message = error.body_text();
                Err(match error.into_kind() {
                    ErrorKind::InvalidUtf8InPathParam { key } => {
                        ApiError::invalid(key, "is not valid UTF-8 once percent-decoded")
                    }
                    ErrorKind::ParseErrorAtKey { key, .. }
                    | ErrorKind::DeserializeError { key, .. } => ApiError::invalid(key, message),
                    _ => ApiError::invalid("path", message),
                })
            }
            Err(rejection) => Err(ApiError::internal(format!(
                "the path parameters are not available: {}",
                rejection.body_text()
            ))),
        }
    }
}

/// A query string parsed strictly, with errors that name the parameter.
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or("");
        let deserializer =
            serde_urlencoded::Deserializer::new(form_urlencoded::parse(query.as_bytes()));
        serde_path_to_error::deserialize(deserializer)
            .map(ApiQuery)
            .map_err(|error| {
                let path = error.path().to_string();
                let message = error.into_inner().to_string();
                let field = match message
                    .strip_prefix("unknown field `")
                    .and_then(|rest| rest.split('`').next())
                {
                    Some(name) => name.to_owned(),
                    None => field_of(&path, &message),
                };
                ApiError::invalid(field, format!("bad query parameter: {message}"))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{BatchRequest, PublishRequest};

    #[test]
    fn json_errors_name_the_field() {
        let err = parse_json::<PublishRequest>(br#"{"tenant": 5, "topic": "t", "payload": 1}"#)
            .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("tenant"), "{err:?}");
        let err = parse_json::<PublishRequest>(br#"{"topic": "t", "payload": 1}"#).unwrap_err();
        assert_eq!(err.field.as_deref(), Some("tenant"), "{err:?}");
        let err =
            parse_json::<PublishRequest>(br#"{"tenant": "a", "topic": "t", "payload": 1, "x": 1}"#)
                .unwrap_err();
        assert_eq!(err.field.as_deref(), Some("x"), "{err:?}");
        let err = parse_json::<BatchRequest>(
            br#"{"messages": [{"tenant": "a", "topic": "t", "payload": 1, "schema_version": "1"}]}"#,
        )
        .unwrap_err();
        assert_eq!(
            err.field.as_deref(),
            Some("messages[0].schema_version"),
            "{err:?}"
        );
        let err = parse_json::<PublishRequest>(b"{").unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
        let err = parse_json::<PublishRequest>(br#"{"tenant": "a", "topic": "t", "payload": 1} x"#)
            .unwrap_err();
        assert_eq!(err.status, StatusCode::BAD_REQUEST);
    }
}
