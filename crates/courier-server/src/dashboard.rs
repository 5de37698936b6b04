//! The web dashboard: `GET /` serves one page, and `/ui/app.js` and
//! `/ui/app.css` its script and styles, all compiled into the binary (no
//! asset is fetched from anywhere else, no front-end build is needed to run
//! it). The page works through the JSON API under `/v1` like any client:
//! it signs in with `POST /v1/session`, and the browser then carries the
//! session cookie (see [`crate::auth`]); what a token may not see or do, the
//! API refuses to the page as to anyone.
//!
//! Every asset is sent with a Content-Security-Policy that allows scripts,
//! styles and requests from the daemon only, no inline script or style and
//! no framing, so an attacker's text shown on a page (a payload, an error
//! message) cannot run as script, and no other site can frame the page to
//! trick a click.

use axum::http::{header, HeaderName, HeaderValue};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

/// The page.
const INDEX_HTML: &str = include_str!("../assets/dashboard/index.html");
/// Its script.
const APP_JS: &str = include_str!("../assets/dashboard/app.js");
/// Its styles.
const APP_CSS: &str = include_str!("../assets/dashboard/app.css");

/// What the page may load and do: only the daemon's own script, styles and
/// API; no inline code, no plugins, no framing, forms post only here.
/// Trusted Types are required, so even a mistaken `innerHTML` in the page's
/// script would throw instead of parsing markup.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; \
     frame-ancestors 'none'; base-uri 'none'; require-trusted-types-for 'script'";

/// The dashboard's routes: `/`, `/ui/app.js`, `/ui/app.css`.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|| async { asset("text/html; charset=utf-8", INDEX_HTML) }),
        )
        .route(
            "/ui/app.js",
            get(|| async { asset("text/javascript; charset=utf-8", APP_JS) }),
        )
        .route(
            "/ui/app.css",
            get(|| async { asset("text/css; charset=utf-8", APP_CSS) }),
        )
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    let headers: [(HeaderName, HeaderValue); 6] = [
        (header::CONTENT_TYPE, HeaderValue::from_static(content_type)),
        (
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONTENT_SECURITY_POLICY),
        ),
        (header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY")),
        (
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        ),
        // Not `no-referrer`: under it browsers send `Origin: null` with the
        // page's own POSTs, which the API must refuse (see crate::guard).
        (
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        ),
        // The assets change with the binary: always ask again (cheap, local).
        (header::CACHE_CONTROL, HeaderValue::from_static("no-cache")),
    ];
    (headers, body)
}
