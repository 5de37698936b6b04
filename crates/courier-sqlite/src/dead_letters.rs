//! [`DeadLetterStore`] for SQLite: list, inspect, retry and discard.

use courier_core::{
    DeadLetter, DeadLetterFilter, DeadLetterGroup, DeadLetterKey, DeadLetterPage, DeadLetterStore,
    DeliverySummary, StoreError, MAX_DEAD_LETTER_GROUPS,
};
use serde_json::Value;
use uuid::Uuid;

use crate::error::map;
use crate::rows::{self, get, millis_ceil};
use crate::{queries, SqliteStore};

/// The most dead letters one page holds.
pub const MAX_DEAD_LETTER_PAGE: usize = 1000;

impl DeadLetterStore for SqliteStore {
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
                let row = sqlx::query(queries::MESSAGE_DEAD_AT_RANGE)
                    .bind(id.to_string())
                    .fetch_one(&self.inner.pool)
                    .await
                    .map_err(map)?;
                let oldest = rows::optional_time(&row, "oldest")?;
                let newest = rows::optional_time(&row, "newest")?;
                let Some(range) = oldest.zip(newest) else {
                    return Ok(DeadLetterPage::default());
                };
                Some(range)
            }
        };
        let (start, end) = filter.scan_bounds(after, message_dead_at);
        let limit = limit.clamp(1, MAX_DEAD_LETTER_PAGE);
        let fetched = sqlx::query(queries::DEAD_LETTERS_LIST)
            .bind(&filter.tenant)
            .bind(&filter.topic)
            .bind(&filter.subscription)
            .bind(filter.message_id.map(|id| id.to_string()))
            .bind(end.map(millis_ceil))
            .bind(start.map(|key| millis_ceil(key.dead_at)))
            .bind(start.map(|key| key.delivery_id))
            .bind(i64::try_from(limit + 1).unwrap_or(i64::MAX))
            .bind(&filter.fingerprint)
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        let mut items = fetched
            .iter()
            .map(rows::dead_letter)
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
        let count: i64 = sqlx::query_scalar(queries::DEAD_LETTERS_COUNT)
            .bind(&filter.tenant)
            .bind(&filter.topic)
            .bind(&filter.subscription)
            .bind(filter.message_id.map(|id| id.to_string()))
            .bind(filter.dead_after.map(millis_ceil))
            .bind(filter.dead_before.map(millis_ceil))
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
        let fetched = sqlx::query(queries::DEAD_LETTER_GROUPS)
            .bind(&filter.tenant)
            .bind(&filter.topic)
            .bind(&filter.subscription)
            .bind(filter.message_id.map(|id| id.to_string()))
            .bind(filter.dead_after.map(millis_ceil))
            .bind(filter.dead_before.map(millis_ceil))
            .bind(&filter.fingerprint)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        fetched
            .iter()
            .map(|row| {
                let count: i64 = get(row, "dead")?;
                Ok(DeadLetterGroup {
                    fingerprint: get(row, "fingerprint")?,
                    sample_error: get(row, "sample_error")?,
                    count: u64::try_from(count).unwrap_or(0),
                    first_seen: rows::optional_time(row, "first_seen")?,
                    last_seen: rows::optional_time(row, "last_seen")?,
                    subscriptions: sorted_names(row, "subscriptions")?,
                    topics: sorted_names(row, "topics")?,
                })
            })
            .collect()
    }

    async fn get_dead_letter(
        &self,
        delivery_id: i64,
    ) -> Result<Option<courier_core::DeadLetter>, StoreError> {
        let row = sqlx::query(queries::DEAD_LETTER_GET)
            .bind(delivery_id)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(map)?;
        row.as_ref().map(rows::dead_letter).transpose()
    }

    async fn retry_dead_letters<'c>(&'c self, ids: &'c [i64]) -> Result<u64, StoreError> {
        self.select_dead_letters(
            queries::DEAD_LETTERS_RETRY,
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
            queries::DEAD_LETTERS_RETRY,
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
        self.select_dead_letters(queries::DEAD_LETTERS_RETRY, None, filter, None)
            .await
    }

    async fn discard_dead_letters<'c>(&'c self, ids: &'c [i64]) -> Result<u64, StoreError> {
        self.select_dead_letters(
            queries::DEAD_LETTERS_DISCARD,
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
            queries::DEAD_LETTERS_DISCARD,
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
        self.select_dead_letters(queries::DEAD_LETTERS_DISCARD, None, filter, None)
            .await
    }

    async fn message_deliveries(
        &self,
        message_id: Uuid,
    ) -> Result<Vec<DeliverySummary>, StoreError> {
        let fetched = sqlx::query(queries::MESSAGE_DELIVERIES)
            .bind(message_id.to_string())
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        fetched
            .iter()
            .map(|row| {
                let errors: String = get(row, "errors")?;
                Ok(DeliverySummary {
                    subscription: get(row, "subscription")?,
                    delivery_id: get(row, "delivery_id")?,
                    state: get(row, "state")?,
                    attempts: get::<Option<i32>>(row, "attempts")?.unwrap_or(0),
                    errors: rows::parse_errors(&errors)?,
                })
            })
            .collect()
    }
}

impl SqliteStore {
    /// Runs a dead-letter retry or discard selected by `ids` or, when `ids` is
    /// `None`, by `filter`; with `tenants`, only those tenants' dead letters.
    async fn select_dead_letters(
        &self,
        sql: &str,
        ids: Option<&[i64]>,
        filter: &DeadLetterFilter,
        tenants: Option<&[String]>,
    ) -> Result<u64, StoreError> {
        let _turn = self.write_turn().await?;
        let ids = ids.map(|ids| Value::from(ids.to_vec()).to_string());
        let tenants = tenants.map(|tenants| Value::from(tenants.to_vec()).to_string());
        let result = sqlx::query(sql)
            .bind(ids)
            .bind(&filter.tenant)
            .bind(&filter.topic)
            .bind(&filter.subscription)
            .bind(tenants)
            .bind(filter.message_id.map(|id| id.to_string()))
            .bind(filter.dead_after.map(millis_ceil))
            .bind(filter.dead_before.map(millis_ceil))
            .bind(&filter.fingerprint)
            .execute(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(result.rows_affected())
    }
}

/// A JSON array of names (`json_group_array`), sorted.
fn sorted_names(row: &sqlx::sqlite::SqliteRow, column: &str) -> Result<Vec<String>, StoreError> {
    let text: String = get(row, column)?;
    let mut names: Vec<String> = serde_json::from_str(&text)
        .map_err(|e| StoreError::Corrupt(format!("{column} is not a JSON array of names: {e}")))?;
    names.sort();
    Ok(names)
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
