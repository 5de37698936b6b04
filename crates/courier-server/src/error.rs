//! The one error shape of the HTTP API: `{"error": {"code", "message", "field"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use courier::{StoreError, ValidationError};
use serde::Serialize;
use utoipa::ToSchema;

/// The `Retry-After` of every 503, in seconds.
pub const RETRY_AFTER_SECONDS: u64 = 1;

/// An API failure: its status, a stable code, a message for people and the
/// request field it concerns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// A stable, machine-readable code (`invalid_field`, `unauthorized`, ...).
    pub code: &'static str,
    /// What went wrong, in words a user can act on.
    pub message: String,
    /// The request field concerned (`tenant`, `messages[2].topic`, `body`), if any.
    pub field: Option<String>,
    /// The `Retry-After` of a 429, in seconds (a 503 always says
    /// [`RETRY_AFTER_SECONDS`]).
    pub retry_after: Option<u64>,
}

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// The error.
    pub error: ErrorDetail,
}

/// One error.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    /// A stable, machine-readable code.
    pub code: String,
    /// What went wrong.
    pub message: String,
    /// The request field concerned, or `null`.
    pub field: Option<String>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        code: &'static str,
        message: impl Into<String>,
        field: Option<String>,
    ) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            field,
            retry_after: None,
        }
    }

    /// 429: over a request limit (see [`crate::limits`]); the response
    /// carries `Retry-After`, `seconds` (at least 1).
    pub fn too_many_requests(message: impl Into<String>, seconds: u64) -> Self {
        let mut error = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_requests",
            message,
            None,
        );
        error.retry_after = Some(seconds.max(1));
        error
    }

    /// 401: no token, or one that matches none configured.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            message,
            Some("authorization".into()),
        )
    }

    /// 403: the token may not do this.
    pub fn forbidden(message: impl Into<String>, field: Option<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", message, field)
    }

    /// 421: the request's `Host` is not one this daemon answers to.
    pub fn misdirected(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::MISDIRECTED_REQUEST,
            "misdirected_request",
            message,
            Some("host".into()),
        )
    }

    /// 408: the request did not complete within the server's request timeout.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "request_timeout",
            message,
            None,
        )
    }

    /// 404: no such thing (or not visible to this token).
    pub fn not_found(message: impl Into<String>, field: Option<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", message, field)
    }

    /// 405: the path exists, but not with this method.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            message,
            Some("method".into()),
        )
    }

    /// 431: the request head has more headers, or more bytes, than the
    /// daemon reads.
    pub fn headers_too_large(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "headers_too_large",
            message,
            Some("headers".into()),
        )
    }

    /// 400: the body is not JSON.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "malformed_json",
            message,
            Some("body".into()),
        )
    }

    /// 400: a `cursor` parameter that is not a `next_cursor` of this list.
    pub fn bad_cursor(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_cursor",
            message,
            Some("cursor".into()),
        )
    }

    /// 422: a field has the wrong type, is unknown, missing, or refused.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_field",
            message,
            Some(field.into()),
        )
    }

    /// 409: the request conflicts with the current state.
    pub fn conflict(message: impl Into<String>, field: Option<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message, field)
    }

    /// 409 `already_started`: a message a subscription has started on
    /// cannot be cancelled.
    pub fn already_started(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "already_started",
            message,
            Some("id".to_owned()),
        )
    }

    /// 409 `not_a_webhook`: a webhook-only action on another kind of target.
    pub fn not_a_webhook(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "not_a_webhook",
            message,
            Some("name".to_owned()),
        )
    }

    /// 409 `idempotency_key_reused`: the key names an earlier message whose
    /// topic, schema version or payload differ from this request's.
    pub fn idempotency_key_reused(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "idempotency_key_reused",
            message,
            Some("idempotency_key".to_owned()),
        )
    }

    /// 413: the body or a payload is over its limit.
    pub fn too_large(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            message,
            Some(field.into()),
        )
    }

    /// 415: the body is declared as something other than JSON.
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            message,
            Some("content-type".into()),
        )
    }

    /// 503: the database or stream backend is unreachable for now; the
    /// response carries `Retry-After` ([`RETRY_AFTER_SECONDS`]).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            message,
            None,
        )
    }

    /// 500: something failed that the client cannot fix.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message, None)
    }

    /// A validation error, with `prefix` (`messages[2].`) before its field.
    pub fn from_validation(prefix: &str, error: ValidationError) -> Self {
        Self::invalid(format!("{prefix}{}", error.field), error.reason)
    }
}

impl From<ValidationError> for ApiError {
    fn from(error: ValidationError) -> Self {
        Self::from_validation("", error)
    }
}

impl From<courier_api::RequestError> for ApiError {
    /// 422 (`invalid_field`) or 413 (`too_large`), naming the same field.
    fn from(error: courier_api::RequestError) -> Self {
        match error.kind {
            courier_api::RequestErrorKind::TooLarge => Self::too_large(error.field, error.message),
            _ => Self::invalid(error.field, error.message),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(error: StoreError) -> Self {
        match error {
            StoreError::Invalid(validation) => validation.into(),
            error if error.is_transient() => {
                tracing::warn!(%error, "store temporarily unavailable");
                Self::unavailable("the database is temporarily unavailable; try again")
            }
            error => {
                tracing::error!(%error, "store error");
                Self::internal("internal error; the daemon's log has the details")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let unauthorized = self.status == StatusCode::UNAUTHORIZED;
        let unavailable = self.status == StatusCode::SERVICE_UNAVAILABLE;
        let retry_after = self.retry_after;
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code.to_owned(),
                message: self.message,
                field: self.field,
            },
        };
        let mut response = (self.status, Json(body)).into_response();
        if unauthorized {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"courier\""),
            );
        }
        if let Some(seconds) = retry_after.or(unavailable.then_some(RETRY_AFTER_SECONDS)) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}
