//! The store operations the API needs, behind one object-safe trait, so the
//! router and its handlers are not generic over the backend.

use courier::{
    AdminStore, CancelOutcome, DeadLetter, DeadLetterFilter, DeadLetterGroup, DeadLetterKey,
    DeadLetterPage, DeadLetterStore, DeliveryStatsPage, DeliverySummary, DeliveryTotals,
    EnqueueOutcome, MessageFilter, MessageKey, MessagePage, NewMessage, OutboxStore, StatsKey,
    StoreError, StoredMessage, SubscriptionInfo, SubscriptionPage,
};
use futures_util::future::BoxFuture;
use uuid::Uuid;

type StoreFuture<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

/// What the HTTP API asks of a store; implemented for every store that is an
/// [`OutboxStore`], a [`DeadLetterStore`] and an [`AdminStore`].
pub trait ApiStore: Send + Sync + 'static {
    /// Enqueues messages in one transaction, all or nothing.
    fn publish(&self, messages: Vec<NewMessage>) -> StoreFuture<'_, Vec<EnqueueOutcome>>;
    /// One message with its per-subscription state.
    fn get_message(
        &self,
        id: Uuid,
    ) -> StoreFuture<'_, Option<(StoredMessage, Vec<DeliverySummary>)>>;
    /// Cancels a message no subscription has started on.
    fn cancel_message(&self, id: Uuid) -> StoreFuture<'_, CancelOutcome>;
    /// The messages stored under these (tenant, idempotency key) pairs.
    fn messages_by_idempotency_keys(
        &self,
        keys: Vec<(String, String)>,
    ) -> StoreFuture<'_, Vec<StoredMessage>>;
    /// A page of messages, newest first.
    fn list_messages(
        &self,
        filter: MessageFilter,
        before: Option<MessageKey>,
        limit: usize,
    ) -> StoreFuture<'_, MessagePage>;
    /// A page of open deliveries per (subscription, topic).
    fn delivery_stats(
        &self,
        tenants: Option<Vec<String>>,
        after: Option<StatsKey>,
        limit: usize,
    ) -> StoreFuture<'_, DeliveryStatsPage>;
    /// Open deliveries summed over every (subscription, topic), or one
    /// subscription's.
    fn delivery_totals(
        &self,
        tenants: Option<Vec<String>>,
        subscription: Option<String>,
    ) -> StoreFuture<'_, DeliveryTotals>;
    /// A page of subscriptions, by name.
    fn list_subscriptions(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> StoreFuture<'_, SubscriptionPage>;
    /// One subscription.
    fn get_subscription(&self, name: String) -> StoreFuture<'_, Option<SubscriptionInfo>>;
    /// Pauses or resumes a subscription; whether it exists.
    fn set_subscription_paused(&self, name: String, paused: bool) -> StoreFuture<'_, bool>;
    /// Whether the database answers with the expected schema.
    fn ready(&self) -> StoreFuture<'_, bool>;
    /// The oldest open transaction and dead rows (see `AdminStore::database_health`).
    fn database_health(&self) -> StoreFuture<'_, courier::DatabaseHealth>;
    /// A page of dead letters.
    fn list_dead_letters(
        &self,
        filter: DeadLetterFilter,
        after: Option<DeadLetterKey>,
        limit: usize,
    ) -> StoreFuture<'_, DeadLetterPage>;
    /// How many dead letters match a filter.
    fn count_dead_letters(&self, filter: DeadLetterFilter) -> StoreFuture<'_, u64>;
    /// Dead letters matching a filter, grouped by failure fingerprint.
    fn dead_letter_groups(
        &self,
        filter: DeadLetterFilter,
        limit: usize,
    ) -> StoreFuture<'_, Vec<DeadLetterGroup>>;
    /// One dead letter.
    fn get_dead_letter(&self, delivery_id: i64) -> StoreFuture<'_, Option<DeadLetter>>;
    /// Retries dead letters by id.
    fn retry_dead_letters(&self, ids: Vec<i64>) -> StoreFuture<'_, u64>;
    /// Retries dead letters by id, only those of `tenants`, in one statement.
    fn retry_tenants_dead_letters(
        &self,
        ids: Vec<i64>,
        tenants: Vec<String>,
    ) -> StoreFuture<'_, u64>;
    /// Retries dead letters matching a filter.
    fn retry_dead_letters_matching(&self, filter: DeadLetterFilter) -> StoreFuture<'_, u64>;
    /// Discards dead letters by id.
    fn discard_dead_letters(&self, ids: Vec<i64>) -> StoreFuture<'_, u64>;
    /// Discards dead letters by id, only those of `tenants`, in one statement.
    fn discard_tenants_dead_letters(
        &self,
        ids: Vec<i64>,
        tenants: Vec<String>,
    ) -> StoreFuture<'_, u64>;
    /// Discards dead letters matching a filter.
    fn discard_dead_letters_matching(&self, filter: DeadLetterFilter) -> StoreFuture<'_, u64>;
}

impl<S> ApiStore for S
where
    S: OutboxStore + DeadLetterStore + AdminStore,
{
    fn publish(&self, messages: Vec<NewMessage>) -> StoreFuture<'_, Vec<EnqueueOutcome>> {
        Box::pin(async move { self.publish_batch(&messages).await })
    }

    fn get_message(
        &self,
        id: Uuid,
    ) -> StoreFuture<'_, Option<(StoredMessage, Vec<DeliverySummary>)>> {
        Box::pin(AdminStore::get_message(self, id))
    }

    fn cancel_message(&self, id: Uuid) -> StoreFuture<'_, CancelOutcome> {
        Box::pin(AdminStore::cancel_message(self, id))
    }

    fn messages_by_idempotency_keys(
        &self,
        keys: Vec<(String, String)>,
    ) -> StoreFuture<'_, Vec<StoredMessage>> {
        Box::pin(async move { AdminStore::messages_by_idempotency_keys(self, &keys).await })
    }

    fn list_messages(
        &self,
        filter: MessageFilter,
        before: Option<MessageKey>,
        limit: usize,
    ) -> StoreFuture<'_, MessagePage> {
        Box::pin(async move { AdminStore::list_messages(self, &filter, before, limit).await })
    }

    fn delivery_stats(
        &self,
        tenants: Option<Vec<String>>,
        after: Option<StatsKey>,
        limit: usize,
    ) -> StoreFuture<'_, DeliveryStatsPage> {
        Box::pin(async move {
            AdminStore::delivery_stats(self, tenants.as_deref(), after.as_ref(), limit).await
        })
    }

    fn delivery_totals(
        &self,
        tenants: Option<Vec<String>>,
        subscription: Option<String>,
    ) -> StoreFuture<'_, DeliveryTotals> {
        Box::pin(async move {
            AdminStore::delivery_totals(self, tenants.as_deref(), subscription.as_deref()).await
        })
    }

    fn list_subscriptions(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> StoreFuture<'_, SubscriptionPage> {
        Box::pin(async move { AdminStore::list_subscriptions(self, after.as_deref(), limit).await })
    }

    fn get_subscription(&self, name: String) -> StoreFuture<'_, Option<SubscriptionInfo>> {
        Box::pin(async move { AdminStore::get_subscription(self, &name).await })
    }

    fn set_subscription_paused(&self, name: String, paused: bool) -> StoreFuture<'_, bool> {
        Box::pin(async move { AdminStore::set_subscription_paused(self, &name, paused).await })
    }

    fn ready(&self) -> StoreFuture<'_, bool> {
        Box::pin(AdminStore::ready(self))
    }

    fn database_health(&self) -> StoreFuture<'_, courier::DatabaseHealth> {
        Box::pin(AdminStore::database_health(self))
    }

    fn list_dead_letters(
        &self,
        filter: DeadLetterFilter,
        after: Option<DeadLetterKey>,
        limit: usize,
    ) -> StoreFuture<'_, DeadLetterPage> {
        Box::pin(
            async move { DeadLetterStore::list_dead_letters(self, &filter, after, limit).await },
        )
    }

    fn count_dead_letters(&self, filter: DeadLetterFilter) -> StoreFuture<'_, u64> {
        Box::pin(async move { DeadLetterStore::count_dead_letters(self, &filter).await })
    }

    fn dead_letter_groups(
        &self,
        filter: DeadLetterFilter,
        limit: usize,
    ) -> StoreFuture<'_, Vec<DeadLetterGroup>> {
        Box::pin(async move { DeadLetterStore::dead_letter_groups(self, &filter, limit).await })
    }

    fn get_dead_letter(&self, delivery_id: i64) -> StoreFuture<'_, Option<DeadLetter>> {
        Box::pin(DeadLetterStore::get_dead_letter(self, delivery_id))
    }

    fn retry_dead_letters(&self, ids: Vec<i64>) -> StoreFuture<'_, u64> {
        Box::pin(async move { DeadLetterStore::retry_dead_letters(self, &ids).await })
    }

    fn retry_tenants_dead_letters(
        &self,
        ids: Vec<i64>,
        tenants: Vec<String>,
    ) -> StoreFuture<'_, u64> {
        Box::pin(
            async move { DeadLetterStore::retry_tenants_dead_letters(self, &ids, &tenants).await },
        )
    }

    fn retry_dead_letters_matching(&self, filter: DeadLetterFilter) -> StoreFuture<'_, u64> {
        Box::pin(async move { DeadLetterStore::retry_dead_letters_matching(self, &filter).await })
    }

    fn discard_dead_letters(&self, ids: Vec<i64>) -> StoreFuture<'_, u64> {
        Box::pin(async move { DeadLetterStore::discard_dead_letters(self, &ids).await })
    }

    fn discard_tenants_dead_letters(
        &self,
        ids: Vec<i64>,
        tenants: Vec<String>,
    ) -> StoreFuture<'_, u64> {
        Box::pin(async move {
            DeadLetterStore::discard_tenants_dead_letters(self, &ids, &tenants).await
        })
    }

    fn discard_dead_letters_matching(&self, filter: DeadLetterFilter) -> StoreFuture<'_, u64> {
        Box::pin(async move { DeadLetterStore::discard_dead_letters_matching(self, &filter).await })
    }
}
