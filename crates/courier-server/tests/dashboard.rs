//! The dashboard's server side through the router (no socket), on
//! PostgreSQL and SQLite: the page and its assets, the cookie session and
//! what it may change, this daemon's throughput and the stats rows the
//! overview shows. The pages in a real browser: `courier-cli`'s
//! `tests/dashboard.rs`.
// Test helpers: a panic is the failure report.
#![allow(missing_docs, clippy::unwrap_used)]

#[macro_use]
mod common;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use common::{call, get, message, post, refusing_worker, standard_tokens};
use courier::{AdminStore, Courier, DeadLetterStore, OutboxStore};
use courier_server::config::ServerSection;
use courier_server::guard::RequestGuard;
use courier_server::{ApiState, Authenticator};
use courier_testkit::Backend;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

const LIMIT: usize = 2048;
/// The address the router's guard takes as its own.
const HOST: &str = "127.0.0.1:7070";
const OWN_ORIGIN: &str = "http://127.0.0.1:7070";

/// The daemon's router as it serves one listener: hosts and origins checked.
fn listener_app<S>(store: S) -> Router
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let auth = Authenticator::new(&standard_tokens()).unwrap();
    let guard = RequestGuard::for_listener(HOST.parse().unwrap(), &ServerSection::default());
    courier_server::router(ApiState::with_authenticator(store, auth, LIMIT).with_guard(guard))
}

/// A response's status, `Set-Cookie` and JSON body.
struct Answer {
    status: StatusCode,
    set_cookie: Option<String>,
    body: Value,
    headers: axum::http::HeaderMap,
    text: String,
}

async fn send(
    app: &Router,
    method: Method,
    uri: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header(header::HOST, HOST);
    if body.is_some() {
        request = request.header(header::CONTENT_TYPE, "application/json");
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let body = body.map_or_else(Body::empty, |body| Body::from(body.to_string()));
    let response = app
        .clone()
        .oneshot(request.body(body).unwrap())
        .await
        .unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let set_cookie = headers
        .get(header::SET_COOKIE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&bytes).into_owned();
    Answer {
        status,
        set_cookie,
        body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
        text,
    }
}

/// Signs `token` in and returns the `Cookie` header its session sends.
async fn sign_in(app: &Router, token: &str) -> String {
    let answer = send(
        app,
        Method::POST,
        "/v1/session",
        &[],
        Some(json!({"token": token})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    let set_cookie = answer.set_cookie.unwrap_or_default();
    set_cookie.split(';').next().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn the_page_and_its_assets_are_served_offline_under_a_strict_policy() {
    let fixture = courier_testkit::SqliteFixture::new().await.unwrap();
    let app = app_without_guard(fixture.courier());
    let page = send(&app, Method::GET, "/", &[], None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(page.headers[header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    // Its script and styles are the daemon's own; nothing comes from elsewhere.
    assert!(page.text.contains("/ui/app.js") && page.text.contains("/ui/app.css"));
    assert!(!page.text.contains("http://") && !page.text.contains("https://"));
    let policy = page.headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap();
    assert!(policy.contains("script-src 'self'") && policy.contains("frame-ancestors 'none'"));
    assert_eq!(page.headers[header::X_FRAME_OPTIONS], "DENY");
    for (path, kind) in [
        ("/ui/app.js", "text/javascript"),
        ("/ui/app.css", "text/css"),
    ] {
        let asset = send(&app, Method::GET, path, &[], None).await;
        assert_eq!(asset.status, StatusCode::OK, "{path}");
        assert!(asset.headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with(kind));
        assert!(asset.text.len() > 1000, "{path} is served whole");
        assert_eq!(asset.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    }
}

async fn a_session_is_the_token_kept_in_a_strict_http_only_cookie<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = listener_app(courier.store().clone());
    let worker = refusing_worker(&courier, "sub", "t").await?;
    for tenant in ["a", "b"] {
        let reply = post(
            &app_without_guard(&courier),
            "/v1/messages",
            Some("all"),
            &message(tenant, "t"),
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    }
    assert_eq!(worker.run_once().await?, 2);

    // Not signed in.
    let answer = send(&app, Method::GET, "/v1/session", &[], None).await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED);
    // A wrong token: 401 and no cookie; a bad one names the field.
    let answer = send(
        &app,
        Method::POST,
        "/v1/session",
        &[],
        Some(json!({"token": "nope"})),
    )
    .await;
    assert_eq!(
        (answer.status, answer.set_cookie),
        (StatusCode::UNAUTHORIZED, None)
    );
    for body in [
        json!({"token": ""}),
        json!({"token": "a\u{7}b"}),
        json!({"token": "x".repeat(5000)}),
    ] {
        let answer = send(&app, Method::POST, "/v1/session", &[], Some(body)).await;
        assert_eq!(
            answer.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{}",
            answer.text
        );
        assert_eq!(answer.body["error"]["field"], "token");
    }
    let answer = send(
        &app,
        Method::POST,
        "/v1/session",
        &[],
        Some(json!({"secret": "x"})),
    )
    .await;
    assert!(answer.status.is_client_error() && answer.set_cookie.is_none());

    // Signed in: the cookie is HttpOnly and SameSite=Strict, and stands for the token.
    let answer = send(
        &app,
        Method::POST,
        "/v1/session",
        &[],
        Some(json!({"token": "reader-a"})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    let set_cookie = answer.set_cookie.clone().unwrap_or_default();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    assert!(
        !set_cookie.contains("reader-a"),
        "the token is encoded: {set_cookie}"
    );
    assert_eq!(answer.body["name"], "reader-a");
    assert_eq!(answer.body["tenants"], json!(["a"]));
    assert_eq!(answer.body["roles"], json!(["read"]));
    let cookie = set_cookie.split(';').next().unwrap_or_default().to_owned();
    let session = [("cookie", cookie.as_str())];
    let me = send(&app, Method::GET, "/v1/session", &session, None).await;
    assert_eq!(
        (me.status, me.body["name"].clone()),
        (StatusCode::OK, json!("reader-a"))
    );
    // It sees what the token sees: tenant a's dead letter, not b's.
    let dead = send(&app, Method::GET, "/v1/dead-letters", &session, None).await;
    assert_eq!(dead.status, StatusCode::OK, "{}", dead.text);
    let tenants: Vec<&str> = dead.body["items"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item["tenant"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(tenants, vec!["a"]);
    let other = send(
        &app,
        Method::GET,
        "/v1/dead-letters?tenant=b",
        &session,
        None,
    )
    .await;
    assert_eq!(other.status, StatusCode::FORBIDDEN);
    // A read-only session cannot act, even from the daemon's own page.
    let retry = send(
        &app,
        Method::POST,
        "/v1/dead-letters/retry",
        &[("cookie", cookie.as_str()), ("origin", OWN_ORIGIN)],
        Some(json!({"filter": {"tenant": "a"}})),
    )
    .await;
    assert_eq!(retry.status, StatusCode::FORBIDDEN, "{}", retry.text);

    // A second session cookie (planted by another page of the site for a
    // narrower path) makes the request refused, not acted on as either.
    let admin = sign_in(&app, "admin-all").await;
    let planted = format!("{admin}; {cookie}");
    let answer = send(
        &app,
        Method::GET,
        "/v1/session",
        &[("cookie", planted.as_str())],
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::UNAUTHORIZED, "{}", answer.text);

    // Signing out ends the session, not only the browser's copy of it.
    let out = send(
        &app,
        Method::DELETE,
        "/v1/session",
        &[
            ("content-type", "application/json"),
            ("cookie", cookie.as_str()),
        ],
        None,
    )
    .await;
    assert_eq!(out.status, StatusCode::NO_CONTENT);
    assert!(out.set_cookie.unwrap_or_default().contains("Max-Age=0"));
    let after = send(&app, Method::GET, "/v1/session", &session, None).await;
    assert_eq!(after.status, StatusCode::UNAUTHORIZED, "{}", after.text);
    let other = send(
        &app,
        Method::GET,
        "/v1/session",
        &[("cookie", admin.as_str())],
        None,
    )
    .await;
    assert_eq!(other.status, StatusCode::OK, "another session lives on");
    // Over HTTPS (a proxy saying so) the cookie is Secure.
    let answer = send(
        &app,
        Method::POST,
        "/v1/session",
        &[("x-forwarded-proto", "https")],
        Some(json!({"token": "reader-a"})),
    )
    .await;
    assert!(answer.set_cookie.unwrap_or_default().ends_with("; Secure"));
    Ok(())
}

#[tokio::test]
async fn an_open_daemon_sets_no_cookie_and_wrong_sign_ins_count_toward_the_address_limit() {
    let fixture = courier_testkit::SqliteFixture::new().await.unwrap();
    let open = courier_server::router(ApiState::with_authenticator(
        fixture.courier().store().clone(),
        Authenticator::open(),
        LIMIT,
    ));
    let answer = send(
        &open,
        Method::POST,
        "/v1/session",
        &[],
        Some(json!({"token": "x"})),
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert_eq!(
        (answer.body["open"].clone(), answer.set_cookie),
        (json!(true), None)
    );

    let limited = Authenticator::new(&standard_tokens()).unwrap().with_limits(
        courier_server::limits::LimitSettings {
            auth_failures_per_minute: 3,
            ..courier_server::limits::LimitSettings::OFF
        },
    );
    let app = courier_server::router(ApiState::with_authenticator(
        fixture.courier().store().clone(),
        limited,
        LIMIT,
    ));
    let attempt = |token: &'static str| {
        let app = app.clone();
        async move {
            let request = Request::builder()
                .method(Method::POST)
                .uri("/v1/session")
                .header(header::CONTENT_TYPE, "application/json")
                .extension(courier_server::limits::ClientAddr([10, 0, 0, 7].into()))
                .body(Body::from(json!({"token": token}).to_string()))
                .unwrap();
            app.oneshot(request).await.unwrap().status()
        }
    };
    for _ in 0..3 {
        assert_eq!(attempt("guess").await, StatusCode::UNAUTHORIZED);
    }
    // Past the limit, even the right token is refused from that address.
    assert_eq!(attempt("admin-all").await, StatusCode::TOO_MANY_REQUESTS);
}

/// The same router without a host check, for setting up through the API.
fn app_without_guard<S>(courier: &Courier<S>) -> Router
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    common::app(courier.store().clone(), &standard_tokens(), LIMIT)
}

async fn a_session_changes_state_only_from_the_daemon_s_own_page<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = listener_app(courier.store().clone());
    let worker = refusing_worker(&courier, "sub", "t").await?;
    let reply = post(
        &app_without_guard(&courier),
        "/v1/messages",
        Some("all"),
        &message("a", "t"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    assert_eq!(worker.run_once().await?, 1);
    let cookie = sign_in(&app, "admin-all").await;
    let body = json!({"filter": {"tenant": "a"}, "dry_run": true});
    let retry = |headers: Vec<(&'static str, String)>| {
        let app = app.clone();
        let body = body.clone();
        async move {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            send(
                &app,
                Method::POST,
                "/v1/dead-letters/retry",
                &headers,
                Some(body),
            )
            .await
        }
    };
    // No Origin: a session's change must come from the page.
    let answer = retry(vec![("cookie", cookie.clone())]).await;
    assert_eq!(answer.status, StatusCode::FORBIDDEN, "{}", answer.text);
    assert_eq!(answer.body["error"]["field"], "origin");
    // Another site's page, or a name rebound to the daemon: refused.
    for origin in ["http://evil.example", "http://127.0.0.1:7071", "null"] {
        let answer = retry(vec![
            ("cookie", cookie.clone()),
            ("origin", origin.to_owned()),
        ])
        .await;
        assert_eq!(
            answer.status,
            StatusCode::FORBIDDEN,
            "{origin}: {}",
            answer.text
        );
    }
    // The daemon's own page: allowed.
    let answer = retry(vec![
        ("cookie", cookie.clone()),
        ("origin", OWN_ORIGIN.to_owned()),
    ])
    .await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    assert_eq!(answer.body["affected"], 1, "{}", answer.text);
    // A program with a bearer token sends no Origin and needs none.
    let answer = retry(vec![("authorization", "Bearer admin-all".to_owned())]).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text);
    // Reads with the session need no Origin.
    let answer = send(
        &app,
        Method::GET,
        "/v1/stats",
        &[("cookie", cookie.as_str())],
        None,
    )
    .await;
    assert_eq!(answer.status, StatusCode::OK);
    Ok(())
}

async fn throughput_and_completions_show_only_the_token_s_tenants<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app_without_guard(&courier);
    // Names of this test's own: other tests of this binary may record too.
    let tag = uuid::Uuid::now_v7().simple().to_string();
    let tenant = format!("x{tag}");
    let subscription = format!("zz-{tag}");
    let throughput = courier_server::throughput::global();
    for _ in 0..3 {
        throughput.record(&tenant, &subscription, "t", true);
    }
    throughput.record(&tenant, &subscription, "t", false);
    throughput.record("a", &subscription, "t", true);
    throughput.record("b", &subscription, "t", true);
    let series = get(
        &app,
        &format!("/v1/throughput?tenant={tenant}"),
        Some("all"),
    )
    .await;
    assert_eq!(series.status, StatusCode::OK, "{}", series.text);
    assert_eq!(series.body["delivered"].as_array().map(Vec::len), Some(900));
    assert_eq!(series.body["interval_seconds"], 1);
    assert_eq!(
        (
            delivered(&series.body, "delivered"),
            delivered(&series.body, "failed")
        ),
        (3, 1)
    );
    let mine = get(&app, "/v1/throughput", Some("reader-a")).await;
    assert_eq!(mine.status, StatusCode::OK, "{}", mine.text);
    assert!(delivered(&mine.body, "delivered") >= 1);
    let forbidden = get(
        &app,
        &format!("/v1/throughput?tenant={tenant}"),
        Some("reader-a"),
    )
    .await;
    assert_eq!(forbidden.status, StatusCode::FORBIDDEN);
    assert_eq!(
        get(&app, "/v1/throughput?tenant=-", Some("all"))
            .await
            .status,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    assert_eq!(
        get(&app, "/v1/throughput?window=1", Some("all"))
            .await
            .status
            .as_u16()
            / 100,
        4
    );
    assert_eq!(
        get(&app, "/v1/throughput", None).await.status,
        StatusCode::UNAUTHORIZED
    );

    // The overview's rows: the pair completed only by this daemon has a row
    // with nothing open, counted for the token's tenants only.
    let row = |body: &Value| -> Option<Value> {
        body["items"]
            .as_array()?
            .iter()
            .find(|row| row["subscription"] == subscription.as_str())
            .cloned()
    };
    let all = get(&app, "/v1/stats?limit=500", Some("all")).await;
    let all_row = row(&all.body).ok_or_else(|| anyhow::anyhow!("no row: {}", all.text))?;
    assert_eq!(all_row["completed_last_hour"], 5);
    assert_eq!(
        (all_row["available"].clone(), all_row["dead"].clone()),
        (json!(0), json!(0))
    );
    let scoped = get(&app, "/v1/stats?limit=500", Some("reader-a")).await;
    assert_eq!(
        row(&scoped.body).map(|r| r["completed_last_hour"].clone()),
        Some(json!(1))
    );
    Ok(())
}

/// The sum of a throughput answer's `series` ("delivered" or "failed").
fn delivered(body: &Value, series: &str) -> u64 {
    body[series]
        .as_array()
        .map_or(0, |series| series.iter().filter_map(Value::as_u64).sum())
}

async fn stats_pages_merge_open_work_with_recent_completions_each_pair_once<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app_without_guard(&courier);
    let tag = uuid::Uuid::now_v7().simple().to_string();
    // Open work (dead letters) for subscriptions m1 and m3; completions only for m0, m2, m4.
    let names: Vec<String> = (0..5).map(|i| format!("{tag}-m{i}")).collect();
    for name in [&names[1], &names[3]] {
        let worker = refusing_worker(&courier, name, "t").await?;
        let reply = post(&app, "/v1/messages", Some("all"), &message("a", "t")).await;
        assert_eq!(reply.status, StatusCode::CREATED);
        worker.run_once().await?;
    }
    for name in [&names[0], &names[2], &names[4]] {
        courier_server::throughput::global().record("a", name, "t", true);
    }
    // m1's worker ran before m3 existed; the second message is owed to m1 too
    // but waits (m1 has one dead letter and one waiting delivery).
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..20 {
        let uri = match &cursor {
            Some(cursor) => format!("/v1/stats?limit=1&cursor={cursor}"),
            None => "/v1/stats?limit=1".to_owned(),
        };
        let page = get(&app, &uri, Some("all")).await;
        assert_eq!(page.status, StatusCode::OK, "{}", page.text);
        for row in page.body["items"].as_array().cloned().unwrap_or_default() {
            if let Some(name) = row["subscription"].as_str().filter(|n| n.starts_with(&tag)) {
                seen.push((
                    name.to_owned(),
                    row["dead"].as_i64(),
                    row["completed_last_hour"].as_u64(),
                ));
            }
        }
        cursor = page.body["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(
        seen,
        vec![
            (names[0].clone(), Some(0), Some(1)),
            (names[1].clone(), Some(1), Some(0)),
            (names[2].clone(), Some(0), Some(1)),
            (names[3].clone(), Some(1), Some(0)),
            (names[4].clone(), Some(0), Some(1)),
        ]
    );
    let totals = get(&app, "/v1/stats", Some("all")).await;
    assert!(
        totals.body["retrying"].is_i64() && totals.body["completed_last_hour"].as_u64() >= Some(3)
    );
    Ok(())
}

#[tokio::test]
async fn signing_out_needs_json_like_every_change() {
    let fixture = courier_testkit::SqliteFixture::new().await.unwrap();
    let app = app_without_guard(fixture.courier());
    let form = call(
        &app,
        Method::DELETE,
        "/v1/session",
        None,
        None,
        &[("content-type", "text/plain")],
    )
    .await;
    assert_eq!(form.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
    let form = call(
        &app,
        Method::POST,
        "/v1/session",
        None,
        Some(Body::from("token=admin-all")),
        &[("content-type", "application/x-www-form-urlencoded")],
    )
    .await;
    assert_eq!(form.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
}

api_tests!(
    a_session_is_the_token_kept_in_a_strict_http_only_cookie,
    a_session_changes_state_only_from_the_daemon_s_own_page,
    throughput_and_completions_show_only_the_token_s_tenants,
    stats_pages_merge_open_work_with_recent_completions_each_pair_once,
);
