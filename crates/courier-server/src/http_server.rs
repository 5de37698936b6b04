//! The HTTP server under the API: hyper's HTTP/1 connections with the limits
//! a hostile client meets.
//!
//! - **Header read timeout** (`server.header_read_timeout_ms`): a connection
//!   that has not sent a whole request head within it is closed, so clients
//!   that send half a header line and stall (slowloris) cannot hold
//!   connections open. hyper starts the clock whenever it waits for a head,
//!   so an idle kept-alive connection is closed after it too.
//! - **Request timeout** (`server.request_timeout_ms`, [`request_timeout`]):
//!   a request whose answer is not ready within it — a body that trickles in,
//!   a handler stuck on a slow database — is answered 408 with the API's JSON
//!   error and its work is dropped (nothing half-stored: every write is one
//!   transaction). A blocking stream read waits at most a second less (a
//!   quarter less below 4 s; [`crate::api::ApiState::max_block`]), so it is
//!   answered rather than cut off.
//! - **Head size**: hyper parses up to
//!   [`HARD_MAX_REQUEST_HEADERS`](crate::guard::HARD_MAX_REQUEST_HEADERS)
//!   header lines (and its ~400 KiB read buffer), above the guard's limits,
//!   so that a head over the guard's limits is answered 431 in the API's JSON
//!   shape by [`crate::guard`]; only one past hyper's own limits gets hyper's
//!   bare 431.
//! - **Connection limit** (`server.max_connections`): at the limit the server
//!   stops accepting; further clients wait in the kernel's backlog until a
//!   connection closes.
//!
//! Shutdown: when `stop` is cancelled the listener is dropped (no new
//! connections), idle connections close, and open requests finish; [`serve`]
//! returns when the last connection has closed. A connection error (a client
//! going away, a malformed request) ends only that connection.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;

/// How long a connection may take to send a request head, by default.
pub const DEFAULT_HEADER_READ_TIMEOUT_MS: u64 = 10_000;
/// How long one request may take, body and answer, by default (above the
/// longest blocking stream read, 30 s).
pub const DEFAULT_REQUEST_TIMEOUT_MS: u64 = 60_000;
/// How many connections are served at once, by default.
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// How long the accept loop pauses after an accept error (out of file
/// descriptors, say) before it tries again.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// The limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// How long a connection may take to send a request head.
    pub header_read_timeout: Duration,
    /// How many connections are served at once.
    pub max_connections: usize,
}

/// Serves `app` on `listener` within `limits` until `stop` is cancelled and
/// every open connection has closed.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: HttpLimits,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // Above the guard's limit, so that the guard answers 431 as JSON.
        .max_headers(crate::guard::HARD_MAX_REQUEST_HEADERS);
    loop {
        let permit = tokio::select! {
            () = stop.cancelled() => break,
            permit = Arc::clone(&permits).acquire_owned() => match permit {
                Ok(permit) => permit,
                // The semaphore is never closed.
                Err(_) => break,
            },
        };
        let (stream, peer) = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    if !is_connection_error(&error) {
                        tracing::warn!(%error, "accepting a connection failed; retrying shortly");
                        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    }
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        // Each request knows its client's address (the limits of failed
        // authentication are per address).
        let client = crate::limits::ClientAddr(peer.ip());
        let app = tower::ServiceExt::map_request(
            app.clone(),
            move |mut request: axum::http::Request<hyper::body::Incoming>| {
                request.extensions_mut().insert(client);
                request
            },
        );
        let connection =
            builder.serve_connection(TokioIo::new(stream), TowerToHyperService::new(app));
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // A client that goes away or sends garbage ends its connection only.
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// Errors of one accepted connection, not of the listener.
fn is_connection_error(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

/// Middleware: a request whose answer is not ready within `timeout` is
/// answered 408 `request_timeout` (the API's JSON error) and its work dropped.
pub async fn request_timeout(
    State(timeout): State<Duration>,
    request: Request,
    next: Next,
) -> Response {
    match tokio::time::timeout(timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::request_timeout(format!(
            "the request did not complete within {} ms (server.request_timeout_ms)",
            timeout.as_millis()
        ))
        .into_response(),
    }
}
