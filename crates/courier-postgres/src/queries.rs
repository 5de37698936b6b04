//! The store's SQL, read from `queries/*.sql` and rendered once per schema.

macro_rules! queries {
    ($($name:ident),* $(,)?) => {
        /// Every query with `{schema}` replaced by the store's schema.
        pub(crate) struct Queries {
            $(pub(crate) $name: String,)*
        }

        impl Queries {
            pub(crate) fn render(schema: &str) -> Self {
                Self {
                    $($name: include_str!(concat!("../queries/", stringify!($name), ".sql"))
                        .replace("{schema}", schema),)*
                }
            }
        }
    };
}

queries!(
    stream_ack,
    stream_append,
    stream_claim_idle,
    stream_consumer_delete,
    stream_consumers,
    stream_dead_letter,
    stream_group_ensure,
    stream_horizon,
    stream_lag,
    stream_list,
    stream_pending_detail,
    stream_pending_summary,
    stream_range,
    stream_read_new,
    stream_read_pending,
    stream_receipt_insert,
    stream_receipt_runs_append,
    stream_receipt_runs_find,
    stream_receipt_runs_insert,
    stream_receipts_find,
    stream_receipts_insert_many,
    stream_relay_append,
    stream_relayed_entry,
    stream_touch,
    stream_uncount,
    stream_trim_maxlen,
    stream_trim_minid,
    stream_visibility_wait,
    stream_wait,
    batch_savepoint,
    begin_read_committed,
    batch_savepoint_next,
    batch_savepoint_rollback,
    claim,
    claim_in_flight_lock,
    claim_marks_due,
    claim_marks_prune,
    complete,
    complete_leased,
    dead_letter_get,
    dead_letter_groups,
    dead_letters_count,
    dead_letters_discard,
    dead_letters_list,
    dead_letters_retry,
    delivery_stats,
    delivery_totals,
    deliveries_present,
    enqueue,
    enqueue_plain,
    extend,
    fail,
    fan_out_epoch_bump,
    fan_out_lock,
    fan_out_lock_shared,
    fan_out_lock_try,
    leader_elect,
    leader_resign,
    lock_timeout_set,
    find_idempotent,
    messages_by_idempotency_key,
    idle_announce,
    idle_withdraw,
    jit_enabled,
    message_cancel,
    message_cancel_lock,
    message_cancel_finished,
    message_created_at,
    message_dead_at_range,
    message_deliveries,
    message_get,
    messages_list,
    migrate_bootstrap,
    listener_check,
    database_dead_tuples,
    database_oldest_transaction,
    migrate_lock,
    migrate_timeouts_off,
    migrate_record,
    migrate_trust,
    migrate_applied,
    migrate_table_exists,
    migrate_version,
    ping,
    prune_messages,
    prune_receipts,
    receipts_delete_many,
    receipts_insert_many,
    release,
    savepoint,
    savepoint_release,
    savepoint_rollback,
    rescue,
    snooze,
    subscription_pause,
    subscription_registered,
    subscription_replay,
    subscription_topics_add,
    subscription_topics_since,
    subscription_topics_remove,
    subscription_upsert,
    subscription_get,
    subscriptions_list,
    tenant_rate_limit_set,
);

impl crate::PgStore {
    /// The SQL of one of the store's hot queries (`queries/<name>.sql`:
    /// `claim`, `complete`, `enqueue`, `enqueue_plain`, `prune_messages`,
    /// `prune_receipts`)
    /// exactly as this store runs it, `{schema}` replaced by its schema;
    /// `None` for any other name. Read-only, for tools that explain what the
    /// store runs (`courier bench --scenario explain`).
    pub fn query_sql(&self, name: &str) -> Option<&str> {
        let queries = self.q();
        let sql = match name {
            "claim" => &queries.claim,
            "complete" => &queries.complete,
            "enqueue" => &queries.enqueue,
            "enqueue_plain" => &queries.enqueue_plain,
            "prune_messages" => &queries.prune_messages,
            "prune_receipts" => &queries.prune_receipts,
            _ => return None,
        };
        Some(sql.as_str())
    }
}
