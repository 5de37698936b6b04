//! The dashboard's session, under `/v1/session`: sign in with a token once
//! and get a session whose id an `HttpOnly`, `SameSite=Strict` cookie
//! carries; ask who is signed in; sign out. A session (see
//! [`crate::sessions`]) acts with its token's tenants and roles, and ends on
//! sign-out, after 8 hours unused or 24 in all, when the daemon restarts, or
//! when the daemon runs without its token.
//!
//! Signing in goes through the same checks as any request: a wrong token is
//! 401 and counts towards the address's failed authentications
//! (`server.auth_failures_per_minute`), and a signed-in tenant is held to its
//! request rate. On an open daemon (no tokens) there is nothing to sign in
//! to: every answer says so and no cookie is set.

use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::extract::ApiJson;
use super::{body_limit, ApiState, SMALL_BODY_BYTES};
use crate::auth::{
    cleared_session_cookie, session_cookie, Principal, TenantScope, MAX_TOKEN_BYTES,
};
use crate::error::{ApiError, ErrorBody};
use crate::limits::ClientAddr;

/// The routes under `/v1/session`.
pub(super) fn routes() -> OpenApiRouter<ApiState> {
    OpenApiRouter::new()
        .routes(routes!(who_am_i, sign_in, sign_out))
        .layer(body_limit(SMALL_BODY_BYTES))
}

/// A sign-in.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignIn {
    /// A bearer token from the daemon's `[[tokens]]`.
    pub token: String,
}

/// Who a session (or a bearer token) is.
#[derive(Debug, Serialize, ToSchema)]
pub struct SessionView {
    /// The token's name; `null` on an open daemon.
    pub name: Option<String>,
    /// Whether the daemon has no tokens (every request may do everything).
    pub open: bool,
    /// The tenants it sees: `["*"]` for every tenant.
    pub tenants: Vec<String>,
    /// Its roles: `admin`, `read`, `publish`, `consume`.
    pub roles: Vec<String>,
}

impl SessionView {
    fn of(principal: &Principal, open: bool) -> Self {
        Self {
            name: principal.name.clone(),
            open,
            tenants: match &principal.tenants {
                TenantScope::All => vec!["*".to_owned()],
                TenantScope::Only(tenants) => tenants.iter().cloned().collect(),
            },
            roles: principal.roles.iter().map(ToString::to_string).collect(),
        }
    }
}

/// Who is signed in: the session cookie's token (or a bearer token).
#[utoipa::path(
    get,
    path = "/v1/session",
    tag = "operations",
    responses(
        (status = 200, body = SessionView),
        (status = 401, description = "Not signed in, or the token is no longer configured", body = ErrorBody),
    ),
    security(("bearer" = []))
)]
async fn who_am_i(State(state): State<ApiState>, principal: Principal) -> Json<SessionView> {
    Json(SessionView::of(&principal, state.is_open()))
}

/// Sign the dashboard in: checks the token and keeps it in an `HttpOnly`,
/// `SameSite=Strict` cookie that later requests from the daemon's pages
/// carry instead of a bearer header.
#[utoipa::path(
    post,
    path = "/v1/session",
    tag = "operations",
    request_body = SignIn,
    responses(
        (status = 200, body = SessionView, description = "Signed in; `Set-Cookie` holds the session"),
        (status = 400, description = "The body is not JSON", body = ErrorBody),
        (status = 401, description = "Unknown token", body = ErrorBody),
        (status = 413, description = "The body is too large", body = ErrorBody),
        (status = 422, description = "No token, an empty one or one over 4 KiB (`token`)", body = ErrorBody),
    )
)]
async fn sign_in(
    State(state): State<ApiState>,
    client: Option<Extension<ClientAddr>>,
    request_headers: HeaderMap,
    ApiJson(body): ApiJson<SignIn>,
) -> Result<Response, ApiError> {
    let token = body.token.trim();
    if token.is_empty() {
        return Err(ApiError::invalid("token", "must not be empty"));
    }
    if token.len() > MAX_TOKEN_BYTES {
        return Err(ApiError::invalid(
            "token",
            format!("must be at most {MAX_TOKEN_BYTES} bytes"),
        ));
    }
    if token.chars().any(char::is_control) {
        return Err(ApiError::invalid(
            "token",
            "must not hold control characters",
        ));
    }
    let mut headers = HeaderMap::new();
    let bearer = HeaderValue::from_str(&format!("Bearer {token}"))
        .map_err(|_| ApiError::invalid("token", "must be printable text"))?;
    headers.insert(header::AUTHORIZATION, bearer);
    let principal = state
        .auth
        .admit(&headers, client.map(|Extension(client)| client))?;
    let view = Json(SessionView::of(&principal, state.is_open()));
    if state.is_open() {
        return Ok(view.into_response());
    }
    // Secure when the page was reached over HTTPS (directly or through a
    // proxy that says so), so the browser never sends the id in the clear.
    let secure = header_is(&request_headers, header::ORIGIN.as_str(), |origin| {
        origin.starts_with("https://")
    }) || header_is(&request_headers, "x-forwarded-proto", |proto| {
        proto.eq_ignore_ascii_case("https")
    });
    let id = state.auth.start_session(token);
    let cookie = HeaderValue::from_str(&session_cookie(&id, secure))
        .map_err(|_| ApiError::invalid("token", "must be printable text"))?;
    Ok(([(header::SET_COOKIE, cookie)], view).into_response())
}

/// Whether `headers` has `name` with a value `check` accepts.
fn header_is(headers: &HeaderMap, name: &str, check: impl Fn(&str) -> bool) -> bool {
    headers
        .get(name)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| check(value.trim()))
}

/// Sign the dashboard out: the session ends and its cookie is cleared. Needs
/// no token, so a session whose token was removed can still end.
#[utoipa::path(
    delete,
    path = "/v1/session",
    tag = "operations",
    responses((status = 204, description = "Signed out; `Set-Cookie` clears the session"))
)]
async fn sign_out(State(state): State<ApiState>, headers: HeaderMap) -> Response {
    state.auth.end_session(&headers);
    let cleared = HeaderValue::from_str(&cleared_session_cookie())
        .unwrap_or_else(|_| HeaderValue::from_static("courier_session=; Max-Age=0"));
    (StatusCode::NO_CONTENT, [(header::SET_COOKIE, cleared)]).into_response()
}
