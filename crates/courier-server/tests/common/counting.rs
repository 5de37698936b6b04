//! A store that counts the calls the API makes to it, by method name.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use courier::{
    DeadLetter, DeadLetterFilter, DeadLetterKey, DeadLetterPage, DeliveryStatsPage,
    DeliverySummary, DeliveryTotals, EnqueueOutcome, MessageFilter, MessageKey, MessagePage,
    NewMessage, StatsKey, StoreError, StoredMessage, SubscriptionInfo, SubscriptionPage,
};
use courier_server::store::ApiStore;
use futures_util::future::BoxFuture;
use uuid::Uuid;

type Calls = Arc<Mutex<BTreeMap<&'static str, usize>>>;

/// `inner`, counting each call.
#[derive(Clone)]
pub struct CountingStore<S> {
    inner: S,
    calls: Calls,
}

impl<S: ApiStore> CountingStore<S> {
    pub fn new(inner: S) -> (Self, Calls) {
        let calls = Calls::default();
        (
            Self {
                inner,
                calls: Arc::clone(&calls),
            },
            calls,
        )
    }

    fn count(&self, name: &'static str) {
        *self.calls.lock().unwrap().entry(name).or_default() += 1;
    }
}

type Future<'a, T> = BoxFuture<'a, Result<T, StoreError>>;

impl<S: ApiStore> ApiStore for CountingStore<S> {
    fn publish(&self, messages: Vec<NewMessage>) -> Future<'_, Vec<EnqueueOutcome>> {
        self.count("publish");
        self.inner.publish(messages)
    }
    fn get_message(&self, id: Uuid) -> Future<'_, Option<(StoredMessage, Vec<DeliverySummary>)>> {
        self.count("get_message");
        self.inner.get_message(id)
    }
    fn cancel_message(&self, id: Uuid) -> Future<'_, courier::CancelOutcome> {
        self.count("cancel_message");
        self.inner.cancel_message(id)
    }
    fn messages_by_idempotency_keys(
        &self,
        keys: Vec<(String, String)>,
    ) -> Future<'_, Vec<StoredMessage>> {
        self.count("messages_by_idempotency_keys");
        self.inner.messages_by_idempotency_keys(keys)
    }
    fn list_messages(
        &self,
        filter: MessageFilter,
        before: Option<MessageKey>,
        limit: usize,
    ) -> Future<'_, MessagePage> {
        self.count("list_messages");
        self.inner.list_messages(filter, before, limit)
    }
    fn delivery_stats(
        &self,
        tenants: Option<Vec<String>>,
        after: Option<StatsKey>,
        limit: usize,
    ) -> Future<'_, DeliveryStatsPage> {
        self.count("delivery_stats");
        self.inner.delivery_stats(tenants, after, limit)
    }
    fn delivery_totals(
        &self,
        tenants: Option<Vec<String>>,
        subscription: Option<String>,
    ) -> Future<'_, DeliveryTotals> {
        self.count("delivery_totals");
        self.inner.delivery_totals(tenants, subscription)
    }
    fn list_subscriptions(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Future<'_, SubscriptionPage> {
        self.count("list_subscriptions");
        self.inner.list_subscriptions(after, limit)
    }
    fn get_subscription(&self, name: String) -> Future<'_, Option<SubscriptionInfo>> {
        self.count("get_subscription");
        self.inner.get_subscription(name)
    }
    fn set_subscription_paused(&self, name: String, paused: bool) -> Future<'_, bool> {
        self.count("set_subscription_paused");
        self.inner.set_subscription_paused(name, paused)
    }
    fn ready(&self) -> Future<'_, bool> {
        self.count("ready");
        self.inner.ready()
    }
    fn database_health(&self) -> Future<'_, courier::DatabaseHealth> {
        self.count("database_health");
        self.inner.database_health()
    }
    fn list_dead_letters(
        &self,
        filter: DeadLetterFilter,
        after: Option<DeadLetterKey>,
        limit: usize,
    ) -> Future<'_, DeadLetterPage> {
        self.count("list_dead_letters");
        self.inner.list_dead_letters(filter, after, limit)
    }
    fn count_dead_letters(&self, filter: DeadLetterFilter) -> Future<'_, u64> {
        self.count("count_dead_letters");
        self.inner.count_dead_letters(filter)
    }
    fn dead_letter_groups(
        &self,
        filter: DeadLetterFilter,
        limit: usize,
    ) -> Future<'_, Vec<courier::DeadLetterGroup>> {
        self.count("dead_letter_groups");
        self.inner.dead_letter_groups(filter, limit)
    }
    fn get_dead_letter(&self, delivery_id: i64) -> Future<'_, Option<DeadLetter>> {
        self.count("get_dead_letter");
        self.inner.get_dead_letter(delivery_id)
    }
    fn retry_dead_letters(&self, ids: Vec<i64>) -> Future<'_, u64> {
        self.count("retry_dead_letters");
        self.inner.retry_dead_letters(ids)
    }
    fn retry_tenants_dead_letters(&self, ids: Vec<i64>, tenants: Vec<String>) -> Future<'_, u64> {
        self.count("retry_tenants_dead_letters");
        self.inner.retry_tenants_dead_letters(ids, tenants)
    }
    fn retry_dead_letters_matching(&self, filter: DeadLetterFilter) -> Future<'_, u64> {
        self.count("retry_dead_letters_matching");
        self.inner.retry_dead_letters_matching(filter)
    }
    fn discard_dead_letters(&self, ids: Vec<i64>) -> Future<'_, u64> {
        self.count("discard_dead_letters");
        self.inner.discard_dead_letters(ids)
    }
    fn discard_tenants_dead_letters(&self, ids: Vec<i64>, tenants: Vec<String>) -> Future<'_, u64> {
        self.count("discard_tenants_dead_letters");
        self.inner.discard_tenants_dead_letters(ids, tenants)
    }
    fn discard_dead_letters_matching(&self, filter: DeadLetterFilter) -> Future<'_, u64> {
        self.count("discard_dead_letters_matching");
        self.inner.discard_dead_letters_matching(filter)
    }
}
