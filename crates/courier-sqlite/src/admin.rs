//! [`AdminStore`] for SQLite: what operators read and control — messages with
//! their per-subscription state, counts of open work, subscriptions and their
//! pause switch, and readiness. Every read is a single statement, so it sees
//! one snapshot and never waits for the writer (WAL).

use courier_core::{
    validate_name, AdminStore, CancelOutcome, DatabaseHealth, DeadLetterStore, DeliveryStats,
    DeliveryStatsPage, DeliverySummary, DeliveryTotals, MessageFilter, MessageKey, MessagePage,
    RateLimit, StatsKey, StoreError, StoredMessage, SubscriptionInfo, SubscriptionPage,
    MAX_LIST_PAGE,
};
use serde_json::Value;
use sqlx::sqlite::SqliteRow;
use uuid::Uuid;

use crate::error::map;
use crate::outbox::wait_for_clock;
use crate::rows::{self, get, millis_ceil};
use crate::{migrate, queries, SqliteStore};

pub use courier_core::MAX_MESSAGE_PAGE;

/// A tenant scope as the JSON array the queries read with `json_each`;
/// `None` (every tenant) stays NULL.
fn tenants_json(tenants: Option<&[String]>) -> Option<String> {
    tenants.map(|tenants| Value::from(tenants.to_vec()).to_string())
}

impl AdminStore for SqliteStore {
    async fn get_message(
        &self,
        id: Uuid,
    ) -> Result<Option<(StoredMessage, Vec<DeliverySummary>)>, StoreError> {
        let row = sqlx::query(queries::MESSAGE_GET)
            .bind(id.to_string())
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(map)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let message = rows::stored_message(&row)?;
        let deliveries = self.message_deliveries(id).await?;
        Ok(Some((message, deliveries)))
    }

    async fn cancel_message(&self, id: Uuid) -> Result<CancelOutcome, StoreError> {
        let id = id.to_string();
        let mut tx = self.begin().await?;
        let started: Option<(String, String)> = sqlx::query_as(queries::MESSAGE_CANCEL_CHECK)
            .bind(&id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?;
        if let Some((subscription, state)) = started {
            tx.rollback().await.map_err(map)?;
            return Ok(CancelOutcome::Started {
                subscription,
                state,
            });
        }
        let deliveries = sqlx::query(queries::MESSAGE_CANCEL_DELIVERIES)
            .bind(&id)
            .execute(&mut *tx)
            .await
            .map_err(map)?
            .rows_affected();
        let existed = sqlx::query(queries::MESSAGE_CANCEL)
            .bind(&id)
            .execute(&mut *tx)
            .await
            .map_err(map)?
            .rows_affected()
            > 0;
        if !existed {
            tx.rollback().await.map_err(map)?;
            return Ok(CancelOutcome::NotFound);
        }
        tx.commit().await.map_err(map)?;
        Ok(CancelOutcome::Cancelled { deliveries })
    }

    async fn messages_by_idempotency_keys<'c>(
        &'c self,
        keys: &'c [(String, String)],
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let pairs: Vec<Value> = keys
            .iter()
            .map(|(tenant, key)| Value::from(vec![tenant.clone(), key.clone()]))
            .collect();
        let fetched = sqlx::query(queries::MESSAGES_BY_IDEMPOTENCY_KEY)
            .bind(Value::Array(pairs).to_string())
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        fetched.iter().map(rows::stored_message).collect()
    }

    async fn list_messages<'c>(
        &'c self,
        filter: &'c MessageFilter,
        before: Option<MessageKey>,
        limit: usize,
    ) -> Result<MessagePage, StoreError> {
        filter.validate()?;
        let message_enqueued_at = match filter.message_id {
            None => None,
            Some(id) => {
                let at: Option<i64> = sqlx::query_scalar(queries::MESSAGE_CREATED_AT)
                    .bind(id.to_string())
                    .fetch_optional(&self.inner.pool)
                    .await
                    .map_err(map)?;
                let Some(at) = at else {
                    return Ok(MessagePage::default());
                };
                Some(rows::from_millis("created_at", at)?)
            }
        };
        let (lowest, start) = filter.scan_bounds(before, message_enqueued_at);
        let limit = limit.clamp(1, MAX_MESSAGE_PAGE);
        let fetched = sqlx::query(queries::MESSAGES_LIST)
            .bind(tenants_json(filter.tenants.as_deref()))
            .bind(&filter.topic)
            .bind(&filter.state)
            .bind(&filter.subscription)
            .bind(filter.message_id.map(|id| id.to_string()))
            .bind(lowest.map(millis_ceil))
            .bind(start.map(|key| millis_ceil(key.enqueued_at)))
            .bind(start.map(|key| key.id.to_string()))
            .bind(i64::try_from(limit + 1).unwrap_or(i64::MAX))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        let mut items = fetched
            .iter()
            .map(rows::stored_message)
            .collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if items.len() > limit {
            items.truncate(limit);
            items.last().map(MessageKey::of)
        } else {
            None
        };
        Ok(MessagePage { items, next_cursor })
    }

    async fn delivery_stats<'c>(
        &'c self,
        tenants: Option<&'c [String]>,
        after: Option<&'c StatsKey>,
        limit: usize,
    ) -> Result<DeliveryStatsPage, StoreError> {
        let limit = limit.clamp(1, MAX_LIST_PAGE);
        let fetched = sqlx::query(queries::DELIVERY_STATS)
            .bind(tenants_json(tenants))
            .bind(after.map(|key| key.subscription.as_str()))
            .bind(after.map(|key| key.topic.as_str()))
            .bind(i64::try_from(limit + 1).unwrap_or(i64::MAX))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        let mut items = fetched
            .iter()
            .map(|row| {
                Ok(DeliveryStats {
                    subscription: get(row, "subscription")?,
                    topic: get(row, "topic")?,
                    available: get(row, "available")?,
                    retrying: get(row, "retrying")?,
                    running: get(row, "running")?,
                    dead: get(row, "dead")?,
                    oldest_pending_age_seconds: get(row, "oldest_pending_age_seconds")?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let next_cursor = if items.len() > limit {
            items.truncate(limit);
            items.last().map(|row| StatsKey {
                subscription: row.subscription.clone(),
                topic: row.topic.clone(),
            })
        } else {
            None
        };
        Ok(DeliveryStatsPage { items, next_cursor })
    }

    async fn delivery_totals<'c>(
        &'c self,
        tenants: Option<&'c [String]>,
        subscription: Option<&'c str>,
    ) -> Result<DeliveryTotals, StoreError> {
        let row = sqlx::query(queries::DELIVERY_TOTALS)
            .bind(tenants_json(tenants))
            .bind(subscription)
            .fetch_one(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(DeliveryTotals {
            available: get(&row, "available")?,
            retrying: get(&row, "retrying")?,
            running: get(&row, "running")?,
            dead: get(&row, "dead")?,
            oldest_pending_age_seconds: get(&row, "oldest_pending_age_seconds")?,
        })
    }

    async fn list_subscriptions<'c>(
        &'c self,
        after: Option<&'c str>,
        limit: usize,
    ) -> Result<SubscriptionPage, StoreError> {
        let limit = limit.clamp(1, MAX_LIST_PAGE);
        let fetched = sqlx::query(queries::SUBSCRIPTIONS_LIST)
            .bind(after)
            .bind(i64::try_from(limit + 1).unwrap_or(i64::MAX))
            .fetch_all(&self.inner.pool)
            .await
            .map_err(map)?;
        let mut items = fetched
            .iter()
            .map(subscription)
            .collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if items.len() > limit {
            items.truncate(limit);
            items.last().map(|s| s.name.clone())
        } else {
            None
        };
        Ok(SubscriptionPage { items, next_cursor })
    }

    async fn get_subscription<'c>(
        &'c self,
        name: &'c str,
    ) -> Result<Option<SubscriptionInfo>, StoreError> {
        let row = sqlx::query(queries::SUBSCRIPTION_GET)
            .bind(name)
            .fetch_optional(&self.inner.pool)
            .await
            .map_err(map)?;
        row.as_ref().map(subscription).transpose()
    }

    async fn set_subscription_paused<'c>(
        &'c self,
        name: &'c str,
        paused: bool,
    ) -> Result<bool, StoreError> {
        let _turn = self.write_turn().await?;
        let result = sqlx::query(queries::SUBSCRIPTION_PAUSE)
            .bind(name)
            .bind(i64::from(paused))
            .execute(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(result.rows_affected() == 1)
    }

    async fn remove_subscription_topics<'c>(
        &'c self,
        name: &'c str,
        patterns: &'c [String],
    ) -> Result<u64, StoreError> {
        validate_name("subscription", name)?;
        let _turn = self.write_turn().await?;
        let patterns = Value::from(patterns.to_vec()).to_string();
        let mut tx = self.begin().await?;
        // Messages enqueued before this took the write lock have an earlier
        // millisecond than `removed_at`; those after its commit (which waits
        // for it, below) one at least as late: the admin views read what the
        // removed patterns still owe by it.
        let locked_at: i64 = sqlx::query_scalar(queries::CLOCK_MS)
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        let removed_at = locked_at.saturating_add(1);
        let removed = sqlx::query(queries::SUBSCRIPTION_TOPICS_REMOVE)
            .bind(name)
            .bind(&patterns)
            .bind(removed_at)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?
            .len();
        if removed > 0 {
            sqlx::query(queries::SUBSCRIPTION_TOPICS_FORGET)
                .bind(name)
                .bind(&patterns)
                .execute(&mut *tx)
                .await
                .map_err(map)?;
            wait_for_clock(&mut tx, removed_at).await?;
        }
        tx.commit().await.map_err(map)?;
        Ok(u64::try_from(removed).unwrap_or(u64::MAX))
    }

    async fn set_tenant_rate_limit<'c>(
        &'c self,
        subscription: &'c str,
        tenant: &'c str,
        limit: Option<RateLimit>,
    ) -> Result<(), StoreError> {
        courier_core::validate_name("subscription", subscription)?;
        courier_core::validate_name("tenant", tenant)?;
        if let Some(limit) = &limit {
            limit.validate()?;
        }
        let _turn = self.write_turn().await?;
        let query = match limit {
            Some(limit) => sqlx::query(queries::TENANT_RATE_LIMIT_SET)
                .bind(subscription)
                .bind(tenant)
                .bind(limit.per_second)
                .bind(i64::from(limit.burst)),
            None => sqlx::query(queries::TENANT_RATE_LIMIT_LIFT)
                .bind(subscription)
                .bind(tenant),
        };
        query.execute(&self.inner.pool).await.map_err(map)?;
        Ok(())
    }

    async fn ready(&self) -> Result<bool, StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.inner.pool)
            .await
            .map_err(map)?;
        Ok(migrate::current(&self.inner.pool).await? == migrate::SCHEMA_VERSION)
    }

    async fn database_health(&self) -> Result<DatabaseHealth, StoreError> {
        // One writer and no MVCC: no transaction holds back cleanup, and
        // SQLite counts no dead rows.
        Ok(DatabaseHealth::default())
    }
}

/// A row of `subscriptions_list.sql` or `subscription_get.sql`.
fn subscription(row: &SqliteRow) -> Result<SubscriptionInfo, StoreError> {
    let topics: String = get(row, "topics")?;
    let mut topics: Vec<String> =
        serde_json::from_str(&topics).map_err(|e| StoreError::Corrupt(format!("topics: {e}")))?;
    topics.sort();
    Ok(SubscriptionInfo {
        name: get(row, "name")?,
        topics,
        paused: get::<i64>(row, "paused")? != 0,
        created_at: rows::time(row, "created_at")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_scope_becomes_a_json_array_and_no_scope_stays_null() {
        let scope = vec!["acme".to_owned(), "glo\"bex".to_owned()];
        assert_eq!(
            tenants_json(Some(&scope)).as_deref(),
            Some(r#"["acme","glo\"bex"]"#)
        );
        assert_eq!(tenants_json(Some(&[])).as_deref(), Some("[]"));
        assert_eq!(tenants_json(None), None);
    }
}
