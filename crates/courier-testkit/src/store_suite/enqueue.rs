//! Cases: migrations, and enqueueing — transactions, validation, idempotency,
//! large batches and the payload as stored.

use courier::{
    AdminStore, DeadLetterStore, EnqueueOutcome, OutboxStore, StoreError, SubscriptionSpec,
};
use uuid::Uuid;

use super::helpers::*;
use super::StoreFixture;

/// Migrating again changes nothing; a database migrated by a newer build is
/// refused with the version found and the one this build knows.
pub async fn migrating_twice_is_idempotent_and_a_newer_schema_is_refused<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    store.migrate().await?;
    let table = F::MIGRATIONS_TABLE;
    assert_eq!(
        fixture
            .scalar(&format!("SELECT count(*) FROM {table}"))
            .await?,
        F::SCHEMA_VERSION
    );
    fixture
        .execute(&format!(
            "INSERT INTO {table} (version, name) VALUES (999, 'future')"
        ))
        .await?;
    match store.migrate().await {
        Err(StoreError::SchemaTooNew { found: 999, known }) => {
            assert_eq!(known, F::SCHEMA_VERSION);
        }
        other => panic!("expected SchemaTooNew, got {other:?}"),
    }
    Ok(())
}

/// A producer's rolled-back transaction leaves neither message nor delivery;
/// a committed one leaves both.
pub async fn enqueue_in_a_rolled_back_transaction_leaves_no_message<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    subscribe(fixture.store(), "billing", &["invoice.created"]).await?;
    let outcomes = fixture
        .enqueue_in_transaction(&[message("acme", "invoice.created")?], false)
        .await?;
    assert!(!outcomes[0].duplicate);
    assert_eq!(fixture.scalar("SELECT count(*) FROM messages").await?, 0);
    assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 0);

    fixture
        .enqueue_in_transaction(&[message("acme", "invoice.created")?], true)
        .await?;
    assert_eq!(fixture.scalar("SELECT count(*) FROM messages").await?, 1);
    assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 1);
    Ok(())
}

/// One invalid message refuses the whole batch, naming the field; a topic
/// pattern other than `x`, `x.*` or `*` is refused.
pub async fn invalid_messages_store_nothing<F: StoreFixture>(fixture: F) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let good = message("acme", "a")?;
    let bad = message("acme", "b")?.with_schema_version(0);
    match store.publish_batch(&[good.clone(), bad]).await {
        Err(StoreError::Invalid(error)) => assert_eq!(error.field, "schema_version"),
        other => panic!("expected Invalid, got {other:?}"),
    }
    let no_key = message("acme", "b")?.with_ordering_key("");
    let refused = fixture.enqueue_in_transaction(&[good, no_key], true).await;
    assert!(refused.is_err(), "an empty ordering key was enqueued");
    assert_eq!(fixture.scalar("SELECT count(*) FROM messages").await?, 0);

    let refused = store
        .register_subscription(&SubscriptionSpec {
            name: "s".into(),
            topics: vec!["a*".into()],
            replay: None,
        })
        .await;
    assert!(
        matches!(refused, Err(StoreError::Invalid(_))),
        "{refused:?}"
    );
    Ok(())
}

/// The messages stored under (tenant, idempotency key) pairs are found by
/// those pairs, whole; a pair of another tenant, or with no message, finds
/// nothing.
pub async fn messages_are_found_by_their_idempotency_keys<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let k1 = message("acme", "t")?.with_idempotency_key("k1");
    let k2 = message("acme", "u")?.with_idempotency_key("k2");
    let other = message("globex", "t")?.with_idempotency_key("k1");
    store
        .publish_batch(&[k1.clone(), k2.clone(), other.clone(), message("acme", "t")?])
        .await?;
    let pair = |tenant: &str, key: &str| (tenant.to_owned(), key.to_owned());
    let mut found = store
        .messages_by_idempotency_keys(&[
            pair("acme", "k1"),
            pair("acme", "k2"),
            pair("acme", "missing"),
            pair("initech", "k1"),
        ])
        .await?;
    found.sort_by_key(|m| m.idempotency_key.clone());
    let ids: Vec<_> = found.iter().map(|m| m.id).collect();
    assert_eq!(ids, [k1.id, k2.id]);
    assert_eq!(found[1].topic, "u");
    assert_eq!(json(&found[0].payload)?, json(&k1.payload)?);
    assert!(store.messages_by_idempotency_keys(&[]).await?.is_empty());
    Ok(())
}

/// A message whose (tenant, idempotency key) is already stored is not stored
/// again: its outcome is the first message's id, marked duplicate, within a
/// batch as across batches; keys are per tenant.
pub async fn idempotent_enqueue_returns_the_first_id_and_stores_nothing<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let first = message("acme", "t")?.with_idempotency_key("k");
    let outcome = store.publish_batch(std::slice::from_ref(&first)).await?;
    assert_eq!(
        outcome,
        [EnqueueOutcome {
            id: first.id,
            duplicate: false
        }]
    );

    let again = message("acme", "t")?.with_idempotency_key("k");
    let outcome = store.publish_batch(&[again]).await?;
    assert_eq!(
        outcome,
        [EnqueueOutcome {
            id: first.id,
            duplicate: true
        }]
    );
    assert_eq!(fixture.scalar("SELECT count(*) FROM messages").await?, 1);
    assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 1);

    let l1 = message("acme", "t")?.with_idempotency_key("l");
    let l2 = message("acme", "t")?.with_idempotency_key("l");
    let k = message("acme", "t")?.with_idempotency_key("k");
    let unkeyed = message("acme", "t")?;
    let other_tenant = message("globex", "t")?.with_idempotency_key("k");
    let batch = [l1.clone(), l2, k, unkeyed.clone(), other_tenant.clone()];
    let outcomes = store.publish_batch(&batch).await?;
    let expected = [
        (l1.id, false),
        (l1.id, true),
        (first.id, true),
        (unkeyed.id, false),
        (other_tenant.id, false),
    ];
    let got: Vec<(Uuid, bool)> = outcomes.iter().map(|o| (o.id, o.duplicate)).collect();
    assert_eq!(got, expected);
    assert_eq!(fixture.scalar("SELECT count(*) FROM messages").await?, 4);
    assert_eq!(fixture.scalar("SELECT count(*) FROM deliveries").await?, 4);
    Ok(())
}

/// A batch larger than one statement takes is enqueued whole, its outcomes
/// and deliveries in input order, a duplicate inside it found.
pub async fn a_batch_beyond_one_statement_is_split_and_stays_in_order<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let mut batch = Vec::new();
    for index in 0..3100 {
        let mut m = message("acme", "t")?;
        if index == 0 || index == 3050 {
            m = m.with_idempotency_key("same");
        }
        batch.push(m);
    }
    let outcomes = store.publish_batch(&batch).await?;
    assert_eq!(outcomes.len(), 3100);
    assert_eq!(outcomes[3050].id, batch[0].id);
    assert!(outcomes[3050].duplicate);
    assert_eq!(fixture.scalar("SELECT count(*) FROM messages").await?, 3099);
    let order = fixture
        .texts("SELECT CAST(message_id AS TEXT) FROM deliveries ORDER BY id")
        .await?;
    let expected: Vec<String> = batch
        .iter()
        .enumerate()
        .filter(|(index, _)| *index != 3050)
        .map(|(_, m)| m.id.to_string())
        .collect();
    assert_eq!(order, expected);
    Ok(())
}

/// The payload comes back as the JSON the producer wrote: the same value
/// (PostgreSQL keeps it as `jsonb`, so its text may differ in spacing and key
/// order; SQLite keeps the text as written).
pub async fn the_payload_comes_back_as_the_json_the_producer_wrote<F: StoreFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    subscribe(store, "all", &["*"]).await?;
    let m = courier::NewMessage::from_json_text(
        "acme",
        "t",
        r#"{"n":1,"nested":{"b":[1,2.5,"x"],"a":null},"text":"é\n"}"#,
    )?;
    store.publish_batch(std::slice::from_ref(&m)).await?;
    let written: serde_json::Value = serde_json::from_str(&m.payload)?;
    let claimed = claim(store, &params("all", vec![route("t", 1, 10)], 10)).await?;
    let read: serde_json::Value = serde_json::from_str(&claimed[0].payload)?;
    assert_eq!(read, written, "the claim's payload");
    store
        .fail_many(&[failure(&claimed[0], "poison", None)])
        .await?;
    let letter = store
        .get_dead_letter(claimed[0].delivery_id)
        .await?
        .ok_or_else(|| anyhow::anyhow!("no dead letter"))?;
    let dead: serde_json::Value = serde_json::from_str(&letter.payload)?;
    assert_eq!(dead, written, "the dead letter's payload");
    Ok(())
}
