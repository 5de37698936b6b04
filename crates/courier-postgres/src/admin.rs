//! [`AdminStore`] for PostgreSQL: what operators read and control — messages
//! with their per-subscription state, counts of open work, subscriptions and
//! their pause switch, and readiness.

use chrono::{DateTime, Utc};
use courier_core::{
    AdminStore, CancelOutcome, DatabaseHealth, DeadLetterStore, DeliveryStats, DeliveryStatsPage,
    DeliverySummary, DeliveryTotals, MessageFilter, MessageKey, MessagePage, RateLimit, StatsKey,
    StoreError, StoredMessage, SubscriptionInfo, SubscriptionPage, MAX_LIST_PAGE,
};
use sqlx::postgres::PgRow;
use sqlx::Row;
use uuid::Uuid;

use crate::error::map;
use crate::rows::stored_message_from_row;
use crate::{migrate, PgStore};

pub use courier_core::MAX_MESSAGE_PAGE;

impl AdminStore for PgStore {
    async fn get_message(
        &self,
        id: Uuid,
    ) -> Result<Option<(StoredMessage, Vec<DeliverySummary>)>, StoreError> {
        let row = sqlx::query(&self.q().message_get)
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .map_err(map)?;
        let Some(row) = row else {
            return Ok(None);
        };
        let message = stored_message_from_row(&row)?;
        let deliveries = self.message_deliveries(id).await?;
        Ok(Some((message, deliveries)))
    }

    async fn cancel_message(&self, id: Uuid) -> Result<CancelOutcome, StoreError> {
        let mut tx = self.begin_read_committed().await?;
        // Not beside a registration's replay (see fan_out_lock_shared.sql):
        // it could add a delivery of the message while this removes it.
        sqlx::query(&self.q().fan_out_lock_shared)
            .execute(&mut *tx)
            .await
            .map_err(map)?;
        let deliveries: Vec<(i64, String, Option<String>)> =
            sqlx::query_as(&self.q().message_cancel_lock)
                .bind(id)
                .fetch_all(&mut *tx)
                .await
                .map_err(map)?;
        let ids: Vec<i64> = deliveries.iter().map(|(id, _, _)| *id).collect();
        let started = deliveries
            .into_iter()
            .find_map(|(_, subscription, state)| state.map(|state| (subscription, state)));
        let finished: Option<(String, String)> = sqlx::query_as(&self.q().message_cancel_finished)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(map)?;
        // A subscription that finished and a started delivery of another may
        // both refuse: report whichever name is first.
        let refusal = match (started, finished) {
            (Some(started), Some(done)) if done.0 < started.0 => Some(done),
            (Some(started), _) => Some(started),
            (None, done) => done,
        };
        if let Some((subscription, state)) = refusal {
            tx.rollback().await.map_err(map)?;
            return Ok(CancelOutcome::Started {
                subscription,
                state,
            });
        }
        let (existed, removed): (bool, i64) = sqlx::query_as(&self.q().message_cancel)
            .bind(id)
            .bind(&ids)
            .fetch_one(&mut *tx)
            .await
            .map_err(map)?;
        if !existed {
            tx.rollback().await.map_err(map)?;
            return Ok(CancelOutcome::NotFound);
        }
        if usize::try_from(removed).ok() != Some(ids.len()) {
            // The locks make this unreachable; never remove half a message.
            tx.rollback().await.map_err(map)?;
            return Err(StoreError::Corrupt(format!(
                "cancelling message {id}: {removed} of its {} locked deliveries were still unstarted",
                ids.len()
            )));
        }
        tx.commit().await.map_err(map)?;
        Ok(CancelOutcome::Cancelled {
            deliveries: u64::try_from(ids.len()).unwrap_or(u64::MAX),
        })
    }

    async fn messages_by_idempotency_keys<'c>(
        &'c self,
        keys: &'c [(String, String)],
    ) -> Result<Vec<StoredMessage>, StoreError> {
        let (tenants, keys): (Vec<&str>, Vec<&str>) = keys
            .iter()
            .map(|(tenant, key)| (tenant.as_str(), key.as_str()))
            .unzip();
        let rows = sqlx::query(&self.q().messages_by_idempotency_key)
            .bind(&tenants)
            .bind(&keys)
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        rows.iter().map(stored_message_from_row).collect()
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
                let at: Option<DateTime<Utc>> = sqlx::query_scalar(&self.q().message_created_at)
                    .bind(id)
                    .fetch_optional(self.pool())
                    .await
                    .map_err(map)?;
                if at.is_none() {
                    return Ok(MessagePage::default());
                }
                at
            }
        };
        let (lowest, start) = filter.scan_bounds(before, message_enqueued_at);
        let limit = limit.clamp(1, MAX_MESSAGE_PAGE);
        let rows = sqlx::query(&self.q().messages_list)
            .bind(&filter.tenants)
            .bind(&filter.topic)
            .bind(&filter.state)
            .bind(&filter.subscription)
            .bind(filter.message_id)
            .bind(lowest)
            .bind(start.map(|key| key.enqueued_at))
            .bind(start.map(|key| key.id))
            .bind(i64::try_from(limit + 1).unwrap_or(i64::MAX))
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        let mut items = rows
            .iter()
            .map(stored_message_from_row)
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
        let rows = sqlx::query(&self.q().delivery_stats)
            .bind(tenants)
            .bind(after.map(|key| key.subscription.as_str()))
            .bind(after.map(|key| key.topic.as_str()))
            .bind(i64::try_from(limit + 1).unwrap_or(i64::MAX))
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        let mut items = rows
            .iter()
            .map(|row| {
                Ok(DeliveryStats {
                    subscription: row.try_get("subscription")?,
                    topic: row.try_get("topic")?,
                    available: row.try_get("available")?,
                    retrying: row.try_get("retrying")?,
                    running: row.try_get("running")?,
                    dead: row.try_get("dead")?,
                    oldest_pending_age_seconds: row.try_get("oldest_pending_age_seconds")?,
                })
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(map)?;
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
        let row = sqlx::query(&self.q().delivery_totals)
            .bind(tenants)
            .bind(subscription)
            .fetch_one(self.pool())
            .await
            .map_err(map)?;
        (|| {
            Ok(DeliveryTotals {
                available: row.try_get("available")?,
                retrying: row.try_get("retrying")?,
                running: row.try_get("running")?,
                dead: row.try_get("dead")?,
                oldest_pending_age_seconds: row.try_get("oldest_pending_age_seconds")?,
            })
        })()
        .map_err(map)
    }

    async fn list_subscriptions<'c>(
        &'c self,
        after: Option<&'c str>,
        limit: usize,
    ) -> Result<SubscriptionPage, StoreError> {
        let limit = limit.clamp(1, MAX_LIST_PAGE);
        let rows = sqlx::query(&self.q().subscriptions_list)
            .bind(after)
            .bind(i64::try_from(limit + 1).unwrap_or(i64::MAX))
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        let mut items = rows
            .iter()
            .map(subscription_from_row)
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
        let row = sqlx::query(&self.q().subscription_get)
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map_err(map)?;
        row.as_ref().map(subscription_from_row).transpose()
    }

    async fn set_subscription_paused<'c>(
        &'c self,
        name: &'c str,
        paused: bool,
    ) -> Result<bool, StoreError> {
        let result = sqlx::query(&self.q().subscription_pause)
            .bind(name)
            .bind(paused)
            .execute(self.pool())
            .await
            .map_err(map)?;
        Ok(result.rows_affected() == 1)
    }

    async fn remove_subscription_topics<'c>(
        &'c self,
        name: &'c str,
        patterns: &'c [String],
    ) -> Result<u64, StoreError> {
        courier_core::validate_name("subscription", name)?;
        let mut tx = self.begin_read_committed().await?;
        self.lock_fan_out(&mut tx).await?;
        let removed = sqlx::query(&self.q().subscription_topics_remove)
            .bind(name)
            .bind(patterns)
            .fetch_all(&mut *tx)
            .await
            .map_err(map)?
            .len();
        if removed > 0 {
            sqlx::query(&self.q().fan_out_epoch_bump)
                .execute(&mut *tx)
                .await
                .map_err(map)?;
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
        sqlx::query(&self.q().tenant_rate_limit_set)
            .bind(subscription)
            .bind(tenant)
            .bind(limit.map(|l| l.per_second))
            .bind(limit.map(|l| i32::try_from(l.burst).unwrap_or(i32::MAX)))
            .execute(self.pool())
            .await
            .map_err(map)?;
        Ok(())
    }

    async fn ready(&self) -> Result<bool, StoreError> {
        sqlx::query(&self.q().ping)
            .execute(self.pool())
            .await
            .map_err(map)?;
        Ok(self.schema_version().await? == migrate::SCHEMA_VERSION)
    }

    async fn database_health(&self) -> Result<DatabaseHealth, StoreError> {
        let oldest_transaction_seconds: Option<f64> =
            sqlx::query_scalar(&self.q().database_oldest_transaction)
                .fetch_one(self.pool())
                .await
                .map_err(map)?;
        let dead: Vec<(String, i64)> = sqlx::query_as(&self.q().database_dead_tuples)
            .fetch_all(self.pool())
            .await
            .map_err(map)?;
        Ok(DatabaseHealth {
            oldest_transaction_seconds,
            dead_tuples: dead.into_iter().collect(),
        })
    }
}

/// A row of `subscriptions_list.sql` or `subscription_get.sql`.
fn subscription_from_row(row: &PgRow) -> Result<SubscriptionInfo, StoreError> {
    let mut topics: Vec<String> = row.try_get("topics").map_err(map)?;
    // Byte order, whatever the server's collation (the SQL sorts by "C" too).
    topics.sort();
    Ok(SubscriptionInfo {
        name: row.try_get("name").map_err(map)?,
        topics,
        paused: row.try_get("paused").map_err(map)?,
        created_at: row.try_get("created_at").map_err(map)?,
    })
}
