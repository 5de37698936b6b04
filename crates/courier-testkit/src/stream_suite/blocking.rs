//! Cases: reads that block until an entry arrives or their block ends.

use std::time::Duration;

use courier_core::{GroupStart, ReadNew, StreamStore};
use tokio::time::Instant;

use super::helpers::*;
use super::StreamFixture;

/// How long the appending task waits before it appends.
const APPEND_AFTER: Duration = Duration::from_millis(200);

/// The block of a read that an append should end early.
const LONG_BLOCK: Duration = Duration::from_secs(5);

/// "Well before the block": a woken read returns within this.
const WOKEN_WITHIN: Duration = Duration::from_secs(2);

fn blocking(group: &str, consumer: &str, block: Duration) -> ReadNew {
    ReadNew {
        block: Some(block),
        ..read(group, consumer, 10)
    }
}

/// Blocks a read on `reader` while `appender`, on another task, appends
/// after [`APPEND_AFTER`]; checks that the read returns that entry, having
/// waited for it, well before its block ends.
async fn wakes_on_append<S: StreamStore>(
    reader: &S,
    appender: S,
    stream: &str,
) -> anyhow::Result<()> {
    let key = key(stream)?;
    assert!(reader.ensure_group(&key, "g", GroupStart::End).await?);
    let append = {
        let key = key.clone();
        tokio::spawn(async move {
            tokio::time::sleep(APPEND_AFTER).await;
            appender.append(&key, &[entry(7)]).await
        })
    };
    let started = Instant::now();
    let read = reader
        .read_new(&key, &blocking("g", "c1", LONG_BLOCK))
        .await?;
    let waited = started.elapsed();
    let appended = append.await??;
    assert_eq!(ids(&read), appended, "the read returns the appended entry");
    assert_eq!(deliveries(&read), vec![1]);
    assert!(
        waited >= APPEND_AFTER - Duration::from_millis(50),
        "returned after {waited:?}, before anything was appended"
    );
    assert!(
        waited < WOKEN_WITHIN,
        "returned after {waited:?}: not woken by the append"
    );
    Ok(())
}

/// A read blocked on an empty group returns the entry another task of the
/// same process appends through the same store, as soon as it is appended.
pub async fn a_blocked_read_wakes_when_another_task_appends<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    wakes_on_append(store, store.clone(), "blocked-read-same-store").await
}

/// A read blocked on an empty group returns the entry another process (a
/// store of its own) appends, well before its block ends.
pub async fn a_blocked_read_wakes_when_another_process_appends<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let other = fixture.open_store().await?;
    wakes_on_append(fixture.store(), other, "blocked-read-other-store").await
}

/// A blocked read with nothing to read returns empty once its block is over,
/// not before and not much later; a read without a block returns at once.
pub async fn a_blocked_read_with_nothing_to_read_returns_empty_after_its_block<F: StreamFixture>(
    fixture: F,
) -> anyhow::Result<()> {
    let store = fixture.store();
    let key = key("blocked-read-empty")?;
    append_numbered(store, &key, 0, 2).await?;
    assert!(store.ensure_group(&key, "g", GroupStart::End).await?);

    let block = Duration::from_millis(500);
    let started = Instant::now();
    let read = store.read_new(&key, &blocking("g", "c1", block)).await?;
    let waited = started.elapsed();
    assert!(read.is_empty(), "read {read:?}");
    assert!(
        waited >= block - Duration::from_millis(50),
        "returned after {waited:?} of a {block:?} block"
    );
    assert!(
        waited < block + Duration::from_secs(2),
        "returned after {waited:?} of a {block:?} block"
    );

    let started = Instant::now();
    assert!(read_new(store, &key, "g", "c1", 10).await?.is_empty());
    assert!(started.elapsed() < Duration::from_secs(2));
    Ok(())
}
