//! [`StreamReceipts`] for PostgreSQL.
//!
//! A transactional handler's receipt is a row of `stream_receipts`, written
//! in its effect's transaction. A plain handler's receipts are written after
//! its batch's effects, and a batch of entries of one stream is stored as
//! runs of `stream_receipt_runs` (migration 0017): one row per run instead of
//! one per entry. Correlation ids not of the form
//! `{subscription}:{stream}:{id}` (the engine writes none) are rows of
//! `stream_receipts` too. A lookup or a write is cut into parts as a batch
//! is cut into runs ([`parts`]); each part's lookup, and each part's write
//! by `record_stream_receipts`, consults both tables in one statement;
//! `record_new_stream_receipts` (ids the caller looked up and found no
//! receipt of) writes each run as one plain insert.

use std::collections::{BTreeMap, HashSet};

use courier_core::{ReceiptOutcome, StoreError, StreamEntryId, StreamReceipts, TxWork};
use sqlx::PgConnection;

use crate::error::map;
use crate::PgStore;

/// The most majors one run spans (`last_major - first_major`; migration
/// 0017 relies on it to bound a lookup).
const RUN_SPAN: u64 = 1000;

/// The most entries one run holds.
const RUN_LEN: usize = 1000;

/// A major or minor as stored: the sign bit flipped, so that the order of
/// the stored values is the order of the ids.
fn stored(value: u64) -> i64 {
    i64::from_be_bytes((value ^ (1 << 63)).to_be_bytes())
}

/// The ids of one stream among a call's correlation ids, each with its
/// correlation id, and the correlation ids of no stream.
#[derive(Default)]
struct Grouped<'a> {
    streams: BTreeMap<&'a str, Vec<(StreamEntryId, &'a str)>>,
    others: Vec<&'a str>,
}

/// Sorts `correlation_ids` by stream; an id that is not exactly
/// `{subscription}:{stream}:{entry id}` (the entry id as it prints) is one
/// of the others.
fn group<'a>(subscription: &str, correlation_ids: &'a [String]) -> Grouped<'a> {
    let mut grouped = Grouped::default();
    for correlation_id in correlation_ids {
        match parse(subscription, correlation_id) {
            Some((stream, id)) => grouped
                .streams
                .entry(stream)
                .or_default()
                .push((id, correlation_id.as_str())),
            None => grouped.others.push(correlation_id),
        }
    }
    grouped
}

fn parse<'a>(subscription: &str, correlation_id: &'a str) -> Option<(&'a str, StreamEntryId)> {
    let rest = correlation_id
        .strip_prefix(subscription)?
        .strip_prefix(':')?;
    let (stream, id_text) = rest.rsplit_once(':')?;
    let id: StreamEntryId = id_text.parse().ok()?;
    // As the id prints: parsed, it is digits only; no leading zeros.
    let (major, minor) = id_text.split_once('-')?;
    let canonical = |part: &str| part == "0" || !part.starts_with('0');
    (!stream.is_empty() && canonical(major) && canonical(minor)).then_some((stream, id))
}

/// `ids` (sorted by id) cut into parts that each span at most [`RUN_SPAN`]
/// majors and hold at most [`RUN_LEN`] ids: the runs a batch is written as,
/// and the parts a lookup probes one at a time (so ids far apart never make
/// a lookup read the runs between them).
fn parts<'i, 'a>(ids: &'i [(StreamEntryId, &'a str)]) -> Vec<&'i [(StreamEntryId, &'a str)]> {
    let mut parts = Vec::new();
    let mut start = 0;
    for (index, (id, _)) in ids.iter().enumerate() {
        let first = ids[start].0.major;
        if index > start && (id.major - first > RUN_SPAN || index - start >= RUN_LEN) {
            parts.push(&ids[start..index]);
            start = index;
        }
    }
    if start < ids.len() {
        parts.push(&ids[start..]);
    }
    parts
}

/// Whether a write leaves out the receipts already stored.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Looks for them first: nothing is stored twice, and the count is of
    /// new receipts.
    Checked,
    /// Writes them all (the caller found none): cheaper, and a receipt
    /// recorded meanwhile may be stored twice.
    Unchecked,
}

/// One part's ids as a lookup or insert binds them: majors, minors and
/// correlation ids in parallel, and the bounds of the runs that may hold
/// them (a last major between the lowest major and the highest plus
/// [`RUN_SPAN`], a first major at most the highest).
struct Columns<'a> {
    majors: Vec<i64>,
    minors: Vec<i64>,
    texts: Vec<&'a str>,
    lowest: i64,
    last_bound: i64,
    highest: i64,
}

impl<'a> Columns<'a> {
    fn new(ids: &[(StreamEntryId, &'a str)]) -> Self {
        let lowest = ids.iter().map(|(id, _)| id.major).min().unwrap_or(0);
        let highest = ids.iter().map(|(id, _)| id.major).max().unwrap_or(0);
        Self {
            majors: ids.iter().map(|(id, _)| stored(id.major)).collect(),
            minors: ids.iter().map(|(id, _)| stored(id.minor)).collect(),
            texts: ids.iter().map(|(_, text)| *text).collect(),
            lowest: stored(lowest),
            last_bound: stored(highest.saturating_add(RUN_SPAN)),
            highest: stored(highest),
        }
    }
}

impl PgStore {
    /// Which of one part of a stream's ids (see [`parts`]) have a receipt of
    /// `subscription`.
    async fn find_on_stream(
        &self,
        subscription: &str,
        stream: &str,
        ids: &[(StreamEntryId, &str)],
        found: &mut HashSet<String>,
    ) -> Result<(), StoreError> {
        let c = Columns::new(ids);
        let rows: Vec<(Option<String>, Option<i64>)> =
            sqlx::query_as(&self.q().stream_receipt_runs_find)
                .bind(subscription)
                .bind(stream)
                .bind(&c.majors)
                .bind(&c.minors)
                .bind(c.lowest)
                .bind(c.last_bound)
                .bind(c.highest)
                .bind(&c.texts)
                .fetch_all(self.pool())
                .await
                .map_err(map)?;
        for row in rows {
            match row {
                (Some(correlation_id), _) => {
                    found.insert(correlation_id);
                }
                (None, Some(position)) => {
                    // 1-based, as WITH ORDINALITY counts.
                    let index = usize::try_from(position - 1).unwrap_or(usize::MAX);
                    if let Some((_, text)) = ids.get(index) {
                        found.insert((*text).to_owned());
                    }
                }
                (None, None) => {}
            }
        }
        Ok(())
    }

    /// Writes the receipts of one run of a stream's ids (a part, see
    /// [`parts`]) as one row; returns how many were new (with
    /// [`Check::Unchecked`], how many were written).
    async fn record_run(
        &self,
        conn: &mut PgConnection,
        subscription: &str,
        stream: &str,
        ids: &[(StreamEntryId, &str)],
        check: Check,
    ) -> Result<u64, StoreError> {
        let c = Columns::new(ids);
        if check == Check::Unchecked {
            sqlx::query(&self.q().stream_receipt_runs_append)
                .bind(subscription)
                .bind(stream)
                .bind(&c.majors)
                .bind(&c.minors)
                .execute(&mut *conn)
                .await
                .map_err(map)?;
            return Ok(ids.len() as u64);
        }
        let added: i64 = sqlx::query_scalar(&self.q().stream_receipt_runs_insert)
            .bind(subscription)
            .bind(stream)
            .bind(&c.majors)
            .bind(&c.minors)
            .bind(c.lowest)
            .bind(c.last_bound)
            .bind(c.highest)
            .bind(&c.texts)
            .fetch_one(&mut *conn)
            .await
            .map_err(map)?;
        Ok(u64::try_from(added).unwrap_or(0))
    }

    /// Writes receipts of correlation ids of no stream, one row each;
    /// returns how many were new.
    async fn record_others(
        &self,
        conn: &mut PgConnection,
        subscription: &str,
        others: &[&str],
    ) -> Result<u64, StoreError> {
        let added: i64 = sqlx::query_scalar(&self.q().stream_receipts_insert_many)
            .bind(subscription)
            .bind(others)
            .fetch_one(&mut *conn)
            .await
            .map_err(map)?;
        Ok(u64::try_from(added).unwrap_or(0))
    }

    /// Writes receipts of `subscription` for `correlation_ids` in one
    /// transaction; returns how many were new (with [`Check::Unchecked`],
    /// how many were written).
    async fn record(
        &self,
        subscription: &str,
        correlation_ids: &[String],
        check: Check,
    ) -> Result<u64, StoreError> {
        let mut grouped = group(subscription, correlation_ids);
        for ids in grouped.streams.values_mut() {
            ids.sort_unstable();
            ids.dedup();
        }
        grouped.others.sort_unstable();
        grouped.others.dedup();
        let statements = grouped
            .streams
            .values()
            .map(|ids| parts(ids).len())
            .sum::<usize>()
            + usize::from(!grouped.others.is_empty());
        match statements {
            0 => Ok(0),
            1 => {
                let mut conn = self.pool().acquire().await.map_err(map)?;
                self.record_grouped(&mut conn, subscription, &grouped, check)
                    .await
            }
            _ => {
                // All or nothing: one transaction.
                let mut tx = self.begin_read_committed().await?;
                let added = self
                    .record_grouped(&mut tx, subscription, &grouped, check)
                    .await?;
                tx.commit().await.map_err(map)?;
                Ok(added)
            }
        }
    }

    /// Writes everything `grouped` holds through `conn`; returns how many
    /// receipts were new.
    async fn record_grouped(
        &self,
        conn: &mut PgConnection,
        subscription: &str,
        grouped: &Grouped<'_>,
        check: Check,
    ) -> Result<u64, StoreError> {
        let mut added = 0;
        for (stream, ids) in &grouped.streams {
            for run in parts(ids) {
                added += self
                    .record_run(conn, subscription, stream, run, check)
                    .await?;
            }
        }
        if !grouped.others.is_empty() {
            added += self
                .record_others(conn, subscription, &grouped.others)
                .await?;
        }
        Ok(added)
    }
}

impl StreamReceipts for PgStore {
    type Connection = sqlx::PgConnection;

    async fn find_stream_receipts<'c>(
        &'c self,
        subscription: &'c str,
        correlation_ids: &'c [String],
    ) -> Result<Vec<String>, StoreError> {
        let mut grouped = group(subscription, correlation_ids);
        let mut found = HashSet::new();
        for (stream, ids) in &mut grouped.streams {
            ids.sort_unstable();
            for part in parts(ids) {
                self.find_on_stream(subscription, stream, part, &mut found)
                    .await?;
            }
        }
        if !grouped.others.is_empty() {
            let rows: Vec<String> = sqlx::query_scalar(&self.q().stream_receipts_find)
                .bind(subscription)
                .bind(&grouped.others)
                .fetch_all(self.pool())
                .await
                .map_err(map)?;
            found.extend(rows);
        }
        Ok(found.into_iter().collect())
    }

    async fn record_stream_receipts<'c>(
        &'c self,
        subscription: &'c str,
        correlation_ids: &'c [String],
    ) -> Result<u64, StoreError> {
        self.record(subscription, correlation_ids, Check::Checked)
            .await
    }

    async fn record_new_stream_receipts<'c>(
        &'c self,
        subscription: &'c str,
        correlation_ids: &'c [String],
    ) -> Result<(), StoreError> {
        self.record(subscription, correlation_ids, Check::Unchecked)
            .await
            .map(|_| ())
    }

    async fn run_with_stream_receipt<'c>(
        &'c self,
        subscription: &'c str,
        correlation_id: &'c str,
        work: TxWork<sqlx::PgConnection>,
    ) -> Result<ReceiptOutcome, StoreError> {
        let entry = parse(subscription, correlation_id);
        let (major, minor) = entry.map_or((0, 0), |(_, id)| (id.major, id.minor));
        let mut tx = self.begin_read_committed().await?;
        let rows = sqlx::query(&self.q().stream_receipt_insert)
            .bind(subscription)
            .bind(correlation_id)
            .bind(entry.map(|(stream, _)| stream))
            .bind(stored(major))
            .bind(stored(minor))
            .bind(stored(major.saturating_add(RUN_SPAN)))
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?;
        if rows.is_empty() {
            tx.rollback().await.map_err(map)?;
            return Ok(ReceiptOutcome::AlreadyApplied);
        }
        match work(&mut tx).await {
            Ok(()) => {
                tx.commit().await.map_err(map)?;
                Ok(ReceiptOutcome::Applied)
            }
            Err(error) => {
                tx.rollback().await.map_err(map)?;
                Ok(ReceiptOutcome::Failed(error))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_ids_keep_their_order() {
        let values = [0, 1, 1_700_000_000_000, i64::MAX as u64, 1 << 63, u64::MAX];
        for pair in values.windows(2) {
            assert!(stored(pair[0]) < stored(pair[1]), "{pair:?}");
        }
    }

    #[test]
    fn parts_span_at_most_the_run_span_and_hold_at_most_the_run_length() {
        let mut ids: Vec<(StreamEntryId, &str)> = Vec::new();
        // 1,500 ids on one major, then majors 5,000 and 5,000 + RUN_SPAN
        // (one part), then one past the span, then one an hour away.
        ids.extend((0..1_500).map(|minor| (StreamEntryId::new(7, minor), "")));
        for major in [5_000, 5_000 + RUN_SPAN, 5_001 + RUN_SPAN, 3_600_000] {
            ids.push((StreamEntryId::new(major, 0), ""));
        }
        let sizes: Vec<usize> = parts(&ids).iter().map(|part| part.len()).collect();
        assert_eq!(sizes, [1_000, 500, 2, 1, 1]);
        assert!(parts(&[]).is_empty());
    }

    #[test]
    fn only_canonical_correlation_ids_of_the_subscription_have_a_stream() {
        let id = StreamEntryId::new(5, 0);
        assert_eq!(parse("sub", "sub:orders:5-0"), Some(("orders", id)));
        // A raw Redis key may hold colons; the entry id never does.
        assert_eq!(parse("sub", "sub:a:b:5-0"), Some(("a:b", id)));
        for other in [
            "sub:orders:05-0",
            "sub:orders:5-00",
            "sub:orders:+5-0",
            "sub:orders:5",
            "subx:orders:5-0",
            "sub::5-0",
            "other",
        ] {
            assert_eq!(parse("sub", other), None, "{other}");
        }
    }
}
