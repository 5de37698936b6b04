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
    claim,
    complete,
    complete_one,
    dead_letter_get,
    dead_letters_discard,
    dead_letters_list,
    dead_letters_retry,
    delivery_stats,
    enqueue,
    extend,
    fail,
    find_idempotent,
    message_deliveries,
    message_get,
    messages_list,
    prune_messages,
    prune_receipts,
    receipt_insert,
    release,
    rescue,
    subscription_pause,
    subscription_topics_add,
    subscription_upsert,
    subscriptions_list,
);
