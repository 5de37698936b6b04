//! What only the SQLite stream store does: entry ids are AUTOINCREMENT rowids
//! (`n-0`), a relayed message may be appended twice (the origin index is not
//! unique), and an entry's rows are plain, readable SQL. Every promise of
//! the `StreamStore` trait is in the stream conformance suite
//! (courier-testkit's `stream_suite`, run by its `tests/streams.rs`).

use std::error::Error;

use courier_core::{
    EntryOrigin, GroupStart, NewStreamEntry, ReadNew, StreamEntryId, StreamKey, StreamStore,
};
use courier_sqlite::{connect, SqliteStore};
use tempfile::TempDir;
use uuid::Uuid;

type TestResult<T = ()> = Result<T, Box<dyn Error + Send + Sync>>;

async fn fresh() -> TestResult<(SqliteStore, TempDir)> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("courier.db");
    let store = SqliteStore::new(connect(path.to_str().ok_or("path is not UTF-8")?, 4).await?);
    courier_core::OutboxStore::migrate(&store).await?;
    Ok((store, dir))
}

#[tokio::test]
async fn entry_ids_are_rowids_and_are_never_reused_across_streams_or_trims() -> TestResult {
    let (store, _dir) = fresh().await?;
    let orders = StreamKey::new("acme", "orders")?;
    let invoices = StreamKey::new("acme", "invoices")?;
    let first = store
        .append(&orders, &[NewStreamEntry::new(serde_json::json!({"n": 1}))])
        .await?;
    assert_eq!(first, vec![StreamEntryId::new(1, 0)]);
    let other = store
        .append(
            &invoices,
            &[NewStreamEntry::new(serde_json::json!({"n": 2}))],
        )
        .await?;
    assert_eq!(other, vec![StreamEntryId::new(2, 0)]);
    store
        .trim(&invoices, courier_core::TrimBound::MaxLen(0))
        .await?;
    let after_trim = store
        .append(
            &invoices,
            &[NewStreamEntry::new(serde_json::json!({"n": 3}))],
        )
        .await?;
    assert_eq!(after_trim, vec![StreamEntryId::new(3, 0)]);
    let stored: String = sqlx::query_scalar("SELECT payload FROM stream_entries WHERE id = 3")
        .fetch_one(store.pool())
        .await?;
    assert_eq!(stored, r#"{"n":3}"#);
    Ok(())
}

#[tokio::test]
async fn a_relayed_message_appended_twice_is_stored_twice() -> TestResult {
    let (store, _dir) = fresh().await?;
    let key = StreamKey::new("acme", "orders")?;
    let mut relayed = NewStreamEntry::new(serde_json::json!({"n": 1}));
    relayed.origin = Some(EntryOrigin {
        message_id: Uuid::new_v4(),
        tenant: "acme".into(),
        topic: "orders.created".into(),
        schema_version: 1,
    });
    let ids = store
        .append(&key, &[relayed.clone(), relayed.clone()])
        .await?;
    assert_eq!(ids.len(), 2);
    assert!(store.ensure_group(&key, "g", GroupStart::Beginning).await?);
    let read = store
        .read_new(
            &key,
            &ReadNew {
                group: "g".into(),
                consumer: "c".into(),
                count: 10,
                block: None,
            },
        )
        .await?;
    assert_eq!(read.len(), 2);
    assert!(read.iter().all(|d| d.entry.origin == relayed.origin));
    Ok(())
}
