//! The stream conformance suite: every promise of the stream seam
//! ([`StreamStore`]) written once and run against every stream backend
//! (Redis Streams, PostgreSQL, SQLite), as the store suite
//! ([`store_suite`](crate::store_suite)) does for the outbox.
//!
//! A backend takes part by implementing [`StreamFixture`] (a fresh isolated
//! store, a second store over the same data as another process would open,
//! and a way to make pending entries look idle) and invoking
//! [`stream_backend_tests!`](crate::stream_backend_tests) in a module of a
//! test target. Each case is a public `async fn` of this module taking the
//! fixture, so a failure names the backend and the case
//! (`sqlite::ack_counts_only_pending_entries`).
//!
//! The cases use nothing but the trait: they assume only what its doc
//! comments promise (semantics follow Redis Streams), never a backend's id
//! format, clock or tables. Each case uses streams of its own, so a backend
//! whose fixtures share one server can still run them in parallel. Cases
//! never sleep through an idle time: [`StreamFixture::age_pending`] makes
//! entries look idle. Only the blocking-read cases wait, for a few hundred
//! milliseconds. Where a backend fails a case, the case stays and the macro
//! marks that backend's test `#[ignore]` with the finding, so it is run on
//! demand (`--run-ignored`) and never forgotten.

mod blocking;
mod claims;
mod entries;
mod fixtures;
mod groups;
mod helpers;
mod listing;
mod load;
mod pending;

use std::future::Future;
use std::time::Duration;

use courier_core::{StreamKey, StreamStore};

pub use blocking::*;
pub use claims::*;
pub use entries::*;
pub use fixtures::{
    redis_url, PgStreamFixture, ReadablePgStore, RedisStreamFixture, SqliteStreamFixture,
};
pub use groups::*;
pub use listing::*;
pub use load::*;
pub use pending::*;

/// A stream backend's store over fresh, isolated data (its own SQLite file,
/// PostgreSQL schema or Redis key prefix), with what the suite needs beyond
/// the trait.
pub trait StreamFixture: Sized + Send + Sync + 'static {
    /// The store under test.
    type Store: StreamStore;

    /// A ready store (migrated, connected) over fresh data of its own.
    fn fresh() -> impl Future<Output = anyhow::Result<Self>> + Send;

    /// The store.
    fn store(&self) -> &Self::Store;

    /// Another store over the same data, with connections of its own and no
    /// in-process state shared with [`StreamFixture::store`]: what a second
    /// process would open.
    fn open_store(&self) -> impl Future<Output = anyhow::Result<Self::Store>> + Send;

    /// Makes every pending entry of `group` on `key` look `by` longer idle,
    /// by the backend's clock, without delivering it again (the delivery
    /// counts stay). The suite assumes no more than that: idle grows by `by`.
    fn age_pending(
        &self,
        key: &StreamKey,
        group: &str,
        by: Duration,
    ) -> impl Future<Output = anyhow::Result<()>> + Send;
}

/// Generates one `#[tokio::test]` per stream conformance case, in the module
/// it is invoked in, for a backend (`redis`, `postgres` or `sqlite`, the name
/// findings are filed under) and its [`StreamFixture`] type:
///
/// ```ignore
/// mod sqlite {
///     courier_testkit::stream_backend_tests!(sqlite, courier_testkit::SqliteStreamFixture);
/// }
/// ```
///
/// A case a backend fails carries `[backend: "finding: ...", ...]` in the
/// list below (one entry per failing backend): that backend's test is
/// `#[ignore]`d with the finding as its reason.
#[macro_export]
macro_rules! stream_backend_tests {
    ($backend:ident, $fixture:ty) => {
        $crate::stream_backend_tests!(@cases $backend, $fixture;
            a_group_at_the_end_sees_only_later_entries,
            a_group_after_an_id_sees_only_the_entries_after_it,
            a_group_at_the_beginning_sees_every_entry,
            a_second_ensure_leaves_the_group_where_it_is,
            two_groups_each_see_every_entry,
            the_consumers_of_a_group_split_its_entries,
            operations_on_a_missing_group_are_not_found_and_write_nothing,
            deleting_a_consumer_is_refused_while_it_has_pending_entries,
            ack_counts_only_pending_entries,
            ids_up_to_the_largest_are_ids_like_any_other,
            an_entry_stays_pending_until_acked_whoever_read_or_claimed_it,
            claims_and_own_pending_reads_count_deliveries,
            nothing_below_the_idle_time_is_claimed,
            a_touch_keeps_own_pending_entries_from_idle_claims,
            a_delivery_taken_back_is_not_counted,
            claims_reach_idle_entries_behind_busy_ones_by_following_next,
            trimmed_pending_entries_are_reported_deleted,
            the_pending_summary_counts_per_consumer,
            a_group_s_lag_counts_the_entries_it_has_not_handed_out,
            pending_detail_filters_by_consumer_idle_time_and_position,
            dead_letter_appends_to_the_dead_stream_and_acks_once,
            each_group_dead_letters_its_own_delivery_of_an_entry,
            a_blocked_read_wakes_when_another_task_appends,
            a_blocked_read_wakes_when_another_process_appends,
            a_blocked_read_with_nothing_to_read_returns_empty_after_its_block,
            invalid_input_is_refused_naming_the_field_and_stores_nothing,
            appended_ids_increase_above_every_earlier_id_even_after_a_trim,
            range_reads_after_an_id_without_making_anything_pending,
            trim_keeps_the_newest_entries_or_those_from_an_id,
            payloads_headers_and_origins_round_trip,
            concurrent_consumers_ack_every_entry_exactly_once,
            a_killed_consumer_s_unacked_entries_are_claimed_with_a_second_delivery,
            streams_of_every_tenant_are_listed_in_byte_order_with_lengths_and_last_ids,
            a_tenant_filter_lists_only_its_tenants_streams,
            paging_with_limit_one_walks_every_stream_once,
            a_group_s_pending_and_lag_follow_reads_and_acks,
            a_group_s_consumers_are_counted,
        );
    };
    (@cases $backend:ident, $fixture:ty;
     $($case:ident $([$($finding:tt)*])?),* $(,)?) => {
        $(
            $crate::stream_backend_tests!(@find $backend, $case, $fixture; $($($finding)*)?);
        )*
    };
    // Walk a case's findings; the one filed under this backend ignores it.
    (@find redis, $case:ident, $fixture:ty;
     redis: $finding:literal $(, $($rest:tt)*)?) => {
        $crate::stream_backend_tests!(@test $case, $fixture, #[ignore = $finding]);
    };
    (@find postgres, $case:ident, $fixture:ty;
     postgres: $finding:literal $(, $($rest:tt)*)?) => {
        $crate::stream_backend_tests!(@test $case, $fixture, #[ignore = $finding]);
    };
    (@find sqlite, $case:ident, $fixture:ty;
     sqlite: $finding:literal $(, $($rest:tt)*)?) => {
        $crate::stream_backend_tests!(@test $case, $fixture, #[ignore = $finding]);
    };
    (@find $backend:ident, $case:ident, $fixture:ty;
     $other:ident: $finding:literal $(, $($rest:tt)*)?) => {
        $crate::stream_backend_tests!(@find $backend, $case, $fixture; $($($rest)*)?);
    };
    (@find $backend:ident, $case:ident, $fixture:ty;) => {
        $crate::stream_backend_tests!(@test $case, $fixture,);
    };
    (@test $case:ident, $fixture:ty, $(#[$ignore:meta])?) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        $(#[$ignore])?
        async fn $case() -> anyhow::Result<()> {
            let fixture = <$fixture as $crate::StreamFixture>::fresh().await?;
            $crate::stream_suite::$case(fixture).await
        }
    };
}
