//! The store conformance suite: every promise of the storage seam
//! ([`OutboxStore`], [`DeadLetterStore`](courier::DeadLetterStore)) written
//! once and run against every backend, as River's `riverdrivertest` runs
//! against every driver.
//!
//! A backend takes part by implementing [`StoreFixture`] (a fresh isolated
//! store plus the few raw operations a test needs: SQL, moving stored times
//! into the past, holding an old snapshot) and invoking
//! [`store_conformance_tests!`](crate::store_conformance_tests) in a module of
//! a test target. Each case is a public `async fn` of this module taking the
//! fixture, so a failure names the backend and the case
//! (`postgres::release_gives_back_the_attempt`).
//!
//! Cases never sleep through a lease or a delay: they move the stored times
//! back with [`StoreFixture::expire_leases`] or [`StoreFixture::pass_time`],
//! which is what the database clock would show after the wait. Where the
//! trait lets stores differ ([`OutboxStore::EXCLUSIVE_TRANSACTIONS`]), the
//! case asserts what the store declares. Where a store fails a case, the
//! case stays and the macro marks that backend's test `#[ignore]` with the
//! finding, so it is run on demand (`--run-ignored`) and never forgotten.

mod claim;
mod concurrency;
mod dead_letter_groups;
mod dead_letters;
mod enqueue;
mod fixtures;
mod helpers;
mod priority;
mod rescue;
mod settle;
mod transactional;

use std::future::Future;
use std::time::Duration;

use courier::{AdminStore, DeadLetterStore, EnqueueOutcome, NewMessage, OutboxStore};
use sqlx::{Connection, PgConnection, SqliteConnection};

use crate::EffectConnection;

pub use claim::*;
pub use concurrency::*;
pub use dead_letter_groups::*;
pub use dead_letters::*;
pub use enqueue::*;
pub use priority::*;
pub use rescue::*;
pub use settle::*;
pub use transactional::*;

/// A backend's store over a fresh, isolated database (its own PostgreSQL
/// schema, its own SQLite file), with the raw access the suite needs.
///
/// The time methods change stored times, never the clock: after
/// `pass_time(d)` every comparison the store makes with the database clock
/// comes out as it would `d` later.
pub trait StoreFixture: Sized + Send + Sync + 'static {
    /// The store under test.
    type Store: OutboxStore<Connection: SuiteConnection> + DeadLetterStore + AdminStore;

    /// The table the store records applied migrations in (`version`, `name`).
    const MIGRATIONS_TABLE: &'static str;

    /// The schema version this build's migrations reach.
    const SCHEMA_VERSION: i64;

    /// A migrated store over a fresh database of its own.
    fn fresh() -> impl Future<Output = anyhow::Result<Self>> + Send;

    /// The store.
    fn store(&self) -> &Self::Store;

    /// Another store over the same database, with a pool of its own of
    /// `max_connections`: what a second process would open. It shares no
    /// in-process state (locks, caches) with [`StoreFixture::store`].
    fn open_store(
        &self,
        max_connections: u32,
    ) -> impl Future<Output = anyhow::Result<Self::Store>> + Send;

    /// Runs statements on the test database; returns the rows changed.
    fn execute(&self, sql: &str) -> impl Future<Output = anyhow::Result<u64>> + Send;

    /// Runs a query returning one integer.
    fn scalar(&self, sql: &str) -> impl Future<Output = anyhow::Result<i64>> + Send;

    /// Runs a query returning one text column.
    fn texts(&self, sql: &str) -> impl Future<Output = anyhow::Result<Vec<String>>> + Send;

    /// Enqueues `messages` in a producer's transaction that commits (`commit`)
    /// or rolls back.
    fn enqueue_in_transaction(
        &self,
        messages: &[NewMessage],
        commit: bool,
    ) -> impl Future<Output = anyhow::Result<Vec<EnqueueOutcome>>> + Send;

    /// The statement [`StoreFixture::expire_leases`] runs, for a connection
    /// the test already holds (a transactional handler's own).
    fn expire_leases_sql(&self, subscription: &str) -> String;

    /// Moves every running lease of `subscription` one second into the past
    /// on the database clock; returns how many.
    fn expire_leases(&self, subscription: &str)
        -> impl Future<Output = anyhow::Result<u64>> + Send;

    /// Moves every stored time the store compares with the database clock
    /// (deliveries' availability, lease expiry and death, messages' and
    /// receipts' age) `by` into the past, as if `by` had gone by.
    fn pass_time(&self, by: Duration) -> impl Future<Output = anyhow::Result<()>> + Send;

    /// Opens a reader elsewhere that keeps the snapshot it took now until the
    /// returned guard is closed or dropped: on PostgreSQL a `REPEATABLE READ`
    /// transaction (the rows it may still see cannot be vacuumed away), on
    /// SQLite a read transaction on its own connection (the WAL cannot be
    /// checkpointed past it).
    fn hold_snapshot(&self) -> impl Future<Output = anyhow::Result<HeldSnapshot>> + Send;
}

/// A connection the suite's transactional work can write through.
pub trait SuiteConnection: EffectConnection {
    /// Runs statements on this connection (inside the handler's transaction).
    fn run_sql<'a>(
        &'a mut self,
        sql: &'a str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send + 'a;
}

impl SuiteConnection for PgConnection {
    async fn run_sql<'a>(&'a mut self, sql: &'a str) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(self, sql).await?;
        Ok(())
    }
}

impl SuiteConnection for SqliteConnection {
    async fn run_sql<'a>(&'a mut self, sql: &'a str) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(self, sql).await?;
        Ok(())
    }
}

/// A snapshot held open by [`StoreFixture::hold_snapshot`]. Dropping it
/// closes its connection, which ends the transaction; [`HeldSnapshot::close`]
/// ends it and reports errors.
pub struct HeldSnapshot {
    connection: SnapshotConnection,
}

enum SnapshotConnection {
    Postgres(PgConnection),
    Sqlite(SqliteConnection),
}

impl HeldSnapshot {
    /// Rolls the reader's transaction back and closes its connection.
    pub async fn close(self) -> anyhow::Result<()> {
        match self.connection {
            SnapshotConnection::Postgres(mut conn) => {
                sqlx::Executor::execute(&mut conn, "ROLLBACK").await?;
                conn.close().await?;
            }
            SnapshotConnection::Sqlite(mut conn) => {
                sqlx::Executor::execute(&mut conn, "ROLLBACK").await?;
                conn.close().await?;
            }
        }
        Ok(())
    }
}

/// Generates one `#[tokio::test]` per store conformance case, in the module
/// it is invoked in, for a backend (`postgres` or `sqlite`, the name findings
/// are filed under) and its [`StoreFixture`] type:
///
/// ```ignore
/// mod postgres {
///     courier_testkit::store_conformance_tests!(postgres, courier_testkit::PgFixture);
/// }
/// ```
///
/// A case a backend fails carries `[backend: "finding: ..."]` in the list
/// below: that backend's test is `#[ignore]`d with the finding as its reason.
#[macro_export]
macro_rules! store_conformance_tests {
    ($backend:ident, $fixture:ty) => {
        $crate::store_conformance_tests!(@cases $backend, $fixture;
            migrating_twice_is_idempotent_and_a_newer_schema_is_refused,
            enqueue_in_a_rolled_back_transaction_leaves_no_message,
            invalid_messages_store_nothing,
            idempotent_enqueue_returns_the_first_id_and_stores_nothing,
            messages_are_found_by_their_idempotency_keys,
            a_batch_beyond_one_statement_is_split_and_stays_in_order,
            the_payload_comes_back_as_the_json_the_producer_wrote,
            claim_takes_only_the_routes_asked_for,
            a_lease_is_named_by_its_delivery_and_its_claim_s_token,
            a_claim_from_the_first_cursor_serves_every_tenant_with_ready_work,
            tenant_turns_continue_after_the_cursor,
            a_busy_tenant_cannot_starve_a_small_one,
            a_claim_gives_the_share_a_tenant_cannot_use_to_the_others,
            a_tenant_whose_share_was_urgent_is_topped_up_in_priority_order,
            the_in_flight_limit_defers_a_tenant_without_spending_attempts,
            an_ordering_key_holds_the_next_message_until_the_earlier_completes,
            an_ordering_key_releases_the_next_message_when_the_earlier_is_dead_lettered,
            a_delayed_message_waits_until_it_is_available,
            a_priority_message_overtakes_a_100_000_message_backlog_in_one_claim,
            priorities_order_a_tenant_s_share_and_tenants_still_take_turns,
            a_priority_message_keeps_its_place_in_its_ordering_key,
            priorities_outside_0_to_9_are_refused_and_plain_sql_sets_them,
            completion_with_a_wrong_token_is_refused,
            zombie_completion_is_refused_after_lease_expiry,
            a_zombie_with_the_right_token_is_refused_by_the_clock,
            a_failed_attempt_waits_for_its_retry_delay,
            exhausted_attempts_dead_letter_with_every_error_kept,
            the_error_history_keeps_the_newest_twenty,
            a_long_multibyte_error_is_cut_to_2000_characters,
            extend_keeps_a_lease_alive_past_its_original_expiry,
            extend_tells_a_completed_delivery_from_a_lost_lease,
            release_gives_back_the_attempt,
            a_snooze_puts_the_delivery_back_after_its_delay_without_spending_an_attempt,
            a_delivery_past_the_snooze_bound_spends_its_attempt,
            rescue_returns_expired_leases_and_dead_letters_at_the_last_attempt,
            rescued_deliveries_wait_a_backoff,
            the_error_history_keeps_the_newest_twenty_on_every_path,
            dead_letters_can_be_listed_inspected_retried_and_discarded,
            dead_letters_by_id_for_tenants_leave_other_tenants_alone,
            dead_letters_filter_by_message_and_dead_time_everywhere,
            dead_letters_group_by_failure_and_a_group_is_retried_or_discarded_alone,
            rescued_dead_letters_group_as_one_expiry,
            prune_removes_finished_messages_and_old_receipts_but_keeps_dead_letters,
            prune_works_in_batches,
            transactional_work_commits_with_its_receipt_and_completion,
            transactional_work_is_skipped_when_a_receipt_exists,
            transactional_work_after_lease_expiry_is_rolled_back,
            failing_transactional_work_rolls_back_its_writes,
            a_lease_expiring_during_transactional_work_is_fenced_as_the_store_declares,
            concurrent_claimers_never_share_a_delivery,
            claims_find_new_work_while_an_old_snapshot_is_held,
        );
    };
    (@cases $backend:ident, $fixture:ty;
     $($case:ident $([$($finding:tt)*])?),* $(,)?) => {
        $(
            $crate::store_conformance_tests!(@case $backend, $case $([$($finding)*])?, $fixture);
        )*
    };
    (@case postgres, $case:ident [postgres: $finding:literal], $fixture:ty) => {
        $crate::store_conformance_tests!(@test $case, $fixture, #[ignore = $finding]);
    };
    (@case sqlite, $case:ident [sqlite: $finding:literal], $fixture:ty) => {
        $crate::store_conformance_tests!(@test $case, $fixture, #[ignore = $finding]);
    };
    (@case $backend:ident, $case:ident $([$($finding:tt)*])?, $fixture:ty) => {
        $crate::store_conformance_tests!(@test $case, $fixture,);
    };
    (@test $case:ident, $fixture:ty, $(#[$ignore:meta])?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[$ignore])?
        async fn $case() -> anyhow::Result<()> {
            let fixture = <$fixture as $crate::StoreFixture>::fresh().await?;
            $crate::store_suite::$case(fixture).await
        }
    };
}
