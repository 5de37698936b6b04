//! The store's SQL, read from `queries/*.sql`.
//!
//! One SQLite file is one Courier database, so nothing is rendered per store.
//! Two statements have a variable number of rows or pieces (a batch enqueue,
//! a claim over several tenants); they are assembled here from fragments
//! whose values are always bound parameters, never spliced text.

use std::sync::LazyLock;

macro_rules! queries {
    ($($name:ident => $file:literal),* $(,)?) => {
        $(
            #[doc = concat!("`queries/", $file, "`.")]
            pub(crate) const $name: &str = include_str!(concat!("../queries/", $file));
        )*
    };
}

queries!(
    CLAIM_TENANTS => "claim_tenants.sql",
    CLOCK_MS => "clock_ms.sql",
    COMPLETE => "complete.sql",
    COMPLETE_IN_TX => "complete_in_tx.sql",
    DEAD_LETTER_GET => "dead_letter_get.sql",
    DEAD_LETTER_GROUPS => "dead_letter_groups.sql",
    DEAD_LETTERS_COUNT => "dead_letters_count.sql",
    DEAD_LETTERS_DISCARD => "dead_letters_discard.sql",
    DEAD_LETTERS_LIST => "dead_letters_list.sql",
    DEAD_LETTERS_RETRY => "dead_letters_retry.sql",
    DELIVERY_STATS => "delivery_stats.sql",
    DELIVERY_TOTALS => "delivery_totals.sql",
    DELIVERIES_PRESENT => "deliveries_present.sql",
    EXTEND => "extend.sql",
    FAIL => "fail.sql",
    FIND_IDEMPOTENT => "find_idempotent.sql",
    LEADER_ELECT => "leader_elect.sql",
    LEADER_RESIGN => "leader_resign.sql",
    LEASE_CHECK_MANY => "lease_check_many.sql",
    MESSAGE_CREATED_AT => "message_created_at.sql",
    MESSAGE_DEAD_AT_RANGE => "message_dead_at_range.sql",
    MESSAGE_DELIVERIES => "message_deliveries.sql",
    MESSAGE_CANCEL => "message_cancel.sql",
    MESSAGE_CANCEL_CHECK => "message_cancel_check.sql",
    MESSAGE_CANCEL_DELIVERIES => "message_cancel_deliveries.sql",
    MESSAGE_GET => "message_get.sql",
    MESSAGES_BY_IDEMPOTENCY_KEY => "messages_by_idempotency_key.sql",
    MESSAGES_LIST => "messages_list.sql",
    PRUNE_MESSAGES => "prune_messages.sql",
    PRUNE_REMOVED_TOPICS => "prune_removed_topics.sql",
    PRUNE_RECEIPTS => "prune_receipts.sql",
    PRUNE_STREAM_RECEIPTS => "prune_stream_receipts.sql",
    STREAM_RELAYED_ENTRY => "stream_relayed_entry.sql",
    STREAM_RECEIPTS_FIND => "stream_receipts_find.sql",
    STREAM_RECEIPTS_INSERT => "stream_receipts_insert.sql",
    RECEIPT_DELETE => "receipt_delete.sql",
    RECEIPTS_INSERT_MANY => "receipts_insert_many.sql",
    RELEASE => "release.sql",
    RESCUE => "rescue.sql",
    SNOOZE => "snooze.sql",
    STREAM_APPEND => "stream_append.sql",
    STREAM_CLAIM => "stream_claim.sql",
    STREAM_CLAIM_PICK => "stream_claim_pick.sql",
    STREAM_CONSUMER_DELETE => "stream_consumer_delete.sql",
    STREAM_CONSUMER_PENDING => "stream_consumer_pending.sql",
    STREAM_CONSUMER_TOUCH => "stream_consumer_touch.sql",
    STREAM_CONSUMERS_LIST => "stream_consumers_list.sql",
    STREAM_ENTRIES_AFTER => "stream_entries_after.sql",
    STREAM_ENTRIES_GET => "stream_entries_get.sql",
    STREAM_GROUP_ADVANCE => "stream_group_advance.sql",
    STREAM_GROUP_CREATE => "stream_group_create.sql",
    STREAM_GROUP_CURSOR => "stream_group_cursor.sql",
    STREAM_HAS_NEW => "stream_has_new.sql",
    STREAM_LAG => "stream_lag.sql",
    STREAM_LIST => "stream_list.sql",
    STREAM_PENDING_DETAIL => "stream_pending_detail.sql",
    STREAM_PENDING_INSERT => "stream_pending_insert.sql",
    STREAM_PENDING_PER_CONSUMER => "stream_pending_per_consumer.sql",
    STREAM_PENDING_REREAD => "stream_pending_reread.sql",
    STREAM_PENDING_REMOVE => "stream_pending_remove.sql",
    STREAM_TOUCH => "stream_touch.sql",
    STREAM_UNCOUNT => "stream_uncount.sql",
    STREAM_PENDING_SUMMARY => "stream_pending_summary.sql",
    STREAM_TRIM_MAX_LEN => "stream_trim_max_len.sql",
    STREAM_TRIM_MIN_ID => "stream_trim_min_id.sql",
    SUBSCRIPTION_PAUSE => "subscription_pause.sql",
    SUBSCRIPTION_REPLAY => "subscription_replay.sql",
    SUBSCRIPTION_TOPICS_ADD => "subscription_topics_add.sql",
    SUBSCRIPTION_TOPICS_FORGET => "subscription_topics_forget.sql",
    SUBSCRIPTION_TOPICS_SINCE => "subscription_topics_since.sql",
    SUBSCRIPTION_TOPICS_REMOVE => "subscription_topics_remove.sql",
    SUBSCRIPTION_UPSERT => "subscription_upsert.sql",
    SUBSCRIPTION_GET => "subscription_get.sql",
    SUBSCRIPTIONS_LIST => "subscriptions_list.sql",
    TENANT_RATE_LIMIT_LIFT => "tenant_rate_limit_lift.sql",
    TENANT_RATE_LIMIT_SET => "tenant_rate_limit_set.sql",
    TENANT_RATE_SPEND => "tenant_rate_spend.sql",
);

const CLAIM: &str = include_str!("../queries/claim.sql");
const CLAIM_PICK: &str = include_str!("../queries/claim_pick.sql");
const ENQUEUE: &str = include_str!("../queries/enqueue.sql");
const ENQUEUE_ROW: &str = include_str!("../queries/enqueue_row.sql");

/// Bound parameters one enqueued message takes (see `enqueue_row.sql`).
pub(crate) const ENQUEUE_PARAMS_PER_ROW: usize = 12;

/// Bound parameters the claim statement takes before the per-tenant pieces.
pub(crate) const CLAIM_SHARED_PARAMS: usize = 4;

/// Per-tenant pieces per compound SELECT in a claim; SQLite refuses compounds
/// of more than 500 terms, so larger turns nest groups of this many.
const CLAIM_PICKS_PER_GROUP: usize = 200;

static ENQUEUE_ROW_BODY: LazyLock<String> = LazyLock::new(|| strip_comments(ENQUEUE_ROW));
static CLAIM_PICK_BODY: LazyLock<String> = LazyLock::new(|| strip_comments(CLAIM_PICK));

/// A fragment's SQL without its `--` comment lines, so that repeating it does
/// not repeat the comment.
fn strip_comments(sql: &str) -> String {
    sql.lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The batch insert of `rows` messages.
pub(crate) fn enqueue(rows: usize) -> String {
    let row = ENQUEUE_ROW_BODY.trim();
    let mut values = String::with_capacity(rows * (row.len() + 2));
    for index in 0..rows {
        if index > 0 {
            values.push_str(",\n");
        }
        values.push_str(row);
    }
    ENQUEUE.replace("{rows}", &values)
}

/// The claim update over `tenants` per-tenant pieces. Piece `i` (0-based)
/// reads its tenant from parameter `CLAIM_SHARED_PARAMS + 2i + 1` and its
/// quota from the one after.
pub(crate) fn claim(tenants: usize) -> String {
    let piece = CLAIM_PICK_BODY.trim();
    let pieces: Vec<String> = (0..tenants)
        .map(|index| {
            let tenant = CLAIM_SHARED_PARAMS + 2 * index + 1;
            piece
                .replace("{tenant}", &tenant.to_string())
                .replace("{quota}", &(tenant + 1).to_string())
        })
        .collect();
    let picks = if pieces.len() <= CLAIM_PICKS_PER_GROUP {
        pieces.join("\nUNION ALL\n")
    } else {
        let mut picks = String::new();
        for (index, group) in pieces.chunks(CLAIM_PICKS_PER_GROUP).enumerate() {
            if index > 0 {
                picks.push_str("\nUNION ALL\n");
            }
            picks.push_str("SELECT id FROM (\n");
            picks.push_str(&group.join("\nUNION ALL\n"));
            picks.push_str("\n)");
        }
        picks
    };
    CLAIM.replace("{picks}", &picks)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fragments_lose_their_comments_and_number_their_parameters() {
        let claim = claim(2);
        assert!(claim.contains("d.tenant = ?5"));
        assert!(claim.contains("LIMIT ?6"));
        assert!(claim.contains("d.tenant = ?7"));
        assert!(claim.contains("LIMIT ?8"));
        assert!(!claim.contains("{picks}"));
        assert_eq!(claim.matches("One tenant's share").count(), 0);
        let enqueue = enqueue(3);
        assert_eq!(enqueue.matches("coalesce(?, CAST").count(), 3);
        assert_eq!(enqueue.matches('?').count(), 3 * ENQUEUE_PARAMS_PER_ROW);
    }

    #[test]
    fn large_turns_nest_their_compound_selects() {
        let claim = claim(450);
        assert_eq!(
            claim.matches("SELECT id FROM (\nSELECT id FROM (").count(),
            3
        );
    }
}
