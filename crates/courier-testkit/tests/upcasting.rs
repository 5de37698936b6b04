//! Upcasting between schema versions, on PostgreSQL and SQLite: a handler of
//! a later version receives older messages through registered upcasters; a
//! version with no path to a handler waits for a worker that has one; a
//! failing upcaster dead-letters the message with the upcaster named.

use std::sync::{Arc, Mutex};

use courier::{handler_fn, DeadLetterStore, HandlerError, Message, NewMessage, RetryPolicy};
use courier_testkit::{backend_tests, Backend};
use serde_json::{json, Value};

const TOPIC: &str = "invoice.paid";

/// What a handler saw: (schema version, payload), in arrival order.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(i32, Value)>>>);

impl Seen {
    fn handler(&self) -> impl courier::Handler<Payload = Value> {
        let seen = self.clone();
        handler_fn(move |message: Message<Value>| {
            let seen = seen.clone();
            async move {
                if let Ok(mut all) = seen.0.lock() {
                    all.push((message.schema_version, message.payload));
                }
                Ok::<(), HandlerError>(())
            }
        })
    }

    fn sorted(&self) -> Vec<(i32, Value)> {
        let mut all = self.0.lock().map(|all| all.clone()).unwrap_or_default();
        all.sort_by_key(|(_, payload)| payload.to_string());
        all
    }
}

fn invoice(version: i32, payload: Value) -> anyhow::Result<NewMessage> {
    Ok(NewMessage::new("acme", TOPIC, &payload)?.with_schema_version(version))
}

/// v1 had `amount` in euros as a number; v2 has `amount_cents`.
fn v1_to_v2(old: Value) -> Result<Value, String> {
    let euros = old
        .get("amount")
        .and_then(Value::as_f64)
        .ok_or_else(|| "no number at amount".to_owned())?;
    Ok(json!({ "amount_cents": (euros * 100.0).round() as i64 }))
}

/// v3 adds the currency.
fn v2_to_v3(mut old: Value) -> Result<Value, String> {
    if let Some(fields) = old.as_object_mut() {
        fields.insert("currency".into(), json!("EUR"));
    }
    Ok(old)
}

async fn open_deliveries<B: Backend>(backend: &B, version: i32) -> anyhow::Result<i64> {
    backend
        .scalar(&format!(
            "SELECT count(*) FROM deliveries WHERE schema_version = {version} AND state <> 'dead'"
        ))
        .await
}

async fn v1_and_v2_messages_both_reach_one_v2_handler_and_a_v3_message_waits<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let seen = Seen::default();
    let worker = backend
        .courier()
        .worker("billing")
        .handle(TOPIC, 2, seen.handler())
        .upcast(TOPIC, 1, 2, v1_to_v2)
        .maintenance(None)
        .build()
        .await?;
    backend
        .enqueue_committed(&[
            invoice(1, json!({ "amount": 12.5 }))?,
            invoice(2, json!({ "amount_cents": 700 }))?,
            invoice(3, json!({ "amount_cents": 900, "currency": "USD" }))?,
        ])
        .await?;
    while worker.run_once().await? > 0 {}
    assert_eq!(
        seen.sorted(),
        [
            (2, json!({ "amount_cents": 1250 })),
            (2, json!({ "amount_cents": 700 })),
        ],
        "the v1 message reached the v2 handler upcast, the v2 one as it was"
    );
    assert_eq!(open_deliveries(&backend, 1).await?, 0);
    assert_eq!(open_deliveries(&backend, 2).await?, 0);
    assert_eq!(
        open_deliveries(&backend, 3).await?,
        1,
        "no handler and no upcasters lead from v3: it waits, unclaimed"
    );
    assert_eq!(
        backend
            .scalar("SELECT count(*) FROM deliveries WHERE schema_version = 3 AND attempts = 0")
            .await?,
        1,
        "the v3 message spent no attempt"
    );

    // A worker that knows v3 (after the deploy) takes it.
    let newer = Seen::default();
    let v3_worker = backend
        .courier()
        .worker("billing")
        .handle(TOPIC, 3, newer.handler())
        .upcast(TOPIC, 1, 2, v1_to_v2)
        .upcast(TOPIC, 2, 3, v2_to_v3)
        .maintenance(None)
        .build()
        .await?;
    while v3_worker.run_once().await? > 0 {}
    assert_eq!(
        newer.sorted(),
        [(3, json!({ "amount_cents": 900, "currency": "USD" }))]
    );
    assert_eq!(open_deliveries(&backend, 3).await?, 0);
    Ok(())
}

async fn chained_upcasters_bring_a_v1_message_to_a_v3_handler<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let seen = Seen::default();
    let worker = backend
        .courier()
        .worker("billing")
        .handle(TOPIC, 3, seen.handler())
        .upcast(TOPIC, 2, 3, v2_to_v3)
        .upcast(TOPIC, 1, 2, v1_to_v2)
        .maintenance(None)
        .build()
        .await?;
    backend
        .enqueue_committed(&[
            invoice(1, json!({ "amount": 3 }))?,
            invoice(2, json!({ "amount_cents": 40 }))?,
        ])
        .await?;
    while worker.run_once().await? > 0 {}
    assert_eq!(
        seen.sorted(),
        [
            (3, json!({ "amount_cents": 300, "currency": "EUR" })),
            (3, json!({ "amount_cents": 40, "currency": "EUR" })),
        ]
    );
    Ok(())
}

async fn a_failing_upcaster_dead_letters_the_message_and_names_the_upcaster<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let seen = Seen::default();
    let worker = backend
        .courier()
        .worker("billing")
        .handle(TOPIC, 2, seen.handler())
        .upcast(TOPIC, 1, 2, v1_to_v2)
        .retry_policy(RetryPolicy::with_max_attempts(5))
        .maintenance(None)
        .build()
        .await?;
    backend
        .enqueue_committed(&[invoice(1, json!({ "amount": "twelve" }))?])
        .await?;
    while worker.run_once().await? > 0 {}
    assert!(seen.sorted().is_empty(), "the handler never ran");
    let dead = backend
        .courier()
        .store()
        .list_dead_letters(&Default::default(), None, 10)
        .await?;
    assert_eq!(dead.items.len(), 1);
    let letter = &dead.items[0];
    assert_eq!(letter.attempts, 1, "a failing upcaster is permanent");
    let error = letter
        .errors
        .last()
        .map(|e| e.message.clone())
        .unwrap_or_default();
    assert!(
        error.contains("upcaster of invoice.paid v1 → v2 failed: no number at amount"),
        "{error}"
    );
    Ok(())
}

async fn upcasters_that_lead_nowhere_are_refused_before_anything_is_stored<B: Backend>(
    backend: B,
) -> anyhow::Result<()> {
    let refusal = |result: Result<courier::Worker<B::Store>, courier::EngineError>| match result {
        Ok(_) => "built".to_owned(),
        Err(error) => error.to_string(),
    };
    let backwards = backend
        .courier()
        .worker("billing")
        .handle(TOPIC, 1, Seen::default().handler())
        .upcast(TOPIC, 2, 1, v2_to_v3)
        .build()
        .await;
    assert!(
        refusal(backwards).contains("from a version ≥ 1 to a later one, not v2 → v1"),
        "an upcaster to an earlier version"
    );
    let dangling = backend
        .courier()
        .worker("billing")
        .handle(TOPIC, 3, Seen::default().handler())
        .upcast(TOPIC, 1, 2, v1_to_v2)
        .build()
        .await;
    assert!(
        refusal(dangling).contains("end at v2, which has no handler"),
        "a chain that stops short of a handler"
    );
    let twice = backend
        .courier()
        .worker("billing")
        .handle(TOPIC, 2, Seen::default().handler())
        .upcast(TOPIC, 1, 2, v1_to_v2)
        .upcast(TOPIC, 1, 2, v1_to_v2)
        .build()
        .await;
    assert!(
        refusal(twice).contains("two upcasters from version 1"),
        "two upcasters from one version"
    );
    assert_eq!(
        backend.scalar("SELECT count(*) FROM subscriptions").await?,
        0,
        "a refused worker registers nothing"
    );
    Ok(())
}

backend_tests!(
    v1_and_v2_messages_both_reach_one_v2_handler_and_a_v3_message_waits,
    chained_upcasters_bring_a_v1_message_to_a_v3_handler,
    a_failing_upcaster_dead_letters_the_message_and_names_the_upcaster,
    upcasters_that_lead_nowhere_are_refused_before_anything_is_stored,
);
