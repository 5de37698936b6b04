//! [`DeadLetterStore`] for PostgreSQL: list, inspect, retry and discard.

use chrono::{DateTime, Utc};
use courier_core::{
    DeadLetter, DeadLetterFilter, DeadLetterGroup, DeadLetterKey, DeadLetterPage, DeadLetterStore,
    DeliverySummary, StoreError, MAX_DEAD_LETTER_GROUPS,
};
use sqlx::Row;
use uuid::Uuid;

use crate::error::map;
use crate::rows::{dead_letter_from_row, parse_errors};
use crate::PgStore;

impl DeadLetterStore for PgStore {
    async fn list_dead_letters<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
        after: Option<DeadLetterKey>,
        limit: usize,
    ) -> Result<DeadLetterPage, StoreError> {
        filter.validate()?;
        let message_dead_at = match filter.message_id {
            None => None,
            Some(id) => {
                let row = sqlx::query(&self.q().message_dead_at_range)
                    .bind(id)
                    .fetch_one(&self.inner.pool)
                    .await
                    .map_err(map)?;
                let oldest: Option<DateTime<Utc>> = row.try_get("oldest").map_err(map)?;
                let newest: Option<DateTime<Utc>> = row.try_get("newest").map_err(map)?;
                let Some(range) = oldest.zip(newest) else {
                    return Ok(DeadLetterPage::default());
                };
                Some(range)
            }
        };
        let (start, end) = filter.scan_bounds(after, message_dead_at);
        let limit = limit.clamp(1, 1000);
        let rows = sqlx::query(&self.q().dead_letters_list)
            .bind(&filter.tenant)
            .bind(&filter.topic)
            .bind(&filter.subscription)
            .bind(filter.message_id)
            .bind(end)
            .bind(start.map(|key| key.dead_at))
            .bind(start.map(|key| key.delivery_id))
            .bind(i64::try_from(limit + 1).unwrap_or(i64::MAX))
            .bind(&filter.fingerprint)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        let mut items = rows
            .iter()
            .map(dead_letter_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if items.len() > limit {
            items.truncate(limit);
            items.last().map(dead_letter_key).transpose()?
        } else {
            None
        };
        Ok(DeadLetterPage { items, next_cursor })
    }

    async fn count_dead_letters<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        filter.validate()?;
        let count: i64 = sqlx::query_scalar(&self.q().dead_letters_count)
            .bind(&filter.tenant)
            .bind(&filter.topic)
            .bind(&filter.subscription)
            .bind(filter.message_id)
            .bind(filter.dead_after)
            .bind(filter.dead_before)
            .bind(&filter.fingerprint)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    async fn dead_letter_groups<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
        limit: usize,
    ) -> Result<Vec<DeadLetterGroup>, StoreError> {
        filter.validate()?;
        let limit = limit.clamp(1, MAX_DEAD_LETTER_GROUPS);
        let rows = sqlx::query(&self.q().dead_letter_groups)
            .bind(&filter.tenant)
            .bind(&filter.topic)
            .bind(&filter.subscription)
            .bind(filter.message_id)
            .bind(filter.dead_after)
            .bind(filter.dead_before)
            .bind(&filter.fingerprint)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        rows.iter()
            .map(|row| {
                let count: i64 = row.try_get("dead").map_err(map)?;
                Ok(DeadLetterGroup {
                    fingerprint: row.try_get("fingerprint").map_err(map)?,
                    sample_error: row.try_get("sample_error").map_err(map)?,
                    count: u64::try_from(count).unwrap_or(0),
                    first_seen: row.try_get("first_seen").map_err(map)?,
                    last_seen: row.try_get("last_seen").map_err(map)?,
                    subscriptions: row.try_get("subscriptions").map_err(map)?,
                    topics: row.try_get("topics").map_err(map)?,
                })
            })
            .collect()
    }

    async fn get_dead_letter(&self, delivery_id: i64) -> Result<Option<DeadLetter>, StoreError> {
        let row = sqlx::query(&self.q().dead_letter_get)
            .bind(delivery_id)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(map)?;
        row.as_ref().map(dead_letter_from_row).transpose()
    }

    async fn retry_dead_letters<'c>(&'c self, ids: &'c [i64]) -> Result<u64, StoreError> {
        self.select_dead_letters(
            &self.q().dead_letters_retry,
            Some(ids),
            &DeadLetterFilter::default(),
            None,
        )
        .await
    }

    async fn retry_tenants_dead_letters<'c>(
        &'c self,
        ids: &'c [i64],
        tenants: &'c [String],
    ) -> Result<u64, StoreError> {
        self.select_dead_letters(
            &self.q().dead_letters_retry,
            Some(ids),
            &DeadLetterFilter::default(),
            Some(tenants),
        )
        .await
    }

    async fn retry_dead_letters_matching<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        filter.validate()?;
        self.select_dead_letters(&self.q().dead_letters_retry, None, filter, None)
            .await
    }

    async fn discard_dead_letters<'c>(&'c self, ids: &'c [i64]) -> Result<u64, StoreError> {
        self.select_dead_letters(
            &self.q().dead_letters_discard,
            Some(ids),
            &DeadLetterFilter::default(),
            None,
        )
        .await
    }

    async fn discard_tenants_dead_letters<'c>(
        &'c self,
        ids: &'c [i64],
        tenants: &'c [String],
    ) -> Result<u64, StoreError> {
        self.select_dead_letters(
            &self.q().dead_letters_discard,
            Some(ids),
            &DeadLetterFilter::default(),
            Some(tenants),
        )
        .await
    }

    async fn discard_dead_letters_matching<'c>(
        &'c self,
        filter: &'c DeadLetterFilter,
    ) -> Result<u64, StoreError> {
        filter.validate()?;
        self.select_dead_letters(&self.q().dead_letters_discard, None, filter, None)
            .await
    }

    async fn message_deliveries(
        &self,
        message_id: Uuid,
    ) -> Result<Vec<DeliverySummary>, StoreError> {
        let rows = sqlx::query(&self.q().message_deliveries)
            .bind(message_id)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        rows.iter()
            .map(|row| {
                let errors: String = row.try_get("errors").map_err(map)?;
                Ok(DeliverySummary {
                    subscription: row.try_get("subscription").map_err(map)?,
                    delivery_id: row.try_get("delivery_id").map_err(map)?,
                    state: row.try_get("state").map_err(map)?,
                    attempts: row
                        .try_get::<Option<i32>, _>("attempts")
                        .map_err(map)?
                        .unwrap_or(0),
                    errors: parse_errors(&errors)?,
                })
            })
            .collect()
    }
}

impl PgStore {
    /// Runs a dead-letter retry or discard selected by `ids` or, when `ids` is
    /// `None`, by `filter`; with `tenants`, only those tenants' dead letters.
    async fn select_dead_letters(
        &self,
        sql: &str,
        ids: Option<&[i64]>,
        filter: &DeadLetterFilter,
        tenants: Option<&[String]>,
    ) -> Result<u64, StoreError> {
        // fetch_all, not fetch_one: a writing statement's portal must run to
        // its end, or the pooled connection keeps its transaction open.
        let counts: Vec<i64> = sqlx::query_scalar(sql)
            .bind(ids)
            .bind(&filter.tenant)
            .bind(&filter.topic)
            .bind(&filter.subscription)
            .bind(tenants)
            .bind(filter.message_id)
            .bind(filter.dead_after)
            .bind(filter.dead_before)
            .bind(&filter.fingerprint)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(counts.first().map_or(0, |&n| u64::try_from(n).unwrap_or(0)))
    }
}

/// The listing key of a dead letter of `dead_letters_list.sql`, which lists
/// only rows with a `dead_at`.
fn dead_letter_key(dead: &DeadLetter) -> Result<DeadLetterKey, StoreError> {
    let dead_at = dead.dead_at.ok_or_else(|| {
        StoreError::Corrupt(format!("dead letter {} has no dead_at", dead.delivery_id))
    })?;
    Ok(DeadLetterKey {
        dead_at,
        delivery_id: dead.delivery_id,
    })
}
