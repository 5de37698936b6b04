//! Browsers must not drive the daemon: checks on every request before any
//! handler (and before the token is looked at).
//!
//! A web page the operator visits can make the browser send requests to the
//! daemon — a form post or `fetch` to `http://127.0.0.1:7070`, or, after DNS
//! rebinding, to a name that now resolves to it. An open daemon (no tokens,
//! loopback) would obey them. So, in this order:
//!
//! 1. **Host** (421 `misdirected_request`): the `Host` must be the listen
//!    address (`127.0.0.1:7070`), with a loopback listener also
//!    `localhost:PORT`, `127.0.0.1:PORT` or `[::1]:PORT`, or one of
//!    `server.allowed_hosts` (a name alone matches any port; `name:port` only
//!    that port). A rebound name is none of these. `GET /healthz` and
//!    `/readyz` are exempt: probes address pods by IP, and these answer only
//!    a status to requests without an admin token.
//! 2. **Origin** (403 `forbidden`, field `origin`): a request carrying an
//!    `Origin` header (browsers add it to cross-site and to all non-GET
//!    requests) is refused unless it is one of `server.allowed_origins` or
//!    the daemon's own: `http://` or `https://` and the request's `Host`, on
//!    a listener that checks hosts (so a rebound name, refused in step 1,
//!    never makes its own origin count as the daemon's). That is how the
//!    dashboard's pages, served by the daemon, call its API. Programs (curl,
//!    the CLI, SDKs) send none.
//! 3. **Content-Type** (415 `unsupported_media_type`): every POST, PUT,
//!    PATCH and DELETE, bodiless ones included, must declare
//!    `application/json` (or `…+json`). Browsers can send cross-site only
//!    `text/plain`, form and multipart bodies without asking first, and the
//!    daemon answers no CORS preflight, so a page cannot send JSON.
//!
//! Before these, the request head is measured (431 `headers_too_large`,
//! field `headers`): more than [`MAX_REQUEST_HEADERS`] header lines or more
//! than [`MAX_REQUEST_HEAD_BYTES`] of request line and headers are refused
//! with the API's JSON error. hyper's own limits sit above these
//! ([`crate::http_server`]), so it is the daemon that answers; only a head
//! past hyper's (over [`HARD_MAX_REQUEST_HEADERS`] headers, or over hyper's
//! ~400 KiB read buffer) gets hyper's bare 431, since hyper answers it
//! before any request exists.
//!
//! The router's default guard ([`RequestGuard::any_host`]) skips the Host
//! check, since a router alone does not know its address; the daemon sets
//! one per listener ([`RequestGuard::for_listener`]) once it is bound.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{header, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::config::ServerSection;
use crate::error::ApiError;

/// The most header lines a request may carry.
pub const MAX_REQUEST_HEADERS: usize = 100;
/// The most bytes of request line and headers a request may carry.
pub const MAX_REQUEST_HEAD_BYTES: usize = 64 * 1024;
/// How many header lines hyper parses before it refuses a head itself
/// (with a bare 431): well above [`MAX_REQUEST_HEADERS`], so that the guard
/// answers in the API's shape.
pub const HARD_MAX_REQUEST_HEADERS: usize = 1000;

/// Which hosts and origins a listener accepts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestGuard {
    /// `None`: any host (the router does not know its address).
    hosts: Option<AllowedHosts>,
    /// Origins allowed to send requests (lower case, no trailing `/`).
    origins: BTreeSet<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct AllowedHosts {
    /// `host:port` pairs, lower case.
    authorities: BTreeSet<String>,
    /// Names that match on any port, lower case.
    names: BTreeSet<String>,
}

impl RequestGuard {
    /// Any `Host`; no `Origin` allowed; JSON required on state changes.
    pub fn any_host() -> Self {
        Self::default()
    }

    /// The guard of a listener bound to `address`, with the configured
    /// extra hosts and allowed origins.
    pub fn for_listener(address: SocketAddr, server: &ServerSection) -> Self {
        let mut hosts = AllowedHosts::default();
        hosts.authorities.insert(address.to_string());
        if address.ip().is_loopback() {
            let port = address.port();
            for name in ["localhost", "127.0.0.1", "[::1]"] {
                hosts.authorities.insert(format!("{name}:{port}"));
            }
        }
        for host in &server.allowed_hosts {
            let host = host.trim().to_ascii_lowercase();
            if has_port(&host) {
                hosts.authorities.insert(host);
            } else {
                hosts.names.insert(host);
            }
        }
        Self {
            hosts: Some(hosts),
            origins: Self::origins_of(server),
        }
    }

    /// Any `Host`, and the configured allowed origins.
    pub fn with_origins(server: &ServerSection) -> Self {
        Self {
            hosts: None,
            origins: Self::origins_of(server),
        }
    }

    fn origins_of(server: &ServerSection) -> BTreeSet<String> {
        server
            .allowed_origins
            .iter()
            .map(|origin| normalize_origin(origin))
            .collect()
    }

    fn allows_host(&self, host: &str) -> bool {
        let Some(hosts) = &self.hosts else {
            return true;
        };
        let host = host.trim().to_ascii_lowercase();
        hosts.authorities.contains(&host) || hosts.names.contains(without_port(&host))
    }

    fn allows_origin(&self, origin: &str) -> bool {
        self.origins.contains(&normalize_origin(origin))
    }

    /// Whether `origin` is the daemon's own page at `host`: only on a
    /// listener that checks hosts, and only for a host it answers to.
    fn is_own_origin(&self, origin: &str, host: Option<&str>) -> bool {
        let Some(host) = host else {
            return false;
        };
        if self.hosts.is_none() || !self.allows_host(host) {
            return false;
        }
        let origin = normalize_origin(origin);
        let Some((scheme, authority)) = origin.split_once("://") else {
            return false;
        };
        let default_port = match scheme {
            "http" => "80",
            "https" => "443",
            _ => return false,
        };
        // `Origin` leaves out a default port that a proxy's `Host` may name.
        let with_port = |authority: &str| {
            if has_port(authority) {
                authority.to_owned()
            } else {
                format!("{authority}:{default_port}")
            }
        };
        with_port(authority) == with_port(&host.trim().to_ascii_lowercase())
    }

    /// The refusal of `request`, if it is refused.
    fn check(&self, request: &Request) -> Result<(), ApiError> {
        check_head(request)?;
        let method = request.method();
        let exempt = matches!(*method, Method::GET | Method::HEAD)
            && matches!(request.uri().path(), "/healthz" | "/readyz");
        if !exempt {
            let host = request
                .headers()
                .get(header::HOST)
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned)
                .or_else(|| request.uri().authority().map(|a| a.as_str().to_owned()));
            match &host {
                Some(host) if self.allows_host(host) => {}
                Some(host) => {
                    return Err(ApiError::misdirected(format!(
                        "this daemon does not answer to host {host:?}: use its listen address \
                         or add the name to server.allowed_hosts"
                    )))
                }
                None if self.hosts.is_none() => {}
                None => return Err(ApiError::misdirected("the request has no Host header")),
            }
            if let Some(origin) = request.headers().get(header::ORIGIN) {
                let origin = String::from_utf8_lossy(origin.as_bytes());
                if !self.allows_origin(&origin) && !self.is_own_origin(&origin, host.as_deref()) {
                    return Err(ApiError::forbidden(
                        format!(
                            "requests from origin {origin:?} are refused (a browser page may not \
                             drive this daemon); add it to server.allowed_origins to allow it"
                        ),
                        Some("origin".into()),
                    ));
                }
            }
        }
        if matches!(
            *method,
            Method::POST | Method::PUT | Method::PATCH | Method::DELETE
        ) {
            let content_type = request
                .headers()
                .get(header::CONTENT_TYPE)
                .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
            match content_type {
                Some(value) if is_json(&value) => {}
                Some(value) => {
                    return Err(ApiError::unsupported_media_type(format!(
                        "{method} requests must be sent as application/json, not {value:?}"
                    )))
                }
                None => {
                    return Err(ApiError::unsupported_media_type(format!(
                        "{method} requests must carry `Content-Type: application/json`, \
                         even without a body"
                    )))
                }
            }
        }
        Ok(())
    }
}

/// Refuses a head over [`MAX_REQUEST_HEADERS`] or [`MAX_REQUEST_HEAD_BYTES`].
fn check_head(request: &Request) -> Result<(), ApiError> {
    let headers = request.headers();
    if headers.len() > MAX_REQUEST_HEADERS {
        return Err(ApiError::headers_too_large(format!(
            "the request has {} header lines; the limit is {MAX_REQUEST_HEADERS}",
            headers.len()
        )));
    }
    // As on the wire: `METHOD target HTTP/1.1\r\n` and `name: value\r\n`.
    let line = request.method().as_str().len() + request.uri().to_string().len() + 11;
    let bytes = headers.iter().fold(line, |sum, (name, value)| {
        sum + name.as_str().len() + value.len() + 4
    });
    if bytes > MAX_REQUEST_HEAD_BYTES {
        return Err(ApiError::headers_too_large(format!(
            "the request line and headers are {bytes} bytes; the limit is \
             {MAX_REQUEST_HEAD_BYTES}"
        )));
    }
    Ok(())
}

/// Whether a `Content-Type` value declares JSON (`application/json`, `…+json`).
pub(crate) fn is_json(content_type: &str) -> bool {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

/// Whether `host` (`name`, `name:port`, `[v6]`, `[v6]:port`) names a port.
fn has_port(host: &str) -> bool {
    without_port(host).len() != host.len()
}

/// `host` without its `:port`.
fn without_port(host: &str) -> &str {
    let colon = match host.rfind(':') {
        Some(colon) => colon,
        None => return host,
    };
    let name = &host[..colon];
    let port = &host[colon + 1..];
    // `[::1]` has colons inside brackets; a bare IPv6 address is not a host.
    if !port.is_empty()
        && port.bytes().all(|b| b.is_ascii_digit())
        && (!name.contains(':') || name.ends_with(']'))
    {
        name
    } else {
        host
    }
}

fn normalize_origin(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// Middleware applying `guard` to every request.
pub async fn guard_requests(
    State(guard): State<Arc<RequestGuard>>,
    request: Request,
    next: Next,
) -> Response {
    match guard.check(&request) {
        Ok(()) => next.run(request).await,
        Err(refusal) => refusal.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_match_with_and_without_ports() {
        let server = ServerSection {
            allowed_hosts: vec!["Courier.Internal".into(), "10.0.0.5:8080".into()],
            ..ServerSection::default()
        };
        let guard = RequestGuard::for_listener("127.0.0.1:7070".parse().unwrap(), &server);
        for host in [
            "127.0.0.1:7070",
            "localhost:7070",
            "LOCALHOST:7070",
            "[::1]:7070",
            "courier.internal",
            "courier.internal:443",
            "10.0.0.5:8080",
        ] {
            assert!(guard.allows_host(host), "{host}");
        }
        for host in [
            "127.0.0.1:7071",
            "localhost",
            "evil.example:7070",
            "10.0.0.5:8081",
            "10.0.0.5",
        ] {
            assert!(!guard.allows_host(host), "{host}");
        }
        let public = RequestGuard::for_listener("0.0.0.0:7070".parse().unwrap(), &server);
        assert!(!public.allows_host("localhost:7070"));
        assert!(public.allows_host("0.0.0.0:7070"));
        assert_eq!(without_port("[::1]:80"), "[::1]");
        assert_eq!(without_port("[::1]"), "[::1]");
    }

    #[test]
    fn the_daemon_s_own_origin_is_allowed_only_where_hosts_are_checked() {
        let server = ServerSection::default();
        let guard = RequestGuard::for_listener("127.0.0.1:7070".parse().unwrap(), &server);
        assert!(guard.is_own_origin("http://127.0.0.1:7070", Some("127.0.0.1:7070")));
        assert!(guard.is_own_origin("http://LOCALHOST:7070/", Some("localhost:7070")));
        // Another page, a rebound name, another port: not the daemon's.
        assert!(!guard.is_own_origin("http://evil.example", Some("127.0.0.1:7070")));
        assert!(!guard.is_own_origin("http://evil.example:7070", Some("evil.example:7070")));
        assert!(!guard.is_own_origin("http://127.0.0.1:7071", Some("127.0.0.1:7070")));
        assert!(!guard.is_own_origin("null", Some("127.0.0.1:7070")));
        assert!(!guard.is_own_origin("http://127.0.0.1:7070", None));
        assert!(!guard.is_own_origin("ftp://127.0.0.1:7070", Some("127.0.0.1:7070")));
        // Behind a proxy that passes `Host: name:443` for `https://name`.
        let server = ServerSection {
            allowed_hosts: vec!["courier.example".into()],
            ..ServerSection::default()
        };
        let proxied = RequestGuard::for_listener("127.0.0.1:7070".parse().unwrap(), &server);
        assert!(proxied.is_own_origin("https://courier.example", Some("courier.example:443")));
        assert!(proxied.is_own_origin("https://courier.example", Some("courier.example")));
        assert!(!proxied.is_own_origin("http://courier.example", Some("courier.example:443")));
        // A router that does not know its address cannot tell.
        let any = RequestGuard::any_host();
        assert!(!any.is_own_origin("http://127.0.0.1:7070", Some("127.0.0.1:7070")));
    }

    #[test]
    fn json_content_types() {
        assert!(is_json("application/json"));
        assert!(is_json("Application/JSON; charset=utf-8"));
        assert!(is_json("application/merge-patch+json"));
        assert!(!is_json("text/plain"));
        assert!(!is_json("application/x-www-form-urlencoded"));
        assert!(!is_json(""));
    }
}
