//! The HTTP API through `tower::ServiceExt::oneshot` (no socket), on
//! PostgreSQL (a schema per test) and SQLite (a file per test).
#![allow(missing_docs)]

#[macro_use]
mod common;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use common::{app, call, get, message, post, post_raw, refusing_worker, standard_tokens};
use courier::{handler_fn, AdminStore, Courier, DeadLetterStore, HandlerError, OutboxStore};
use serde_json::{json, Value};

const LIMIT: usize = 2048;

async fn message_count(app: &axum::Router) -> usize {
    let reply = get(app, "/v1/messages?limit=500", Some("all")).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.text);
    reply.body["items"].as_array().map_or(0, Vec::len)
}

async fn publish_stores_once_per_idempotency_key<S>(courier: Courier<S>) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    let first = post(
        &app,
        "/v1/messages",
        Some("all"),
        &message("a", "invoice.paid"),
    )
    .await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text);
    assert!(first.body["id"].is_string());
    assert!(first.body.get("duplicate").is_none());

    // The key in the body, then the same key in the header.
    let mut keyed = message("a", "invoice.paid");
    keyed["idempotency_key"] = json!("order-7");
    let original = post(&app, "/v1/messages", Some("all"), &keyed).await;
    assert_eq!(original.status, StatusCode::CREATED, "{}", original.text);
    let again = post(&app, "/v1/messages", Some("all"), &keyed).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text);
    assert_eq!(again.body["duplicate"], json!(true));
    assert_eq!(again.body["id"], original.body["id"]);
    let by_header = post_raw(
        &app,
        "/v1/messages",
        Some("all"),
        message("a", "invoice.paid").to_string(),
        &[("Idempotency-Key", "order-7")],
    )
    .await;
    assert_eq!(by_header.status, StatusCode::OK, "{}", by_header.text);
    assert_eq!(by_header.body["id"], original.body["id"]);
    // The key reused for another payload or topic: refused, nothing stored.
    for (field, value) in [
        ("payload", json!({"n": 2})),
        ("topic", json!("invoice.void")),
        ("schema_version", json!(2)),
    ] {
        let mut reused = keyed.clone();
        reused[field] = value;
        let refused = post(&app, "/v1/messages", Some("all"), &reused).await;
        assert_eq!(
            refused.status,
            StatusCode::CONFLICT,
            "{field}: {}",
            refused.text
        );
        assert_eq!(
            refused.body["error"]["code"],
            json!("idempotency_key_reused")
        );
        assert_eq!(refused.field(), Some("idempotency_key"), "{field}");
    }
    // The same payload written otherwise (number form, key order) is the same.
    let respelled = post_raw(
        &app,
        "/v1/messages",
        Some("all"),
        r#"{"payload": {"n": 1.0}, "topic": "invoice.paid", "tenant": "a", "idempotency_key": "order-7"}"#
            .to_owned(),
        &[],
    )
    .await;
    assert_eq!(respelled.status, StatusCode::OK, "{}", respelled.text);
    // The same key for another tenant is another message.
    let mut other_tenant = keyed.clone();
    other_tenant["tenant"] = json!("b");
    let other = post(&app, "/v1/messages", Some("all"), &other_tenant).await;
    assert_eq!(other.status, StatusCode::CREATED, "{}", other.text);
    assert_eq!(message_count(&app).await, 3);

    // The stored message reads back with every field.
    let mut full = message("a", "invoice.sent");
    full["schema_version"] = json!(2);
    full["headers"] = json!({"trace": "t-1"});
    full["ordering_key"] = json!("customer-1");
    full["priority"] = json!(7);
    // Within MAX_HOLD (366 days) from now.
    let at = (chrono::Utc::now() + chrono::Duration::days(30))
        .format("%Y-%m-%dT%H:%M:%S")
        .to_string();
    full["available_at"] = json!(format!("{at}Z"));
    let created = post(&app, "/v1/messages", Some("all"), &full).await;
    assert_eq!(created.status, StatusCode::CREATED, "{}", created.text);
    let id = created.body["id"].as_str().unwrap_or_default().to_owned();
    let read = get(&app, &format!("/v1/messages/{id}"), Some("all")).await;
    assert_eq!(read.status, StatusCode::OK, "{}", read.text);
    assert_eq!(read.body["payload"], json!({"n": 1}));
    assert_eq!(read.body["schema_version"], json!(2));
    assert_eq!(read.body["headers"], json!({"trace": "t-1"}));
    assert_eq!(read.body["ordering_key"], json!("customer-1"));
    assert_eq!(read.body["priority"], json!(7));
    assert!(read.body["available_at"]
        .as_str()
        .unwrap_or_default()
        .starts_with(&at));
    assert!(read.body["deliveries"].is_array());
    Ok(())
}

async fn batch_is_all_or_nothing<S>(courier: Courier<S>) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    let bad = json!({"messages": [
        message("a", "t.one"),
        message("a", "t.two"),
        message("a", "bad:topic"),
    ]});
    let reply = post(&app, "/v1/messages/batch", Some("all"), &bad).await;
    assert_eq!(
        reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reply.text
    );
    assert_eq!(reply.field(), Some("messages[2].topic"));
    assert_eq!(message_count(&app).await, 0);

    let wrong_tenant = json!({"messages": [message("a", "t"), message("b", "t")]});
    let reply = post(
        &app,
        "/v1/messages/batch",
        Some("publisher-a"),
        &wrong_tenant,
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN, "{}", reply.text);
    assert_eq!(reply.field(), Some("messages[1].tenant"));
    assert_eq!(message_count(&app).await, 0);

    let empty = post(
        &app,
        "/v1/messages/batch",
        Some("all"),
        &json!({"messages": []}),
    )
    .await;
    assert_eq!(empty.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(empty.field(), Some("messages"));

    let mut keyed = message("a", "t.one");
    keyed["idempotency_key"] = json!("k1");
    let good = json!({"messages": [keyed.clone(), message("a", "t.two"), message("b", "t.three")]});
    let reply = post(&app, "/v1/messages/batch", Some("all"), &good).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    assert_eq!(reply.body["messages"].as_array().map(Vec::len), Some(3));
    assert_eq!(message_count(&app).await, 3);
    let repeat = json!({"messages": [keyed]});
    let reply = post(&app, "/v1/messages/batch", Some("all"), &repeat).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    assert_eq!(reply.body["messages"][0]["duplicate"], json!(true));
    assert_eq!(message_count(&app).await, 3);
    Ok(())
}

async fn bad_input_names_the_field_and_stores_nothing<S>(courier: Courier<S>) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    let with = |key: &str, value: Value| {
        let mut body = message("a", "t");
        body[key] = value;
        body.to_string()
    };
    let without = |key: &str| {
        let mut body = message("a", "t");
        if let Some(object) = body.as_object_mut() {
            object.remove(key);
        }
        body.to_string()
    };
    let big_payload = json!({"s": "x".repeat(LIMIT)});
    let over_cap = format!(
        "{{\"tenant\":\"a\",\"topic\":\"t\",\"payload\":\"{}\"}}",
        "x".repeat(2 * LIMIT + 600 * 1024)
    );
    let cases: Vec<(&str, String, StatusCode, &str)> = vec![
        (
            "malformed JSON",
            "{\"tenant\": ".into(),
            StatusCode::BAD_REQUEST,
            "body",
        ),
        (
            "trailing garbage",
            format!("{} x", message("a", "t")),
            StatusCode::BAD_REQUEST,
            "body",
        ),
        (
            "not an object",
            "[1, 2]".into(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "body",
        ),
        (
            "tenant of wrong type",
            with("tenant", json!(5)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "tenant",
        ),
        (
            "topic of wrong type",
            with("topic", json!(["t"])),
            StatusCode::UNPROCESSABLE_ENTITY,
            "topic",
        ),
        (
            "schema_version of wrong type",
            with("schema_version", json!("1")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "schema_version",
        ),
        (
            "schema_version zero",
            with("schema_version", json!(0)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "schema_version",
        ),
        (
            "unknown field",
            with("color", json!("red")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "color",
        ),
        (
            "missing tenant",
            without("tenant"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "tenant",
        ),
        (
            "missing payload",
            without("payload"),
            StatusCode::UNPROCESSABLE_ENTITY,
            "payload",
        ),
        (
            "tenant outside the grammar",
            with("tenant", json!("a b")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "tenant",
        ),
        (
            "empty tenant",
            with("tenant", json!("")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "tenant",
        ),
        (
            "topic with the reserved colon",
            with("topic", json!("a:b")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "topic",
        ),
        (
            "topic too long",
            with("topic", json!("t".repeat(129))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "topic",
        ),
        (
            "headers not an object",
            with("headers", json!(["x"])),
            StatusCode::UNPROCESSABLE_ENTITY,
            "headers",
        ),
        (
            "headers a string",
            with("headers", json!("x=1")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "headers",
        ),
        (
            "header value not a string",
            with("headers", json!({"x": 1})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "headers.x",
        ),
        (
            "available_at not RFC 3339",
            with("available_at", json!("tomorrow")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "available_at",
        ),
        (
            "available_at without zone",
            with("available_at", json!("2030-01-01T00:00:00")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "available_at",
        ),
        (
            "available_at a number",
            with("available_at", json!(1_700_000_000)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "available_at",
        ),
        (
            "priority above 9",
            with("priority", json!(10)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "priority",
        ),
        (
            "priority below 0",
            with("priority", json!(-1)),
            StatusCode::UNPROCESSABLE_ENTITY,
            "priority",
        ),
        (
            "empty ordering_key",
            with("ordering_key", json!("")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "ordering_key",
        ),
        (
            "idempotency_key too long",
            with("idempotency_key", json!("k".repeat(256))),
            StatusCode::UNPROCESSABLE_ENTITY,
            "idempotency_key",
        ),
        (
            "payload with an escaped NUL in a string",
            with("payload", json!({"s": "a\u{0}b"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "payload",
        ),
        (
            "payload with an escaped NUL in a key",
            with("payload", json!({"a\u{0}": [1]})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "payload",
        ),
        (
            "header value with a NUL",
            with("headers", json!({"x": "a\u{0}"})),
            StatusCode::UNPROCESSABLE_ENTITY,
            "headers",
        ),
        (
            "available_at years ahead",
            with("available_at", json!("9999-01-01T00:00:00Z")),
            StatusCode::UNPROCESSABLE_ENTITY,
            "available_at",
        ),
        (
            "payload over max_payload_bytes",
            with("payload", big_payload),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload",
        ),
        (
            "body over the hard cap",
            over_cap,
            StatusCode::PAYLOAD_TOO_LARGE,
            "body",
        ),
    ];
    for (what, body, status, field) in cases {
        let reply = post_raw(&app, "/v1/messages", Some("all"), body, &[]).await;
        assert_eq!(reply.status, status, "{what}: {}", reply.text);
        assert_eq!(reply.field(), Some(field), "{what}: {}", reply.text);
        assert!(reply.body["error"]["message"].is_string(), "{what}");
        assert!(reply.body["error"]["code"].is_string(), "{what}");
    }
    let reply = post_raw(
        &app,
        "/v1/messages",
        Some("all"),
        message("a", "t").to_string(),
        &[("content-type", "text/plain")],
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        "{}",
        reply.text
    );
    let reply = post_raw(
        &app,
        "/v1/messages",
        Some("all"),
        with("idempotency_key", json!("k1")),
        &[("Idempotency-Key", "k2")],
    )
    .await;
    assert_eq!(
        reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reply.text
    );
    assert_eq!(reply.field(), Some("idempotency_key"));
    assert_eq!(
        message_count(&app).await,
        0,
        "a refused request stored something"
    );

    // Query parameters and paths are checked the same way.
    for (uri, field) in [
        ("/v1/messages?limit=abc", "limit"),
        ("/v1/messages?limit=0", "limit"),
        ("/v1/messages?state=done", "state"),
        ("/v1/messages?topic=a:b", "topic"),
        ("/v1/messages?colour=red", "colour"),
        ("/v1/messages?message_id=seven", "message_id"),
        ("/v1/messages?enqueued_after=yesterday", "enqueued_after"),
        (
            "/v1/messages?enqueued_after=2026-12-01T10:00:00Z&enqueued_before=2026-12-01T10:00:00Z",
            "enqueued_before",
        ),
        ("/v1/messages/not-a-uuid", "id"),
        ("/v1/dead-letters?limit=9999", "limit"),
        ("/v1/dead-letters?message_id=1", "message_id"),
        (
            "/v1/dead-letters?dead_before=2026-13-01T00:00:00Z",
            "dead_before",
        ),
        (
            "/v1/dead-letters?dead_after=2026-12-02T00:00:00Z&dead_before=2026-12-01T00:00:00Z",
            "dead_before",
        ),
        ("/v1/subscriptions?limit=0", "limit"),
        ("/v1/stats?limit=501", "limit"),
    ] {
        let reply = get(&app, uri, Some("all")).await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{uri}: {}",
            reply.text
        );
        assert_eq!(reply.field(), Some(field), "{uri}: {}", reply.text);
    }
    // A cursor that is not a `next_cursor` of that list: 400 naming it.
    let foreign = get(&app, "/v1/subscriptions?limit=1", Some("all")).await;
    let foreign = foreign.body["next_cursor"]
        .as_str()
        .unwrap_or("czE6YQ")
        .to_owned();
    for uri in [
        "/v1/messages?cursor=nope",
        "/v1/messages?cursor=bTE6",
        "/v1/dead-letters?cursor=x",
        &format!("/v1/dead-letters?cursor={foreign}"),
        &format!("/v1/messages?cursor={foreign}"),
        "/v1/subscriptions?cursor=%21",
        "/v1/stats?cursor=dDE6YQ",
    ] {
        let reply = get(&app, uri, Some("all")).await;
        assert_eq!(
            reply.status,
            StatusCode::BAD_REQUEST,
            "{uri}: {}",
            reply.text
        );
        assert_eq!(reply.field(), Some("cursor"), "{uri}: {}", reply.text);
    }
    for (body, field) in [
        (json!({"filter": {"message_id": "x"}}), "filter.message_id"),
        (
            json!({"filter": {"dead_after": "noon"}}),
            "filter.dead_after",
        ),
        (
            json!({"filter": {"dead_after": "2026-12-02T00:00:00Z", "dead_before": "2026-12-01T00:00:00Z"}}),
            "filter.dead_before",
        ),
        (json!({}), "ids"),
        (json!({"ids": [1], "filter": {}}), "ids"),
        (json!({"ids": []}), "ids"),
        (json!({"ids": ["x"]}), "ids[0]"),
        (json!({"filter": {"topic": "a b"}}), "filter.topic"),
        (json!({"filter": {"tenantt": "a"}}), "filter.tenantt"),
    ] {
        let reply = post(&app, "/v1/dead-letters/retry", Some("all"), &body).await;
        assert_eq!(
            reply.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{body}: {}",
            reply.text
        );
        assert_eq!(reply.field(), Some(field), "{body}: {}", reply.text);
    }
    Ok(())
}

/// Every route, with the role it needs.
fn routes(message_id: &str) -> Vec<(Method, String, Option<Value>, &'static str)> {
    vec![
        (
            Method::POST,
            "/v1/messages".into(),
            Some(message("a", "t")),
            "publish",
        ),
        (
            Method::POST,
            "/v1/messages/batch".into(),
            Some(json!({"messages": [message("a", "t")]})),
            "publish",
        ),
        (
            Method::GET,
            format!("/v1/messages/{message_id}"),
            None,
            "read",
        ),
        (Method::GET, "/v1/messages".into(), None, "read"),
        (Method::GET, "/v1/stats".into(), None, "read"),
        (Method::GET, "/v1/throughput".into(), None, "read"),
        (Method::GET, "/v1/dead-letters".into(), None, "read"),
        (Method::GET, "/v1/dead-letters/groups".into(), None, "read"),
        (
            Method::GET,
            "/v1/dead-letters/999999999".into(),
            None,
            "read",
        ),
        (Method::GET, "/v1/subscriptions".into(), None, "read"),
        (Method::GET, "/v1/subscriptions/sub".into(), None, "read"),
        // Every tenant's counts: admin only.
        (Method::GET, "/metrics".into(), None, "admin"),
        (
            Method::POST,
            "/v1/dead-letters/retry".into(),
            Some(json!({"ids": [999_999_999]})),
            "admin",
        ),
        (
            Method::POST,
            "/v1/dead-letters/discard".into(),
            Some(json!({"ids": [999_999_999]})),
            "admin",
        ),
        (
            Method::POST,
            "/v1/subscriptions/sub/pause".into(),
            None,
            "admin",
        ),
        (
            Method::POST,
            "/v1/subscriptions/sub/resume".into(),
            None,
            "admin",
        ),
    ]
}

async fn every_route_checks_token_role_and_tenant<S>(courier: Courier<S>) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    // A dead letter of tenant b, so tenant checks have something to hide.
    let worker = courier
        .worker("sub")
        .handle(
            "t",
            1,
            handler_fn(|_message: courier::Message<Value>| async {
                Err::<(), _>(HandlerError::permanent("refused"))
            }),
        )
        .build()
        .await?;
    let of_b = post(&app, "/v1/messages", Some("all"), &message("b", "t")).await;
    assert_eq!(of_b.status, StatusCode::CREATED);
    let b_id = of_b.body["id"].as_str().unwrap_or_default().to_owned();
    assert_eq!(worker.run_once().await?, 1);

    for (method, uri, body, role) in routes(&b_id) {
        let send = |token: Option<&'static str>| {
            let app = app.clone();
            let method = method.clone();
            let uri = uri.clone();
            let body = body.clone();
            async move {
                call(
                    &app,
                    method,
                    &uri,
                    token,
                    body.map(|b| Body::from(b.to_string())),
                    &[],
                )
                .await
            }
        };
        for token in [None, Some("wrong-token")] {
            let reply = send(token).await;
            assert_eq!(
                reply.status,
                StatusCode::UNAUTHORIZED,
                "{method} {uri} {token:?}"
            );
            assert_eq!(reply.code(), Some("unauthorized"), "{method} {uri}");
        }
        let lacking: &[&str] = match role {
            "publish" => &["reader-a", "admin-all"],
            "read" => &["publisher-a"],
            _ => &["reader-a", "publisher-a"],
        };
        for token in lacking {
            let reply = send(Some(token)).await;
            assert_eq!(
                reply.status,
                StatusCode::FORBIDDEN,
                "{method} {uri} as {token}: {}",
                reply.text
            );
            assert_eq!(reply.code(), Some("forbidden"), "{method} {uri}");
        }
        let holder = match role {
            "publish" => "publisher-a",
            "read" => "reader-a",
            _ => "admin-all",
        };
        let reply = send(Some(holder)).await;
        assert!(
            reply.status.is_success() || reply.status == StatusCode::NOT_FOUND,
            "{method} {uri} as {holder}: {} {}",
            reply.status,
            reply.text
        );
    }

    // Tenant isolation.
    let reply = get(&app, &format!("/v1/messages/{b_id}"), Some("reader-a")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND, "{}", reply.text);
    let reply = get(&app, &format!("/v1/messages/{b_id}"), Some("all")).await;
    assert_eq!(reply.status, StatusCode::OK);
    let reply = post(
        &app,
        "/v1/messages",
        Some("publisher-a"),
        &message("b", "t"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::FORBIDDEN);
    assert_eq!(reply.field(), Some("tenant"));
    for uri in [
        "/v1/messages?tenant=b",
        "/v1/stats?tenant=b",
        "/v1/throughput?tenant=b",
        "/v1/dead-letters?tenant=b",
    ] {
        let reply = get(&app, uri, Some("reader-a")).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{uri}: {}", reply.text);
        assert_eq!(reply.field(), Some("tenant"), "{uri}");
    }
    let listed = get(&app, "/v1/messages", Some("reader-a")).await;
    let tenants: Vec<&str> = listed.body["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["tenant"].as_str())
        .collect();
    assert!(tenants.iter().all(|t| *t == "a"), "{tenants:?}");
    assert!(
        !tenants.is_empty(),
        "reader-a should see tenant a's messages"
    );
    let dead = get(&app, "/v1/dead-letters", Some("reader-a")).await;
    assert_eq!(
        dead.body["items"].as_array().map(Vec::len),
        Some(0),
        "{}",
        dead.text
    );
    let dead = get(&app, "/v1/dead-letters", Some("all")).await;
    assert_eq!(
        dead.body["items"].as_array().map(Vec::len),
        Some(1),
        "{}",
        dead.text
    );
    let dead_id = dead.body["items"][0]["id"].clone();
    let stats = get(&app, "/v1/stats", Some("reader-a")).await;
    assert_eq!(stats.body["dead"], json!(0), "{}", stats.text);
    // Subscriptions are listed without counts, so no tenant's counts show
    // (the target is the daemon's config, the same for every tenant).
    let listed = get(&app, "/v1/subscriptions", Some("reader-a")).await;
    for subscription in listed.body["items"].as_array().into_iter().flatten() {
        let mut fields: Vec<&str> = subscription
            .as_object()
            .into_iter()
            .flat_map(|o| o.keys().map(String::as_str))
            .collect();
        fields.sort_unstable();
        assert_eq!(
            fields,
            ["created_at", "name", "paused", "target", "topics"],
            "{}",
            listed.text
        );
    }
    let stats = get(&app, "/v1/stats", Some("all")).await;
    assert_eq!(stats.body["dead"], json!(1), "{}", stats.text);
    // Tenant a's admin cannot retry b's dead letter, by id or filter.
    let retry = post(
        &app,
        "/v1/dead-letters/retry",
        Some("admin-a"),
        &json!({"ids": [dead_id]}),
    )
    .await;
    assert_eq!(retry.body["affected"], json!(0), "{}", retry.text);
    let retry = post(
        &app,
        "/v1/dead-letters/retry",
        Some("admin-a"),
        &json!({"filter": {"tenant": "b"}}),
    )
    .await;
    assert_eq!(retry.status, StatusCode::FORBIDDEN, "{}", retry.text);
    assert_eq!(retry.field(), Some("filter.tenant"));
    let retry = post(
        &app,
        "/v1/dead-letters/retry",
        Some("both-ab"),
        &json!({"filter": {}}),
    )
    .await;
    assert_eq!(
        retry.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        retry.text
    );
    assert_eq!(retry.field(), Some("filter.tenant"));
    // Pausing needs a token for every tenant.
    let pause = post(
        &app,
        "/v1/subscriptions/sub/pause",
        Some("admin-a"),
        &json!(null),
    )
    .await;
    assert_eq!(pause.status, StatusCode::FORBIDDEN, "{}", pause.text);
    let pause = call(
        &app,
        Method::POST,
        "/v1/subscriptions/nope/pause",
        Some("admin-all"),
        None,
        &[],
    )
    .await;
    assert_eq!(pause.status, StatusCode::NOT_FOUND, "{}", pause.text);
    // Health and the document are public.
    for uri in ["/healthz", "/readyz", "/v1/openapi.json"] {
        let reply = get(&app, uri, None).await;
        assert_eq!(reply.status, StatusCode::OK, "{uri}: {}", reply.text);
    }
    let reply = get(&app, "/v1/nothing-here", Some("all")).await;
    assert_eq!(reply.status, StatusCode::NOT_FOUND);
    assert_eq!(reply.code(), Some("not_found"));
    Ok(())
}

async fn dead_letters_and_subscriptions_are_managed<S>(courier: Courier<S>) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app(courier.store().clone(), &[], LIMIT);
    let worker = courier
        .worker("billing")
        .handle(
            "invoice.paid",
            1,
            handler_fn(|_message: courier::Message<Value>| async {
                Err::<(), _>(HandlerError::permanent("the ledger refused it"))
            }),
        )
        .build()
        .await?;
    for _ in 0..3 {
        let reply = post(&app, "/v1/messages", None, &message("a", "invoice.paid")).await;
        assert_eq!(reply.status, StatusCode::CREATED);
    }
    let id = get(&app, "/v1/messages?limit=1", None).await.body["items"][0]["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(worker.run_once().await?, 3);

    let detail = get(&app, &format!("/v1/messages/{id}"), None).await;
    assert_eq!(
        detail.body["deliveries"][0]["subscription"],
        json!("billing"),
        "{}",
        detail.text
    );
    assert_eq!(detail.body["deliveries"][0]["state"], json!("dead"));
    assert!(detail.body["deliveries"][0]["errors"][0]["message"]
        .as_str()
        .unwrap_or_default()
        .contains("the ledger refused it"));
    let dead = get(&app, "/v1/dead-letters?subscription=billing&limit=2", None).await;
    assert_eq!(
        dead.body["items"].as_array().map(Vec::len),
        Some(2),
        "{}",
        dead.text
    );
    let cursor = dead.body["next_cursor"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(!cursor.is_empty(), "{}", dead.text);
    let rest = get(
        &app,
        &format!("/v1/dead-letters?limit=2&cursor={cursor}"),
        None,
    )
    .await;
    assert_eq!(
        rest.body["items"].as_array().map(Vec::len),
        Some(1),
        "{}",
        rest.text
    );
    let dead_state = get(&app, "/v1/messages?state=dead&subscription=billing", None).await;
    assert_eq!(dead_state.body["items"].as_array().map(Vec::len), Some(3));

    let first = dead.body["items"][0]["id"].clone();
    // One dead letter by its id, as the listing shows it.
    let one = get(&app, &format!("/v1/dead-letters/{first}"), None).await;
    assert_eq!(one.status, StatusCode::OK, "{}", one.text);
    assert_eq!(one.body, dead.body["items"][0], "{}", one.text);
    let missing = get(&app, "/v1/dead-letters/999999999", None).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.text);
    assert_eq!(missing.field(), Some("id"));
    let malformed = get(&app, "/v1/dead-letters/seven", None).await;
    assert_eq!(
        malformed.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        malformed.text
    );
    assert_eq!(malformed.field(), Some("id"));
    let retried = post(
        &app,
        "/v1/dead-letters/retry",
        None,
        &json!({"ids": [first]}),
    )
    .await;
    assert_eq!(retried.body["affected"], json!(1), "{}", retried.text);
    let discarded = post(
        &app,
        "/v1/dead-letters/discard",
        None,
        &json!({"filter": {"subscription": "billing"}}),
    )
    .await;
    assert_eq!(discarded.body["affected"], json!(2), "{}", discarded.text);
    let stats = get(&app, "/v1/stats", None).await;
    assert_eq!(stats.body["available"], json!(1), "{}", stats.text);
    assert_eq!(stats.body["dead"], json!(0), "{}", stats.text);
    assert_eq!(stats.body["items"][0]["subscription"], json!("billing"));

    let subscriptions = get(&app, "/v1/subscriptions", None).await;
    assert_eq!(subscriptions.body["items"][0]["name"], json!("billing"));
    assert_eq!(subscriptions.body["items"][0]["paused"], json!(false));
    let paused = call(
        &app,
        Method::POST,
        "/v1/subscriptions/billing/pause",
        None,
        None,
        &[],
    )
    .await;
    assert_eq!(
        paused.body,
        json!({"name": "billing", "paused": true}),
        "{}",
        paused.text
    );
    assert_eq!(worker.run_once().await?, 0, "a paused subscription claimed");
    let subscriptions = get(&app, "/v1/subscriptions", None).await;
    assert_eq!(subscriptions.body["items"][0]["paused"], json!(true));
    let resumed = call(
        &app,
        Method::POST,
        "/v1/subscriptions/billing/resume",
        None,
        None,
        &[],
    )
    .await;
    assert_eq!(resumed.body["paused"], json!(false));
    assert_eq!(
        worker.run_once().await?,
        1,
        "the retried dead letter is delivered again"
    );

    let metrics = get(&app, "/metrics", None).await;
    assert_eq!(metrics.status, StatusCode::OK);
    assert!(metrics.content_type.starts_with("text/plain"));
    assert!(
        metrics.text.contains("courier_messages_published_total"),
        "{}",
        metrics.text
    );
    assert!(
        metrics.text.contains("courier_queue_depth"),
        "{}",
        metrics.text
    );
    let ready = get(&app, "/readyz", None).await;
    assert_eq!(ready.body["status"], json!("ready"));
    Ok(())
}

/// `GET /v1/dead-letters/groups` groups a token's tenants' dead letters by
/// failure (a tenant-scoped token sees its tenants' groups only); retry,
/// discard and the listing take a group's fingerprint as a filter and leave
/// the other groups alone; a bad fingerprint or limit is refused naming it.
async fn dead_letters_group_by_failure_per_token_and_a_group_is_retried_by_fingerprint<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    let worker = courier
        .worker("billing")
        .handle(
            "invoice.paid",
            1,
            handler_fn(|message: courier::Message<Value>| async move {
                let reason = if message.tenant == "a" {
                    format!("the ledger refused invoice {}", message.id)
                } else {
                    "the ledger is closed".to_owned()
                };
                Err::<(), _>(HandlerError::permanent(reason))
            }),
        )
        .handle(
            "invoice.void",
            1,
            handler_fn(|_message: courier::Message<Value>| async {
                Err::<(), _>(HandlerError::permanent("voids are not supported"))
            }),
        )
        .build()
        .await?;
    for (tenant, topic, n) in [
        ("a", "invoice.paid", 3),
        ("a", "invoice.void", 2),
        ("b", "invoice.paid", 4),
    ] {
        for _ in 0..n {
            let reply = post(&app, "/v1/messages", Some("all"), &message(tenant, topic)).await;
            assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
        }
    }
    assert_eq!(worker.run_once().await?, 9);

    let counts = |reply: &common::Reply| -> Vec<(String, u64)> {
        reply.body["items"]
            .as_array()
            .map(|items| {
                items
                    .iter()
                    .map(|g| {
                        (
                            g["sample_error"].as_str().unwrap_or_default().to_owned(),
                            g["count"].as_u64().unwrap_or_default(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    let all = get(&app, "/v1/dead-letters/groups", Some("all")).await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.text);
    let all_counts = counts(&all);
    assert_eq!(all_counts.len(), 3, "{}", all.text);
    assert_eq!(
        all_counts.iter().map(|(_, n)| *n).collect::<Vec<_>>(),
        [4, 3, 2],
        "{}",
        all.text
    );
    assert!(
        all_counts[0].0.contains("the ledger is closed"),
        "{}",
        all.text
    );
    assert!(
        all_counts[1].0.contains("the ledger refused invoice"),
        "{}",
        all.text
    );
    assert!(
        all_counts[2].0.contains("voids are not supported"),
        "{}",
        all.text
    );
    assert_eq!(all.body["items"][0]["subscriptions"], json!(["billing"]));
    assert_eq!(all.body["items"][0]["topics"], json!(["invoice.paid"]));
    assert!(
        all.body["items"][0]["first_seen"].is_string(),
        "{}",
        all.text
    );
    assert!(
        all.body["items"][0]["last_seen"].is_string(),
        "{}",
        all.text
    );

    // A token scoped to tenant a sees a's groups only; b's is not even named.
    let scoped = get(&app, "/v1/dead-letters/groups", Some("reader-a")).await;
    assert_eq!(scoped.status, StatusCode::OK, "{}", scoped.text);
    assert_eq!(
        counts(&scoped).iter().map(|(_, n)| *n).collect::<Vec<_>>(),
        [3, 2],
        "{}",
        scoped.text
    );
    assert!(!scoped.text.contains("closed"), "{}", scoped.text);
    let other = get(&app, "/v1/dead-letters/groups?tenant=b", Some("reader-a")).await;
    assert_eq!(other.status, StatusCode::FORBIDDEN, "{}", other.text);
    let several = get(&app, "/v1/dead-letters/groups", Some("both-ab")).await;
    assert_eq!(several.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(several.field(), Some("tenant"));

    // Bad parameters are refused naming the field.
    for (uri, field) in [
        ("/v1/dead-letters/groups?fingerprint=nope", "fingerprint"),
        ("/v1/dead-letters/groups?limit=0", "limit"),
        (
            "/v1/dead-letters?fingerprint=ABCDEF0123456789",
            "fingerprint",
        ),
    ] {
        let refused = get(&app, uri, Some("all")).await;
        assert_eq!(
            refused.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{uri}: {}",
            refused.text
        );
        assert_eq!(refused.field(), Some(field), "{uri}: {}", refused.text);
    }
    let refused = post(
        &app,
        "/v1/dead-letters/retry",
        Some("all"),
        &json!({"filter": {"fingerprint": "nope"}}),
    )
    .await;
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        refused.text
    );
    assert_eq!(
        refused.field(),
        Some("filter.fingerprint"),
        "{}",
        refused.text
    );

    // The listing by fingerprint shows that group's dead letters only.
    let refused_fp = all.body["items"][1]["fingerprint"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let listed = get(
        &app,
        &format!("/v1/dead-letters?fingerprint={refused_fp}"),
        Some("all"),
    )
    .await;
    assert_eq!(
        listed.body["items"].as_array().map(Vec::len),
        Some(3),
        "{}",
        listed.text
    );
    // A dry run counts the group; the retry moves it and nothing else.
    let dry = post(
        &app,
        "/v1/dead-letters/retry",
        Some("admin-a"),
        &json!({"filter": {"fingerprint": refused_fp}, "dry_run": true}),
    )
    .await;
    assert_eq!(dry.body["affected"], json!(3), "{}", dry.text);
    let retried = post(
        &app,
        "/v1/dead-letters/retry",
        Some("admin-a"),
        &json!({"filter": {"fingerprint": refused_fp}}),
    )
    .await;
    assert_eq!(retried.body["affected"], json!(3), "{}", retried.text);
    let after = get(&app, "/v1/dead-letters/groups", Some("all")).await;
    let mut expected = all.body["items"].as_array().cloned().unwrap_or_default();
    expected.remove(1);
    assert_eq!(
        after.body["items"],
        Value::Array(expected),
        "{}",
        after.text
    );
    // Discard by fingerprint: a scoped admin cannot reach another tenant's group.
    let closed_fp = all.body["items"][0]["fingerprint"].clone();
    let none = post(
        &app,
        "/v1/dead-letters/discard",
        Some("admin-a"),
        &json!({"filter": {"fingerprint": closed_fp}}),
    )
    .await;
    assert_eq!(none.body["affected"], json!(0), "{}", none.text);
    let discarded = post(
        &app,
        "/v1/dead-letters/discard",
        Some("admin-all"),
        &json!({"filter": {"fingerprint": closed_fp}}),
    )
    .await;
    assert_eq!(discarded.body["affected"], json!(4), "{}", discarded.text);
    let last = get(&app, "/v1/dead-letters/groups", Some("all")).await;
    assert_eq!(
        last.body["items"].as_array().map(Vec::len),
        Some(1),
        "{}",
        last.text
    );
    assert_eq!(last.body["items"][0], all.body["items"][2], "{}", last.text);
    Ok(())
}

async fn a_scoped_retry_by_ids_is_one_store_call_and_leaves_other_tenants_alone<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let worker = refusing_worker(&courier, "billing", "invoice.paid").await?;
    let open = app(courier.store().clone(), &[], LIMIT);
    for tenant in ["a", "a", "a", "b", "b"] {
        let reply = post(
            &open,
            "/v1/messages",
            None,
            &message(tenant, "invoice.paid"),
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    }
    assert_eq!(worker.run_once().await?, 5);
    let dead = courier
        .store()
        .list_dead_letters(&courier::DeadLetterFilter::default(), None, 10)
        .await?;
    let of = |tenant: &str| -> Vec<i64> {
        dead.items
            .iter()
            .filter(|d| d.tenant == tenant)
            .map(|d| d.delivery_id)
            .collect()
    };
    let (a_ids, b_ids) = (of("a"), of("b"));
    assert_eq!((a_ids.len(), b_ids.len()), (3, 2));
    // 1000 ids: every dead letter and ids that name none.
    let mut ids: Vec<i64> = dead.items.iter().map(|d| d.delivery_id).collect();
    ids.extend((1..=995).map(|n| 1_000_000_000 + n));

    let (store, calls) = common::counting::CountingStore::new(courier.store().clone());
    let auth = courier_server::Authenticator::new(&standard_tokens())?;
    let scoped = courier_server::router(courier_server::ApiState::with_authenticator(
        store, auth, LIMIT,
    ));
    let discarded = post(
        &scoped,
        "/v1/dead-letters/discard",
        Some("admin-a"),
        &json!({"ids": b_ids}),
    )
    .await;
    assert_eq!(discarded.status, StatusCode::OK, "{}", discarded.text);
    assert_eq!(discarded.body["affected"], json!(0), "another tenant's ids");
    let retried = post(
        &scoped,
        "/v1/dead-letters/retry",
        Some("admin-a"),
        &json!({"ids": ids}),
    )
    .await;
    assert_eq!(retried.status, StatusCode::OK, "{}", retried.text);
    assert_eq!(retried.body["affected"], json!(3), "{}", retried.text);
    let counted = calls
        .lock()
        .map_err(|_| anyhow::anyhow!("poisoned"))?
        .clone();
    assert_eq!(
        counted.values().sum::<usize>(),
        2,
        "one store call per request: {counted:?}"
    );
    assert_eq!(counted.get("get_dead_letter"), None, "{counted:?}");
    // b's dead letters are still dead; a's are deliverable again.
    let left = courier
        .store()
        .list_dead_letters(&courier::DeadLetterFilter::default(), None, 10)
        .await?;
    let mut left: Vec<i64> = left.items.iter().map(|d| d.delivery_id).collect();
    left.sort_unstable();
    assert_eq!(left, b_ids);
    assert_eq!(worker.run_once().await?, 3);
    Ok(())
}

async fn a_dry_run_changes_nothing_and_an_empty_filter_needs_all<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let worker = refusing_worker(&courier, "billing", "invoice.paid").await?;
    let app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    for tenant in ["a", "a", "a", "b", "b"] {
        let reply = post(
            &app,
            "/v1/messages",
            Some("all"),
            &message(tenant, "invoice.paid"),
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    }
    assert_eq!(worker.run_once().await?, 5);
    let dead_count = || async {
        let page = get(&app, "/v1/dead-letters?limit=500", Some("all")).await;
        page.body["items"].as_array().map_or(0, Vec::len)
    };
    let a_ids: Vec<Value> = get(&app, "/v1/dead-letters?tenant=a", Some("all"))
        .await
        .body["items"]
        .as_array()
        .map(|items| items.iter().map(|item| item["id"].clone()).collect())
        .unwrap_or_default();
    assert_eq!(a_ids.len(), 3);

    for route in ["/v1/dead-letters/retry", "/v1/dead-letters/discard"] {
        // Refused, and nothing changed.
        for (token, body, field) in [
            ("all", json!({"filter": {}}), "filter"),
            ("all", json!({"filter": {}, "dry_run": true}), "filter"),
            ("admin-a", json!({"filter": {}}), "filter"),
            (
                "all",
                json!({"filter": {"tenant": "a"}, "all": true}),
                "all",
            ),
            ("all", json!({"ids": [1], "all": true}), "all"),
            ("all", json!({"ids": [1], "dry_run": true}), "dry_run"),
        ] {
            let reply = post(&app, route, Some(token), &body).await;
            assert_eq!(
                reply.status,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{route} {body}: {}",
                reply.text
            );
            assert_eq!(reply.field(), Some(field), "{route} {body}: {}", reply.text);
        }
        // A dry run counts and shows, and changes nothing.
        let preview = post(
            &app,
            route,
            Some("all"),
            &json!({"filter": {"tenant": "a"}, "dry_run": true}),
        )
        .await;
        assert_eq!(preview.status, StatusCode::OK, "{}", preview.text);
        assert_eq!(
            preview.body,
            json!({"affected": 3, "dry_run": true, "ids": a_ids}),
            "{route}"
        );
        let everything = post(
            &app,
            route,
            Some("all"),
            &json!({"filter": {}, "all": true, "dry_run": true}),
        )
        .await;
        assert_eq!(everything.body["affected"], json!(5), "{}", everything.text);
        assert_eq!(everything.body["ids"].as_array().map(Vec::len), Some(5));
        let scoped = post(
            &app,
            route,
            Some("admin-a"),
            &json!({"filter": {}, "all": true, "dry_run": true}),
        )
        .await;
        assert_eq!(scoped.body["affected"], json!(3), "{}", scoped.text);
        assert_eq!(
            dead_count().await,
            5,
            "{route}: a dry run changed something"
        );
    }
    // `all` does it.
    let retried = post(
        &app,
        "/v1/dead-letters/retry",
        Some("admin-a"),
        &json!({"filter": {}, "all": true}),
    )
    .await;
    assert_eq!(retried.body, json!({"affected": 3}), "{}", retried.text);
    let discarded = post(
        &app,
        "/v1/dead-letters/discard",
        Some("all"),
        &json!({"filter": {}, "all": true}),
    )
    .await;
    assert_eq!(discarded.body, json!({"affected": 2}), "{}", discarded.text);
    assert_eq!(dead_count().await, 0);
    Ok(())
}

async fn a_message_s_detail_names_each_open_delivery_s_id<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let failing = refusing_worker(&courier, "billing", "invoice.paid").await?;
    let succeeding = courier
        .worker("audit")
        .handle(
            "invoice.paid",
            1,
            handler_fn(|_message: courier::Message<Value>| async { Ok::<(), HandlerError>(()) }),
        )
        .build()
        .await?;
    let app = app(courier.store().clone(), &[], LIMIT);
    let published = post(&app, "/v1/messages", None, &message("a", "invoice.paid")).await;
    let id = published.body["id"].as_str().unwrap_or_default().to_owned();
    let detail = get(&app, &format!("/v1/messages/{id}"), None).await;
    let deliveries = detail.body["deliveries"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(deliveries.len(), 2, "{}", detail.text);
    assert!(
        deliveries.iter().all(|d| d["delivery_id"].is_i64()),
        "{}",
        detail.text
    );
    assert_eq!(failing.run_once().await?, 1);
    assert_eq!(succeeding.run_once().await?, 1);

    let detail = get(&app, &format!("/v1/messages/{id}"), None).await;
    let of = |subscription: &str| {
        detail.body["deliveries"]
            .as_array()
            .and_then(|all| all.iter().find(|d| d["subscription"] == subscription))
            .cloned()
            .unwrap_or_default()
    };
    let (billing, audit) = (of("billing"), of("audit"));
    assert_eq!(billing["state"], json!("dead"), "{}", detail.text);
    assert_eq!(audit["state"], json!("completed"), "{}", detail.text);
    assert_eq!(audit["delivery_id"], Value::Null, "{}", detail.text);
    let dead = get(&app, "/v1/dead-letters", None).await;
    assert_eq!(
        billing["delivery_id"], dead.body["items"][0]["id"],
        "{}",
        dead.text
    );
    // The id from the detail is what retry takes.
    let retried = post(
        &app,
        "/v1/dead-letters/retry",
        None,
        &json!({"ids": [billing["delivery_id"]]}),
    )
    .await;
    assert_eq!(retried.body, json!({"affected": 1}), "{}", retried.text);
    Ok(())
}

async fn one_subscription_shows_its_state_and_its_backlog_by_tenant<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let worker = refusing_worker(&courier, "billing", "invoice.paid").await?;
    let app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    for tenant in ["a", "a", "b"] {
        let reply = post(
            &app,
            "/v1/messages",
            Some("all"),
            &message(tenant, "invoice.paid"),
        )
        .await;
        assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    }
    assert_eq!(worker.run_once().await?, 3);
    let reply = post(
        &app,
        "/v1/messages",
        Some("all"),
        &message("a", "invoice.paid"),
    )
    .await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);

    let all = get(&app, "/v1/subscriptions/billing", Some("all")).await;
    assert_eq!(all.status, StatusCode::OK, "{}", all.text);
    assert_eq!(all.body["name"], json!("billing"));
    assert_eq!(all.body["topics"], json!(["invoice.paid"]), "{}", all.text);
    assert_eq!(all.body["state"], json!("active"));
    assert_eq!(
        all.body["backlog"],
        json!({"available": 1, "retrying": 0, "running": 0, "dead": 3}),
        "{}",
        all.text
    );
    assert!(
        all.body["oldest_pending_age_seconds"].is_number(),
        "{}",
        all.text
    );
    // A token scoped to tenant b sees b's backlog only.
    let token = common::token(
        "reader-b",
        "reader-b",
        &["b"],
        &[courier_server::config::Role::Read],
    );
    let scoped = app_with_tokens(&courier, vec![token]);
    let b = get(&scoped, "/v1/subscriptions/billing", Some("reader-b")).await;
    assert_eq!(
        b.body["backlog"],
        json!({"available": 0, "retrying": 0, "running": 0, "dead": 1}),
        "{}",
        b.text
    );
    assert_eq!(
        b.body["oldest_pending_age_seconds"],
        Value::Null,
        "{}",
        b.text
    );

    let paused = post(
        &app,
        "/v1/subscriptions/billing/pause",
        Some("all"),
        &json!({}),
    )
    .await;
    assert_eq!(paused.status, StatusCode::OK, "{}", paused.text);
    let now = get(&app, "/v1/subscriptions/billing", Some("reader-a")).await;
    assert_eq!(now.body["state"], json!("paused"), "{}", now.text);
    let missing = get(&app, "/v1/subscriptions/nobody", Some("all")).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND, "{}", missing.text);
    assert_eq!(missing.field(), Some("name"));
    let bad = get(&app, "/v1/subscriptions/a%20b", Some("all")).await;
    assert_eq!(bad.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", bad.text);
    assert_eq!(bad.field(), Some("name"));
    Ok(())
}

fn app_with_tokens<S>(
    courier: &Courier<S>,
    tokens: Vec<courier_server::config::TokenConfig>,
) -> axum::Router
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    app(courier.store().clone(), &tokens, LIMIT)
}

async fn a_batch_is_refused_while_it_is_read<S>(courier: Courier<S>) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    // Past 1000 items reading stops: the bad item after them is never read.
    let mut items: Vec<String> = (0..1001)
        .map(|_| message("a", "t.one").to_string())
        .collect();
    items.push(r#"{"bogus": 1}"#.to_owned());
    let over = format!(r#"{{"messages": [{}]}}"#, items.join(","));
    let reply = post_raw(&app, "/v1/messages/batch", Some("all"), over, &[]).await;
    assert_eq!(
        reply.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        reply.text
    );
    assert_eq!(reply.field(), Some("messages"), "{}", reply.text);
    assert!(reply.text.contains("1000"), "{}", reply.text);
    // So are tiny items that are not messages at all.
    let zeros = format!(r#"{{"messages": [{}]}}"#, vec!["0"; 5000].join(","));
    let reply = post_raw(&app, "/v1/messages/batch", Some("all"), zeros, &[]).await;
    assert_eq!(reply.field(), Some("messages"), "{}", reply.text);
    // An item over one message's limit is refused before it is parsed.
    let mut large = message("a", "t.one");
    large["payload"] = json!(vec![0; 300_000]);
    let body = json!({"messages": [large]}).to_string();
    let reply = post_raw(&app, "/v1/messages/batch", Some("all"), body, &[]).await;
    assert_eq!(
        reply.status,
        StatusCode::PAYLOAD_TOO_LARGE,
        "{}",
        reply.text
    );
    assert_eq!(reply.field(), Some("messages[0]"), "{}", reply.text);
    // Items keep their own errors, named under their index.
    let body = json!({"messages": [message("a", "t.one"), {"tenant": "a", "topic": "t", "payload": 1, "x": 1}]});
    let reply = post(&app, "/v1/messages/batch", Some("all"), &body).await;
    assert_eq!(reply.field(), Some("messages[1].x"), "{}", reply.text);
    let body = json!({"messages": [message("a", "t.one"), 7]});
    let reply = post(&app, "/v1/messages/batch", Some("all"), &body).await;
    assert_eq!(reply.field(), Some("messages[1]"), "{}", reply.text);
    let body = json!({"messages": [], "extra": 1});
    let reply = post(&app, "/v1/messages/batch", Some("all"), &body).await;
    assert_eq!(reply.field(), Some("extra"), "{}", reply.text);
    assert_eq!(message_count(&app).await, 0);
    Ok(())
}

async fn a_batch_reusing_a_key_for_another_message_stores_nothing<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    let keyed = |key: &str, n: i64| json!({"tenant": "a", "topic": "invoice.paid", "payload": {"n": n}, "idempotency_key": key});
    let first = post(&app, "/v1/messages", Some("all"), &keyed("order-1", 1)).await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text);
    for (body, index) in [
        // Against a stored message.
        (
            json!({"messages": [message("a", "t.new"), keyed("order-1", 2)]}),
            1,
        ),
        // Against an earlier item of the same batch.
        (
            json!({"messages": [keyed("order-2", 1), message("a", "t.new"), keyed("order-2", 3)]}),
            2,
        ),
    ] {
        let reply = post(&app, "/v1/messages/batch", Some("all"), &body).await;
        assert_eq!(reply.status, StatusCode::CONFLICT, "{body}: {}", reply.text);
        assert_eq!(
            reply.code(),
            Some("idempotency_key_reused"),
            "{}",
            reply.text
        );
        let field = format!("messages[{index}].idempotency_key");
        assert_eq!(reply.field(), Some(field.as_str()), "{}", reply.text);
        assert_eq!(message_count(&app).await, 1, "{body}: something was stored");
    }
    // The same message again is a duplicate, as before.
    let same = json!({"messages": [keyed("order-1", 1), message("a", "t.new")]});
    let reply = post(&app, "/v1/messages/batch", Some("all"), &same).await;
    assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
    assert_eq!(reply.body["messages"][0]["id"], first.body["id"]);
    assert_eq!(reply.body["messages"][0]["duplicate"], json!(true));
    assert_eq!(message_count(&app).await, 2);
    Ok(())
}

/// A daemon's `max_hold_days` bounds `available_at` below the store's
/// `MAX_HOLD`, for single and batch publish, naming the field and the bound;
/// nothing is stored on the refusal.
async fn publish_refuses_an_available_at_past_max_hold_days<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let config = courier_server::Config {
        max_hold_days: 7,
        ..courier_server::Config::default()
    };
    let app = courier_server::router(courier_server::ApiState::new(
        courier.store().clone(),
        &config,
    )?);
    let at = |days: i64| (chrono::Utc::now() + chrono::Duration::days(days)).to_rfc3339();
    let held = |days: i64| {
        let mut body = message("a", "t");
        body["available_at"] = json!(at(days));
        body
    };
    let refused = post(&app, "/v1/messages", None, &held(8)).await;
    assert_eq!(
        refused.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        refused.text
    );
    assert_eq!(
        refused.body["error"]["field"],
        json!("available_at"),
        "{}",
        refused.text
    );
    assert!(refused.text.contains("7 days"), "{}", refused.text);
    let batch = post(
        &app,
        "/v1/messages/batch",
        None,
        &json!({"messages": [held(1), held(8)]}),
    )
    .await;
    assert_eq!(
        batch.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "{}",
        batch.text
    );
    assert_eq!(
        batch.body["error"]["field"],
        json!("messages[1].available_at"),
        "{}",
        batch.text
    );
    assert_eq!(message_count(&app).await, 0);
    let accepted = post(&app, "/v1/messages", None, &held(6)).await;
    assert_eq!(accepted.status, StatusCode::CREATED, "{}", accepted.text);
    Ok(())
}

/// Every item of the list at `path` for `token`, walking pages of 2 by
/// `next_cursor`; with each page's whole body.
async fn walk(app: &axum::Router, path: &str, token: &str) -> (Vec<Value>, Vec<Value>) {
    let separator = if path.contains('?') { '&' } else { '?' };
    let mut items = Vec::new();
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..50 {
        let uri = match &cursor {
            Some(cursor) => format!("{path}{separator}limit=2&cursor={cursor}"),
            None => format!("{path}{separator}limit=2"),
        };
        let page = get(app, &uri, Some(token)).await;
        assert_eq!(page.status, StatusCode::OK, "{uri}: {}", page.text);
        let shown = page.body["items"].as_array().cloned().unwrap_or_default();
        assert!(shown.len() <= 2, "{uri}: {}", page.text);
        items.extend(shown);
        cursor = page.body["next_cursor"].as_str().map(str::to_owned);
        let last = cursor.is_none();
        pages.push(page.body);
        if last {
            return (items, pages);
        }
    }
    panic!("{path}: pagination does not end");
}

fn strings(items: &[Value], key: &str) -> Vec<String> {
    items
        .iter()
        .map(|item| item[key].as_str().unwrap_or_default().to_owned())
        .collect()
}

async fn every_list_walks_in_pages_of_two_each_item_once_in_order<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let store = courier.store().clone();
    let app = app(store.clone(), &standard_tokens(), LIMIT);
    for (name, topics) in [("audit", vec!["*"]), ("Zeta", vec!["order.placed"])] {
        store
            .register_subscription(&courier::SubscriptionSpec::new(name, topics))
            .await?;
    }
    let billing = refusing_worker(&courier, "billing", "invoice.paid").await?;
    for (tenant, topic, n) in [
        ("a", "invoice.paid", 4),
        ("b", "invoice.paid", 3),
        ("a", "order.placed", 2),
    ] {
        for _ in 0..n {
            let reply = post(&app, "/v1/messages", Some("all"), &message(tenant, topic)).await;
            assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
        }
    }
    assert_eq!(billing.run_once().await?, 7);

    // Messages: newest first, each once, the same order as one big page.
    let whole = get(&app, "/v1/messages?limit=500", Some("all")).await;
    let whole = whole.body["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(whole.len(), 9);
    let (walked, _) = walk(&app, "/v1/messages", "all").await;
    assert_eq!(strings(&walked, "id"), strings(&whole, "id"));
    let enqueued: Vec<(String, String)> = walked
        .iter()
        .map(|m| (m["enqueued_at"].to_string(), m["id"].to_string()))
        .collect();
    let times: Vec<chrono::DateTime<chrono::Utc>> = walked
        .iter()
        .filter_map(|m| m["enqueued_at"].as_str()?.parse().ok())
        .collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{enqueued:?}");
    let (mine, _) = walk(&app, "/v1/messages", "reader-a").await;
    assert_eq!(mine.len(), 6);
    assert!(strings(&mine, "tenant").iter().all(|t| t == "a"));

    // Dead letters: oldest first, each once; a scoped token sees its tenant's.
    let (dead, _) = walk(&app, "/v1/dead-letters", "all").await;
    let ids: Vec<i64> = dead.iter().filter_map(|d| d["id"].as_i64()).collect();
    let mut unique = ids.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!((ids.len(), unique.len()), (7, 7), "{ids:?}");
    let died: Vec<chrono::DateTime<chrono::Utc>> = dead
        .iter()
        .filter_map(|d| d["dead_at"].as_str()?.parse().ok())
        .collect();
    assert!(died.windows(2).all(|w| w[0] <= w[1]), "{died:?}");
    let (dead_a, _) = walk(&app, "/v1/dead-letters", "reader-a").await;
    assert_eq!(dead_a.len(), 4);
    assert!(strings(&dead_a, "tenant").iter().all(|t| t == "a"));

    // Subscriptions: by name in byte order.
    let (subscriptions, _) = walk(&app, "/v1/subscriptions", "reader-a").await;
    assert_eq!(
        strings(&subscriptions, "name"),
        ["Zeta", "audit", "billing"]
    );

    // Stats: rows by (subscription, topic); totals over every row on every page.
    let (rows, pages) = walk(&app, "/v1/stats", "all").await;
    let keys: Vec<(String, String)> = rows
        .iter()
        .map(|r| {
            (
                r["subscription"].as_str().unwrap_or_default().to_owned(),
                r["topic"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let pair = |s: &str, t: &str| (s.to_owned(), t.to_owned());
    assert_eq!(
        keys,
        [
            pair("Zeta", "order.placed"),
            pair("audit", "invoice.paid"),
            pair("audit", "order.placed"),
            pair("billing", "invoice.paid"),
        ]
    );
    assert_eq!(pages.len(), 2);
    for page in &pages {
        assert_eq!(
            (&page["available"], &page["dead"]),
            (&json!(2 + 9), &json!(7)),
            "{page}"
        );
    }
    let (rows_a, pages_a) = walk(&app, "/v1/stats", "reader-a").await;
    let sum = |key: &str| rows_a.iter().filter_map(|r| r[key].as_i64()).sum::<i64>();
    assert_eq!(pages_a[0]["available"], json!(sum("available")));
    assert_eq!(pages_a[0]["dead"], json!(sum("dead")));
    assert_eq!(sum("dead"), 4);
    Ok(())
}

async fn message_and_dead_letter_filters_narrow_and_a_ranged_dry_run_counts_only_them<S>(
    courier: Courier<S>,
) -> anyhow::Result<()>
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    let app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    let billing = refusing_worker(&courier, "billing", "invoice.paid").await?;
    let publish = |n: usize| {
        let app = app.clone();
        async move {
            let mut ids = Vec::new();
            for _ in 0..n {
                let reply = post(
                    &app,
                    "/v1/messages",
                    Some("all"),
                    &message("a", "invoice.paid"),
                )
                .await;
                assert_eq!(reply.status, StatusCode::CREATED, "{}", reply.text);
                ids.push(reply.body["id"].as_str().unwrap_or_default().to_owned());
            }
            ids
        }
    };
    let early = publish(2).await;
    assert_eq!(billing.run_once().await?, 2);
    // The database clock (milliseconds on SQLite) must move on between the
    // two batches for a time bound to fall between them.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let late = publish(3).await;
    assert_eq!(billing.run_once().await?, 3);

    let listed = |uri: String| {
        let app = app.clone();
        async move {
            let reply = get(&app, &uri, Some("all")).await;
            assert_eq!(reply.status, StatusCode::OK, "{uri}: {}", reply.text);
            reply.body["items"].as_array().cloned().unwrap_or_default()
        }
    };
    let sorted = |mut ids: Vec<String>| {
        ids.sort();
        ids
    };
    let messages = listed("/v1/messages?limit=500".into()).await;
    let first_late = messages
        .iter()
        .find(|m| m["id"].as_str() == late.first().map(String::as_str))
        .and_then(|m| m["enqueued_at"].as_str())
        .unwrap_or_default()
        .to_owned();
    let ids_of = |items: &[Value]| sorted(strings(items, "id"));
    assert_eq!(
        ids_of(&listed(format!("/v1/messages?message_id={}", early[1])).await),
        [early[1].clone()]
    );
    assert_eq!(
        ids_of(&listed(format!("/v1/messages?enqueued_after={first_late}")).await),
        sorted(late.clone())
    );
    assert_eq!(
        ids_of(&listed(format!("/v1/messages?enqueued_before={first_late}")).await),
        sorted(early.clone())
    );

    let dead = listed("/v1/dead-letters?limit=500".into()).await;
    let message_of = |items: &[Value]| sorted(strings(items, "message_id"));
    let first_late_death = dead
        .iter()
        .filter(|d| {
            late.iter()
                .any(|id| d["message_id"].as_str() == Some(id.as_str()))
        })
        .filter_map(|d| d["dead_at"].as_str())
        .min()
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        message_of(&listed(format!("/v1/dead-letters?message_id={}", late[2])).await),
        [late[2].clone()]
    );
    assert_eq!(
        message_of(&listed(format!("/v1/dead-letters?dead_after={first_late_death}")).await),
        sorted(late.clone())
    );
    assert_eq!(
        message_of(&listed(format!("/v1/dead-letters?dead_before={first_late_death}")).await),
        sorted(early.clone())
    );

    // A dry run over a time range counts and shows only that range.
    let dry = post(
        &app,
        "/v1/dead-letters/retry",
        Some("all"),
        &json!({"filter": {"dead_after": first_late_death}, "dry_run": true}),
    )
    .await;
    assert_eq!(dry.status, StatusCode::OK, "{}", dry.text);
    assert_eq!(dry.body["affected"], json!(3), "{}", dry.text);
    assert_eq!(
        dry.body["ids"].as_array().map(Vec::len),
        Some(3),
        "{}",
        dry.text
    );
    let dry = post(
        &app,
        "/v1/dead-letters/discard",
        Some("all"),
        &json!({"filter": {"message_id": early[0]}, "dry_run": true}),
    )
    .await;
    assert_eq!(dry.body["affected"], json!(1), "{}", dry.text);
    // And the real thing acts on the range only.
    let retried = post(
        &app,
        "/v1/dead-letters/retry",
        Some("all"),
        &json!({"filter": {"dead_before": first_late_death}}),
    )
    .await;
    assert_eq!(retried.body["affected"], json!(2), "{}", retried.text);
    let discarded = post(
        &app,
        "/v1/dead-letters/discard",
        Some("all"),
        &json!({"filter": {"message_id": late[0]}}),
    )
    .await;
    assert_eq!(discarded.body["affected"], json!(1), "{}", discarded.text);
    assert_eq!(
        message_of(&listed("/v1/dead-letters".into()).await),
        sorted(late[1..].to_vec())
    );
    Ok(())
}

api_tests!(
    every_list_walks_in_pages_of_two_each_item_once_in_order,
    message_and_dead_letter_filters_narrow_and_a_ranged_dry_run_counts_only_them,
    publish_refuses_an_available_at_past_max_hold_days,
    a_batch_reusing_a_key_for_another_message_stores_nothing,
    a_batch_is_refused_while_it_is_read,
    one_subscription_shows_its_state_and_its_backlog_by_tenant,
    a_message_s_detail_names_each_open_delivery_s_id,
    a_dry_run_changes_nothing_and_an_empty_filter_needs_all,
    a_scoped_retry_by_ids_is_one_store_call_and_leaves_other_tenants_alone,
    publish_stores_once_per_idempotency_key,
    batch_is_all_or_nothing,
    bad_input_names_the_field_and_stores_nothing,
    every_route_checks_token_role_and_tenant,
    dead_letters_and_subscriptions_are_managed,
    dead_letters_group_by_failure_per_token_and_a_group_is_retried_by_fingerprint,
);

#[test]
fn the_openapi_document_lists_every_route() {
    let document = serde_json::to_value(courier_server::openapi()).unwrap();
    assert!(document["openapi"]
        .as_str()
        .unwrap_or_default()
        .starts_with("3."));
    // It is a valid OpenAPI document as utoipa reads one back.
    let parsed: utoipa::openapi::OpenApi = serde_json::from_value(document.clone()).unwrap();
    assert!(!parsed.paths.paths.is_empty());
    let expected = [
        ("/v1/messages", "post"),
        ("/v1/messages", "get"),
        ("/v1/messages/batch", "post"),
        ("/v1/messages/{id}", "get"),
        ("/v1/messages/{id}/cancel", "post"),
        ("/v1/stats", "get"),
        ("/v1/throughput", "get"),
        ("/v1/session", "get"),
        ("/v1/session", "post"),
        ("/v1/session", "delete"),
        ("/v1/dead-letters", "get"),
        ("/v1/dead-letters/{id}", "get"),
        ("/v1/dead-letters/groups", "get"),
        ("/v1/dead-letters/retry", "post"),
        ("/v1/dead-letters/discard", "post"),
        ("/v1/subscriptions", "get"),
        ("/v1/subscriptions/{name}", "get"),
        ("/v1/subscriptions/{name}/pause", "post"),
        ("/v1/subscriptions/{name}/ping", "post"),
        ("/v1/subscriptions/{name}/resume", "post"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
        ("/v1/openapi.json", "get"),
        ("/v1/streams", "get"),
        ("/v1/streams/{tenant}/{stream}/entries", "post"),
        ("/v1/streams/{tenant}/{stream}/entries", "get"),
        ("/v1/streams/{tenant}/{stream}/trim", "post"),
        ("/v1/streams/{tenant}/{stream}/groups/{group}", "put"),
        ("/v1/streams/{tenant}/{stream}/groups/{group}/read", "post"),
        ("/v1/streams/{tenant}/{stream}/groups/{group}/ack", "post"),
        ("/v1/streams/{tenant}/{stream}/groups/{group}/claim", "post"),
        (
            "/v1/streams/{tenant}/{stream}/groups/{group}/pending",
            "get",
        ),
        (
            "/v1/streams/{tenant}/{stream}/groups/{group}/consumers",
            "get",
        ),
        (
            "/v1/streams/{tenant}/{stream}/groups/{group}/consumers/{consumer}",
            "delete",
        ),
    ];
    let mut listed = 0;
    for (path, operations) in document["paths"].as_object().unwrap() {
        for method in operations.as_object().unwrap().keys() {
            assert!(
                expected.contains(&(path.as_str(), method.as_str())),
                "undocumented in the test: {method} {path}"
            );
            listed += 1;
        }
    }
    for (path, method) in expected {
        assert!(
            document["paths"][path][method].is_object(),
            "{method} {path} missing"
        );
    }
    assert_eq!(listed, expected.len());
    assert!(document["components"]["schemas"]["PublishRequest"].is_object());
    assert!(document["components"]["securitySchemes"]["bearer"].is_object());
}

#[test]
fn the_openapi_document_lists_the_refusals_given_before_any_handler() {
    let document = serde_json::to_value(courier_server::openapi()).unwrap();
    let mut operations = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let responses = &operation["responses"];
            let mut expected = vec!["408", "431"];
            if !matches!(path.as_str(), "/healthz" | "/readyz") {
                expected.push("421");
            }
            if method != "get" {
                expected.push("415");
            }
            for status in expected {
                assert_eq!(
                    responses[status]["content"]["application/json"]["schema"]["$ref"],
                    json!("#/components/schemas/ErrorBody"),
                    "{method} {path} does not list {status}"
                );
            }
            operations += 1;
        }
    }
    assert!(operations > 20);
}

/// Every operation that takes a token may answer 429 (the tenant's request
/// rate, or the address's failed authentications), and says so: the modifier
/// that adds it once ran before the routes were merged, so none did.
#[test]
fn every_operation_that_takes_a_token_documents_429() {
    let document = serde_json::to_value(courier_server::openapi()).unwrap();
    let mut checked = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            if operation["responses"]["401"].is_null() {
                continue;
            }
            let limited = &operation["responses"]["429"];
            assert!(limited.is_object(), "{method} {path} does not document 429");
            assert!(
                limited["headers"]["Retry-After"].is_object(),
                "{method} {path}"
            );
            checked += 1;
        }
    }
    assert!(checked > 20, "{checked}");
}

/// A path or query parameter is checked before the handler runs, and a bad
/// one is 422 naming it: every operation taking one documents that 422 (the
/// fuzz run found it missing on `GET /v1/stats`, the consumer list and
/// pause/resume).
#[test]
fn every_operation_with_path_or_query_parameters_documents_422() {
    let document = serde_json::to_value(courier_server::openapi()).unwrap();
    let mut checked = 0;
    for (path, item) in document["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let takes_parameters = operation["parameters"]
                .as_array()
                .is_some_and(|all| all.iter().any(|p| p["in"] == "path" || p["in"] == "query"));
            if !takes_parameters {
                continue;
            }
            assert_eq!(
                operation["responses"]["422"]["content"]["application/json"]["schema"]["$ref"],
                json!("#/components/schemas/ErrorBody"),
                "{method} {path} does not document 422"
            );
            checked += 1;
        }
    }
    assert!(checked > 15, "{checked}");
}

/// A payload is any JSON value, and so is every schema of one (the fuzz run,
/// `scripts/fuzz-api`, found `GET /v1/messages` answering an array where the
/// document said object).
#[test]
fn every_payload_is_documented_as_any_json_value() {
    let document = serde_json::to_value(courier_server::openapi()).unwrap();
    let mut payloads = Vec::new();
    for (name, schema) in document["components"]["schemas"].as_object().unwrap() {
        if let Some(payload) = schema["properties"].get("payload") {
            let types = payload["type"].as_array().cloned().unwrap_or_default();
            for kind in ["object", "array", "string", "number", "boolean", "null"] {
                assert!(
                    types.contains(&json!(kind)),
                    "{name}.payload is documented as {payload}, without {kind}"
                );
            }
            payloads.push(name.clone());
        }
    }
    assert!(payloads.len() >= 6, "{payloads:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_shows_its_redacted_target_and_this_daemon_s_recent_outcomes() {
    use courier_server::config::{Config, Secret, SubscriptionConfig, TargetConfig, WebhookConfig};
    let fixture = courier_testkit::SqliteFixture::new().await.unwrap();
    let courier = courier_testkit::Backend::courier(&fixture).clone();
    // The subscription exists in the database (a worker registers it).
    let _worker = courier
        .worker("hooked-outcomes")
        .handle(
            "invoice.paid",
            1,
            handler_fn(|_message: courier::Message<Value>| async { Ok::<(), HandlerError>(()) }),
        )
        .build()
        .await
        .unwrap();
    let config = Config {
        subscriptions: vec![SubscriptionConfig::new(
            "hooked-outcomes",
            vec!["invoice.paid".into()],
            TargetConfig::Webhook(WebhookConfig {
                timeout_ms: 1_000,
                ..WebhookConfig::new(
                    "https://ops:hunter2@hooks.example/in?token=s3cret",
                    Secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into()),
                )
            }),
        )],
        ..Config::default()
    };
    let state = courier_server::ApiState::new(courier.store().clone(), &config).unwrap();
    let app = courier_server::router(state);
    let before = get(&app, "/v1/subscriptions/hooked-outcomes", None).await;
    assert_eq!(before.status, StatusCode::OK, "{}", before.text);
    assert_eq!(before.body["target"]["type"], json!("webhook"));
    let url = before.body["target"]["url"].as_str().unwrap_or_default();
    assert!(url.contains("hooks.example/in"), "{url}");
    for secret in ["hunter2", "s3cret", "whsec_", "MfKQ9r8"] {
        assert!(!before.text.contains(secret), "{secret}: {}", before.text);
    }
    assert_eq!(before.body["last_success_at"], Value::Null);
    assert_eq!(before.body["last_error"], Value::Null);
    assert_eq!(before.body["deliveries_5m"], json!(0));
    assert_eq!(before.body["failure_rate_5m"], Value::Null);

    // What the webhook handler and relays record for each delivery.
    let outcomes = courier_server::outcomes::global();
    outcomes.succeeded("hooked-outcomes");
    outcomes.failed(
        "hooked-outcomes",
        "the endpoint answered 503 Service Unavailable",
    );
    let after = get(&app, "/v1/subscriptions/hooked-outcomes", None).await;
    assert!(after.body["last_success_at"].is_string(), "{}", after.text);
    assert_eq!(
        after.body["last_error"]["message"],
        json!("the endpoint answered 503 Service Unavailable"),
        "{}",
        after.text
    );
    assert_eq!(after.body["deliveries_5m"], json!(2));
    assert_eq!(after.body["failure_rate_5m"], json!(0.5));
    drop(fixture);
}

#[tokio::test]
async fn the_served_document_is_the_generated_one_and_routers_share_one_recorder() {
    let fixture = courier_testkit::SqliteFixture::new().await.unwrap();
    let store = courier_testkit::Backend::courier(&fixture).store().clone();
    // Two routers in one process: the recorder is installed once and both work.
    let first = app(store.clone(), &[], LIMIT);
    let second = app(store, &[], LIMIT);
    let served = get(&first, "/v1/openapi.json", None).await;
    assert_eq!(
        served.body,
        serde_json::to_value(courier_server::openapi()).unwrap()
    );
    assert_eq!(get(&second, "/metrics", None).await.status, StatusCode::OK);
}

#[tokio::test]
async fn readiness_tells_only_admins_why_the_database_is_not_ready() {
    // A store whose database is down: nothing listens on port 1.
    let pool = sqlx::postgres::PgPoolOptions::new()
        .acquire_timeout(std::time::Duration::from_millis(300))
        .connect_lazy("postgres://courier-user@127.0.0.1:1/courier")
        .unwrap();
    let down = Courier::postgres_with_schema(pool, "courier").unwrap();
    let app = app(down.store().clone(), &standard_tokens(), LIMIT);
    for token in [
        None,
        Some("wrong-token"),
        Some("reader-a"),
        Some("publisher-a"),
    ] {
        let reply = get(&app, "/readyz", token).await;
        assert_eq!(
            reply.status,
            StatusCode::SERVICE_UNAVAILABLE,
            "{token:?}: {}",
            reply.text
        );
        assert_eq!(
            reply.body,
            json!({"status": "not_ready"}),
            "{token:?}: the public answer is the status only"
        );
        assert!(!reply.text.contains("127.0.0.1"), "{}", reply.text);
    }
    for token in ["admin-a", "admin-all"] {
        let reply = get(&app, "/readyz", Some(token)).await;
        assert_eq!(reply.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(reply.body["status"], json!("not_ready"), "{}", reply.text);
        assert!(
            reply.body["detail"]
                .as_str()
                .unwrap_or_default()
                .starts_with("the database is unreachable"),
            "{token}: {}",
            reply.text
        );
    }
}

/// `/readyz` tells an admin token how the database is doing: the oldest open
/// transaction (here one left open for over a second) and the dead rows of
/// Courier's tables; other callers get the status only. `/metrics` has the
/// same figures as gauges.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_shows_an_admin_the_oldest_transaction_and_dead_rows() -> anyhow::Result<()> {
    let fixture = courier_testkit::PgFixture::new().await?;
    let courier = courier_testkit::Backend::courier(&fixture).clone();
    let pg_app = app(courier.store().clone(), &standard_tokens(), LIMIT);
    let mut open = fixture.pool.begin().await?;
    sqlx::query("SELECT 1").execute(&mut *open).await?;
    tokio::time::sleep(std::time::Duration::from_millis(1_200)).await;

    let ready = get(&pg_app, "/readyz", Some("admin-all")).await;
    assert_eq!(ready.status, StatusCode::OK, "{}", ready.text);
    let oldest = ready.body["database"]["oldest_transaction_seconds"]
        .as_f64()
        .unwrap_or_default();
    assert!(oldest >= 1.0, "{}", ready.text);
    assert!(
        ready.body["database"]["dead_tuples"]["deliveries"].is_i64(),
        "{}",
        ready.text
    );
    for token in [None, Some("reader-a")] {
        let public = get(&pg_app, "/readyz", token).await;
        assert_eq!(public.body, json!({"status": "ready"}), "{token:?}");
    }
    let metrics = get(&pg_app, "/metrics", Some("admin-all")).await;
    assert!(
        metrics
            .text
            .contains("courier_database_oldest_transaction_seconds"),
        "{}",
        metrics.text
    );
    assert!(
        metrics
            .text
            .contains("courier_database_dead_tuples{table=\"deliveries\"}"),
        "{}",
        metrics.text
    );
    open.rollback().await?;

    // SQLite has neither figure, and says so with null and nothing.
    let sqlite = courier_testkit::SqliteFixture::new().await?;
    let lite = courier_testkit::Backend::courier(&sqlite).clone();
    let lite_app = app(lite.store().clone(), &standard_tokens(), LIMIT);
    let ready = get(&lite_app, "/readyz", Some("admin-all")).await;
    assert_eq!(
        ready.body,
        json!({"status": "ready", "database": {"oldest_transaction_seconds": null, "dead_tuples": {}}})
    );
    Ok(())
}
