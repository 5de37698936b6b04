//! The store operations the API needs, behind one object-safe trait, so the
//! router and its handlers are not generic over the backend.

use courier::{
    AdminStore, CancelOutcome, DeadLetter, DeadLetterFilter, DeadLetterPage, DeadLetterStore,
    DeliveryStats, DeliverySummary, EnqueueOutcome, MessageFilter, MessagePage, NewMessage,
    OutboxStore, StoreError, StoredMessage, SubscriptionInfo,
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
        before: Option<Uuid>,
        limit: usize,
    ) -> StoreFuture<'_, MessagePage>;
    /// Open deliveries per (subscription, topic).
    fn delivery_stats(&self, tenants: Option<Vec<String>>) -> StoreFuture<'_, Vec<DeliveryStats>>;
    /// Every subscription.
    fn list_subscriptions(&self) -> StoreFuture<'_, Vec<SubscriptionInfo>>;
    /// Pauses or resumes a subscription; whether it exists.
    fn set_subscription_paused(&self, name: String, paused: bool) -> StoreFuture<'_, bool>;
    /// Whether the database answers with the expected schema.
    fn ready(&self) -> StoreFuture<'_, bool>;
    /// A page of dead letters.
    fn list_dead_letters(
        &self,
        filter: DeadLetterFilter,
        after: Option<i64>,
        limit: usize,
    ) -> StoreFuture<'_, DeadLetterPage>;
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
        before: Option<Uuid>,
        limit: usize,
    ) -> StoreFuture<'_, MessagePage> {
        Box::pin(async move { AdminStore::list_messages(self, &filter, before, limit).await })
    }

    fn delivery_stats(&self, tenants: Option<Vec<String>>) -> StoreFuture<'_, Vec<DeliveryStats>> {
        Box::pin(async move { AdminStore::delivery_stats(self, tenants.as_deref()).await })
    }

    fn list_subscriptions(&self) -> StoreFuture<'_, Vec<SubscriptionInfo>> {
        Box::pin(AdminStore::list_subscriptions(self))
    }

    fn set_subscription_paused(&self, name: String, paused: bool) -> StoreFuture<'_, bool> {
        Box::pin(async move { AdminStore::set_subscription_paused(self, &name, paused).await })
    }

    fn ready(&self) -> StoreFuture<'_, bool> {
        Box::pin(AdminStore::ready(self))
    }

    fn list_dead_letters(
        &self,
        filter: DeadLetterFilter,
        after: Option<i64>,
        limit: usize,
    ) -> StoreFuture<'_, DeadLetterPage> {
        Box::pin(
            async move { DeadLetterStore::list_dead_letters(self, &filter, after, limit).await },
        )
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
