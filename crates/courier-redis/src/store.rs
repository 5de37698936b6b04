//! [`StreamStore`] on Redis Streams: one command or one script per operation.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use courier_core::{
    dead_letter_entry, group_not_found, validate_count, validate_name, validate_tenants, ClaimIdle,
    ClaimedEntries, ConsumerInfo, ConsumerRemoval, DeliveredEntry, GroupStart, GroupSummary,
    NewStreamEntry, PendingDetail, PendingEntry, PendingQuery, PendingSummary, ReadNew, StoreError,
    StreamEntry, StreamEntryId, StreamKey, StreamPage, StreamStore, StreamSummary, TrimBound,
    ValidationError, MAX_PAYLOAD_BYTES, MAX_STREAM_PAGE,
};
use redis::{Cmd, Script, ScriptInvocation, Value};

use crate::encoding::{decode, encode, Fields};
use crate::error::{corrupt, map, map_group};
use crate::reply::{array, bytes, count, id, int, pairs, text, tuple};
use crate::RedisStreamStore;

/// Keys one `SCAN` call looks at (a hint to Redis, not a bound).
const SCAN_COUNT: usize = 1000;

/// `text` as a `SCAN ... MATCH` pattern that matches it literally.
fn glob_literal(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
            pattern.push('\\');
        }
        pattern.push(c);
    }
    pattern
}

/// The stream at Redis key `key` under `prefix` (`{prefix}{tenant}:{stream}`),
/// if the rest of the key is a valid tenant and stream name.
fn stream_key_of(prefix: &str, key: &[u8]) -> Option<StreamKey> {
    let rest = key.strip_prefix(prefix.as_bytes())?;
    let (tenant, stream) = std::str::from_utf8(rest).ok()?.split_once(':')?;
    StreamKey::new(tenant, stream).ok()
}

/// A group of an `XINFO GROUPS` reply.
fn group_summary(row: Value) -> Result<GroupSummary, StoreError> {
    let mut name = None;
    let mut last_delivered = None;
    let mut group = GroupSummary {
        name: String::new(),
        consumers: 0,
        pending: 0,
        last_delivered: StreamEntryId::ZERO,
        lag: None,
    };
    for (field, value) in pairs(row, "a group of XINFO GROUPS")? {
        match field.as_str() {
            "name" => name = Some(text(value, "a group name")?),
            "consumers" => group.consumers = count(value, "a group's consumers")?,
            "pending" => group.pending = count(value, "a group's pending count")?,
            "last-delivered-id" => last_delivered = Some(id(value, "a group's last id")?),
            "lag" if value != Value::Nil => group.lag = Some(count(value, "a group's lag")?),
            _ => {}
        }
    }
    group.name = name.ok_or_else(|| corrupt("a group without a name"))?;
    group.last_delivered =
        last_delivered.ok_or_else(|| corrupt("a group without a last-delivered-id"))?;
    Ok(group)
}

/// The summary of `key` in `stream_summaries.lua`'s reply; `None` when the
/// key no longer held a stream.
fn stream_summary(key: StreamKey, value: Value) -> Result<Option<StreamSummary>, StoreError> {
    if value == Value::Nil {
        return Ok(None);
    }
    let [length, last_id, groups] = tuple(value, "a stream's summary")?;
    let mut groups = array(groups, "XINFO GROUPS")?
        .into_iter()
        .map(group_summary)
        .collect::<Result<Vec<_>, _>>()?;
    groups.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Some(StreamSummary {
        tenant: key.tenant().to_owned(),
        stream: key.stream().to_owned(),
        length: count(length, "a stream's length")?,
        last_id: match last_id {
            Value::Nil => None,
            last_id => Some(id(last_id, "a stream's newest id")?),
        },
        groups,
    }))
}

/// An entry as a read returns it: its id and fields, `None` when it was
/// trimmed or deleted.
type RawEntry = (StreamEntryId, Option<Fields>);

/// A duration in whole milliseconds, saturating.
fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// A blocking read's `BLOCK` in milliseconds: rounded up, since `BLOCK 0`
/// would wait forever.
fn block_millis(block: Duration) -> u64 {
    let millis = block.as_nanos().div_ceil(1_000_000);
    u64::try_from(millis).unwrap_or(u64::MAX).max(1)
}

/// The inclusive start of a range above `after`, `None` when nothing is.
fn start_above(after: StreamEntryId) -> Option<String> {
    let start = after.successor();
    (start != after).then(|| start.to_string())
}

/// Parses `[id, [field, value, ...]]` (fields `nil` for a deleted entry).
fn raw_entry(value: Value) -> Result<RawEntry, StoreError> {
    let [entry_id, fields] = tuple(value, "a stream entry")?;
    let entry_id = id(entry_id, "an entry id")?;
    if matches!(fields, Value::Nil) {
        return Ok((entry_id, None));
    }
    Ok((entry_id, Some(field_pairs(fields)?)))
}

fn field_pairs(value: Value) -> Result<Fields, StoreError> {
    let items = array(value, "an entry's fields")?;
    if items.len() % 2 != 0 {
        return Err(corrupt("an entry has an odd number of field values"));
    }
    let mut fields = Vec::with_capacity(items.len() / 2);
    let mut items = items.into_iter();
    while let (Some(name), Some(value)) = (items.next(), items.next()) {
        fields.push((bytes(name, "a field name")?, bytes(value, "a field value")?));
    }
    Ok(fields)
}

/// The entries of an `XREADGROUP` or `XREAD` reply on one stream.
fn read_reply(reply: Value) -> Result<Vec<RawEntry>, StoreError> {
    let Some(stream) = array(reply, "a read")?.into_iter().next() else {
        return Ok(Vec::new());
    };
    let [_key, entries] = tuple(stream, "a read's stream")?;
    array(entries, "a read's entries")?
        .into_iter()
        .map(raw_entry)
        .collect()
}

/// Parses a script's `{id, deliveries, fields}` row.
fn counted_entry(value: Value) -> Result<(RawEntry, u64), StoreError> {
    let [entry_id, deliveries, fields] = tuple(value, "a delivered entry")?;
    let deliveries = count(deliveries, "a delivery count")?;
    let raw = raw_entry(Value::Array(vec![entry_id, fields]))?;
    Ok((raw, deliveries))
}

fn delivered(
    entry_id: StreamEntryId,
    fields: Fields,
    deliveries: u64,
) -> Result<DeliveredEntry, StoreError> {
    if deliveries == 0 {
        return Err(corrupt(format_args!(
            "entry {entry_id} was delivered but has no delivery count"
        )));
    }
    Ok(DeliveredEntry {
        entry: decode(entry_id, fields),
        deliveries,
    })
}

impl RedisStreamStore {
    /// Runs `command` on the shared connection.
    async fn query(&self, command: &Cmd) -> redis::RedisResult<Value> {
        command.query_async(&mut self.connection()).await
    }

    /// The store's streams of `tenants` (`None`: all) after `after`, the
    /// first `limit + 1` in (tenant, stream) order, from a `SCAN` of its
    /// prefix (one of `{prefix}{tenant}:*` for a single tenant).
    async fn scan_streams(
        &self,
        tenants: Option<&[String]>,
        after: Option<&StreamKey>,
        limit: usize,
    ) -> Result<BTreeSet<StreamKey>, StoreError> {
        let pattern = match tenants {
            Some([tenant]) => format!("{}*", glob_literal(&format!("{}{tenant}:", self.prefix))),
            _ => format!("{}*", glob_literal(&self.prefix)),
        };
        let wanted: Option<BTreeSet<&str>> =
            tenants.map(|tenants| tenants.iter().map(String::as_str).collect());
        let mut found = BTreeSet::new();
        let mut cursor = "0".to_owned();
        loop {
            let mut command = redis::cmd("SCAN");
            command
                .arg(&cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .arg("TYPE")
                .arg("stream");
            let reply = self.query(&command).await.map_err(map)?;
            let [next, keys] = tuple(reply, "SCAN's reply")?;
            for key in array(keys, "SCAN's keys")? {
                let Some(key) = stream_key_of(&self.prefix, &bytes(key, "a key")?) else {
                    continue;
                };
                if wanted.as_ref().is_some_and(|w| !w.contains(key.tenant()))
                    || after.is_some_and(|after| &key <= after)
                {
                    continue;
                }
                found.insert(key);
                // Only the first limit + 1 are wanted: keep memory bounded.
                if found.len() > limit + 1 {
                    found.pop_last();
                }
            }
            cursor = text(next, "SCAN's cursor")?;
            if cursor == "0" {
                return Ok(found);
            }
        }
    }

    /// Runs a script on the shared connection.
    async fn invoke(&self, invocation: &ScriptInvocation<'_>) -> redis::RedisResult<Value> {
        invocation.invoke_async(&mut self.connection()).await
    }

    /// Runs `script` (`touch.lua`, `uncount.lua`: a change to those of `ids`
    /// pending to `consumer` in `group`, returning how many it changed)
    /// after checking the names and the count.
    async fn own_pending_script(
        &self,
        script: &Script,
        reply_name: &str,
        key: &StreamKey,
        group: &str,
        consumer: &str,
        ids: &[StreamEntryId],
    ) -> Result<u64, StoreError> {
        courier_core::validate_own_pending(group, consumer, ids)?;
        let mut invocation = script.key(self.redis_key(key));
        invocation.arg(group).arg(consumer);
        for entry_id in ids {
            invocation.arg(entry_id.to_string());
        }
        let reply = self
            .invoke(&invocation)
            .await
            .map_err(|e| map_group(e, key, group))?;
        count(reply, reply_name)
    }
}

impl StreamStore for RedisStreamStore {
    fn backend(&self) -> &'static str {
        "redis"
    }

    /// Four: with receipts in PostgreSQL, the bench's subscription ran at
    /// 0.57–0.63 of a raw `XREADGROUP` + `XACK` loop with four reads ahead
    /// and 0.48–0.50 with two, all else equal (BENCHMARKS.md, session 25).
    fn reads_ahead(&self) -> usize {
        4
    }

    /// Refuses an empty batch (field `entries`), like an oversized one.
    async fn append(
        &self,
        key: &StreamKey,
        entries: &[NewStreamEntry],
    ) -> Result<Vec<StreamEntryId>, StoreError> {
        validate_count("entries", entries.len())?;
        // The current span's trace context goes with entries that carry none.
        let traced = courier_core::entries_with_current_context(entries);
        let entries: &[NewStreamEntry] = &traced;
        let mut invocation = self.shared.scripts.append.key(self.redis_key(key));
        for (index, entry) in entries.iter().enumerate() {
            let fields = encode(entry, entry.validate(index, MAX_PAYLOAD_BYTES)?);
            invocation.arg(fields.len()).arg(fields);
        }
        let reply = self.invoke(&invocation).await.map_err(map)?;
        let ids = array(reply, "append's ids")?
            .into_iter()
            .map(|value| id(value, "an appended id"))
            .collect::<Result<Vec<_>, _>>()?;
        if ids.len() != entries.len() {
            return Err(corrupt(format_args!(
                "{} ids for {} appended entries",
                ids.len(),
                entries.len()
            )));
        }
        Ok(ids)
    }

    async fn ensure_group(
        &self,
        key: &StreamKey,
        group: &str,
        start: GroupStart,
    ) -> Result<bool, StoreError> {
        validate_name("group", group)?;
        let start = match start {
            GroupStart::Beginning => "0".to_owned(),
            GroupStart::End => "$".to_owned(),
            GroupStart::After(after) => after.to_string(),
        };
        let mut command = redis::cmd("XGROUP");
        command
            .arg("CREATE")
            .arg(self.redis_key(key))
            .arg(group)
            .arg(start)
            .arg("MKSTREAM");
        match self.query(&command).await {
            Ok(_) => Ok(true),
            Err(error) if error.code() == Some("BUSYGROUP") => Ok(false),
            Err(error) => Err(map(error)),
        }
    }

    /// First reads without blocking, on the shared connection (pipelined
    /// with the command that creates the consumer); only when nothing is ready and
    /// `block` is set does it wait, on a dedicated connection. A `block` of
    /// zero does not wait (Redis's `BLOCK 0` would wait forever).
    async fn read_new(
        &self,
        key: &StreamKey,
        read: &ReadNew,
    ) -> Result<Vec<DeliveredEntry>, StoreError> {
        read.validate()?;
        // The read and then CREATECONSUMER, in one round trip: Redis 7.0
        // creates a consumer only when a read hands it something, but a
        // consumer exists from its first read on, whatever it got. Not a
        // script: a script's reply of 100 entries costs Redis more than the
        // read itself (313 µs against 118-146 µs per call, INFO
        // commandstats).
        let redis_key = self.redis_key(key);
        let mut read_command = redis::cmd("XREADGROUP");
        read_command
            .arg("GROUP")
            .arg(&read.group)
            .arg(&read.consumer)
            .arg("COUNT")
            .arg(read.count)
            .arg("STREAMS")
            .arg(&redis_key)
            .arg(">");
        let mut create_command = redis::cmd("XGROUP");
        create_command
            .arg("CREATECONSUMER")
            .arg(&redis_key)
            .arg(&read.group)
            .arg(&read.consumer);
        let mut pipeline = redis::pipe();
        pipeline
            .ignore_errors()
            .add_command(read_command)
            .add_command(create_command);
        let replies: Vec<redis::RedisResult<Value>> = pipeline
            .query_async(&mut self.connection())
            .await
            .map_err(map)?;
        let mut replies = replies.into_iter();
        let (Some(read_reply_value), Some(created)) = (replies.next(), replies.next()) else {
            return Err(corrupt("a read's pipeline answered fewer than two replies"));
        };
        // The read's error first: a missing stream or group fails both.
        let reply = read_reply_value.map_err(|e| map_group(e, key, &read.group))?;
        created.map_err(|e| map_group(e, key, &read.group))?;
        let mut entries = read_reply(reply)?;
        if let Some(block) = read.block.filter(|block| !block.is_zero()) {
            if entries.is_empty() {
                let mut command = redis::cmd("XREADGROUP");
                command
                    .arg("GROUP")
                    .arg(&read.group)
                    .arg(&read.consumer)
                    .arg("COUNT")
                    .arg(read.count)
                    .arg("BLOCK")
                    .arg(block_millis(block))
                    .arg("STREAMS")
                    .arg(self.redis_key(key))
                    .arg(">");
                let timeout = block.saturating_add(self.shared.config.response_timeout);
                let reply = self
                    .blocking
                    .query(&command, timeout)
                    .await
                    .map_err(|e| map_group(e, key, &read.group))?;
                entries = read_reply(reply)?;
            }
        }
        entries
            .into_iter()
            .map(|(entry_id, fields)| {
                let fields = fields.ok_or_else(|| {
                    corrupt(format_args!("a new read returned deleted entry {entry_id}"))
                })?;
                delivered(entry_id, fields, 1)
            })
            .collect()
    }

    async fn read_pending(
        &self,
        key: &StreamKey,
        group: &str,
        consumer: &str,
        after: StreamEntryId,
        count: usize,
    ) -> Result<Vec<PendingEntry>, StoreError> {
        validate_name("group", group)?;
        validate_name("consumer", consumer)?;
        validate_count("count", count)?;
        let mut invocation = self.shared.scripts.read_pending.key(self.redis_key(key));
        invocation
            .arg(group)
            .arg(consumer)
            .arg(after.to_string())
            .arg(count);
        let reply = self
            .invoke(&invocation)
            .await
            .map_err(|e| map_group(e, key, group))?;
        array(reply, "read_pending's entries")?
            .into_iter()
            .map(|row| {
                let ((entry_id, fields), deliveries) = counted_entry(row)?;
                Ok(match fields {
                    Some(fields) => PendingEntry::Present(delivered(entry_id, fields, deliveries)?),
                    None => PendingEntry::Deleted(entry_id),
                })
            })
            .collect()
    }

    async fn claim_idle(
        &self,
        key: &StreamKey,
        claim: &ClaimIdle,
    ) -> Result<ClaimedEntries, StoreError> {
        claim.validate()?;
        let mut invocation = self.shared.scripts.claim_idle.key(self.redis_key(key));
        invocation
            .arg(&claim.group)
            .arg(&claim.consumer)
            .arg(millis(claim.min_idle))
            .arg(claim.cursor.to_string())
            .arg(claim.count);
        let reply = self
            .invoke(&invocation)
            .await
            .map_err(|e| map_group(e, key, &claim.group))?;
        let [next, entries, deleted] = tuple(reply, "claim_idle's reply")?;
        let mut claimed = ClaimedEntries {
            next: id(next, "a claim's next cursor")?,
            ..ClaimedEntries::default()
        };
        for value in array(deleted, "a claim's deleted ids")? {
            claimed.deleted.push(id(value, "a deleted id")?);
        }
        for row in array(entries, "a claim's entries")? {
            match counted_entry(row)? {
                ((entry_id, Some(fields)), deliveries) => {
                    claimed
                        .entries
                        .push(delivered(entry_id, fields, deliveries)?);
                }
                // Redis 6.2 listed trimmed entries among the claimed ones.
                ((entry_id, None), _) => claimed.deleted.push(entry_id),
            }
        }
        Ok(claimed)
    }

    /// Refuses an empty list of ids (field `ids`), like an oversized one.
    async fn touch(
        &self,
        key: &StreamKey,
        group: &str,
        consumer: &str,
        ids: &[StreamEntryId],
    ) -> Result<u64, StoreError> {
        let script = &self.shared.scripts.touch;
        self.own_pending_script(script, "touch's count", key, group, consumer, ids)
            .await
    }

    /// Refuses an empty list of ids (field `ids`), like an oversized one.
    async fn uncount_deliveries(
        &self,
        key: &StreamKey,
        group: &str,
        consumer: &str,
        ids: &[StreamEntryId],
    ) -> Result<u64, StoreError> {
        let script = &self.shared.scripts.uncount;
        self.own_pending_script(script, "uncount's count", key, group, consumer, ids)
            .await
    }

    /// Refuses an empty list of ids (field `ids`), like an oversized one.
    async fn ack(
        &self,
        key: &StreamKey,
        group: &str,
        ids: &[StreamEntryId],
    ) -> Result<u64, StoreError> {
        validate_name("group", group)?;
        validate_count("ids", ids.len())?;
        let redis_key = self.redis_key(key);
        let mut command = redis::cmd("XACK");
        command.arg(&redis_key).arg(group);
        for entry_id in ids {
            command.arg(entry_id.to_string());
        }
        let reply = self
            .query(&command)
            .await
            .map_err(|e| map_group(e, key, group))?;
        let acked = count(reply, "ack's count")?;
        if acked == 0 {
            // XACK answers 0 for a missing stream or group too; XPENDING
            // (count 0 reads nothing) fails with NOGROUP for those.
            let mut check = redis::cmd("XPENDING");
            check.arg(&redis_key).arg(group).arg("-").arg("+").arg(0);
            self.query(&check)
                .await
                .map_err(|e| map_group(e, key, group))?;
        }
        Ok(acked)
    }

    async fn visibility_wait(&self, _key: &StreamKey) -> Result<Option<Duration>, StoreError> {
        // An XADD is readable as soon as it is answered.
        Ok(None)
    }

    /// From `XINFO GROUPS` (Redis 7.0 or later): its `lag`, which Redis
    /// leaves out (nil) when entries were deleted from the part not read yet.
    async fn lag(&self, key: &StreamKey, group: &str) -> Result<Option<u64>, StoreError> {
        validate_name("group", group)?;
        let mut command = redis::cmd("XINFO");
        command.arg("GROUPS").arg(self.redis_key(key));
        let reply = match self.query(&command).await {
            Ok(reply) => reply,
            // No stream: no group either.
            Err(error) if error.code() == Some("ERR") => return Err(group_not_found(key, group)),
            Err(error) => return Err(map(error)),
        };
        for row in array(reply, "XINFO GROUPS")? {
            let mut name = None;
            let mut lag = None;
            for (field, value) in pairs(row, "a group of XINFO GROUPS")? {
                match field.as_str() {
                    "name" => name = Some(text(value, "a group name")?),
                    "lag" => lag = Some(value),
                    _ => {}
                }
            }
            if name.as_deref() != Some(group) {
                continue;
            }
            return match lag {
                None | Some(Value::Nil) => Ok(None),
                Some(lag) => Ok(Some(count(lag, "a group's lag")?)),
            };
        }
        Err(group_not_found(key, group))
    }

    async fn pending_summary(
        &self,
        key: &StreamKey,
        group: &str,
    ) -> Result<PendingSummary, StoreError> {
        validate_name("group", group)?;
        let mut command = redis::cmd("XPENDING");
        command.arg(self.redis_key(key)).arg(group);
        let reply = self
            .query(&command)
            .await
            .map_err(|e| map_group(e, key, group))?;
        let [total, lowest, highest, consumers] = tuple(reply, "XPENDING's summary")?;
        let optional_id = |value: Value| match value {
            Value::Nil => Ok(None),
            value => id(value, "a pending id").map(Some),
        };
        let mut summary = PendingSummary {
            count: count(total, "the pending count")?,
            lowest: optional_id(lowest)?,
            highest: optional_id(highest)?,
            consumers: BTreeMap::new(),
        };
        for row in array(consumers, "the pending consumers")? {
            let [name, pending] = tuple(row, "a pending consumer")?;
            let pending = count(pending, "a consumer's pending count")?;
            if pending > 0 {
                summary
                    .consumers
                    .insert(text(name, "a consumer name")?, pending);
            }
        }
        Ok(summary)
    }

    async fn pending_detail(
        &self,
        key: &StreamKey,
        group: &str,
        query: &PendingQuery,
    ) -> Result<Vec<PendingDetail>, StoreError> {
        validate_name("group", group)?;
        query.validate()?;
        let mut command = redis::cmd("XPENDING");
        command.arg(self.redis_key(key)).arg(group);
        if let Some(min_idle) = query.min_idle {
            command.arg("IDLE").arg(millis(min_idle));
        }
        match start_above(query.after) {
            Some(start) => command.arg(start).arg("+").arg(query.count),
            // Nothing is above the last possible id: ask for nothing, which
            // still fails for a missing group.
            None => command.arg("-").arg("+").arg(0),
        };
        if let Some(consumer) = &query.consumer {
            command.arg(consumer);
        }
        let reply = self
            .query(&command)
            .await
            .map_err(|e| map_group(e, key, group))?;
        array(reply, "XPENDING's entries")?
            .into_iter()
            .map(|row| {
                let [entry_id, consumer, idle, deliveries] = tuple(row, "a pending entry")?;
                Ok(PendingDetail {
                    id: id(entry_id, "a pending id")?,
                    consumer: text(consumer, "a consumer name")?,
                    idle: Duration::from_millis(count(idle, "an idle time")?),
                    deliveries: count(deliveries, "a delivery count")?,
                })
            })
            .collect()
    }

    /// A consumer's `idle` is Redis's: the time since it last tried to read
    /// or claim (successful or not), not Redis 7.2's `inactive`.
    async fn consumers(
        &self,
        key: &StreamKey,
        group: &str,
    ) -> Result<Vec<ConsumerInfo>, StoreError> {
        validate_name("group", group)?;
        let mut command = redis::cmd("XINFO");
        command.arg("CONSUMERS").arg(self.redis_key(key)).arg(group);
        let reply = self
            .query(&command)
            .await
            .map_err(|e| map_group(e, key, group))?;
        let mut consumers = array(reply, "XINFO CONSUMERS")?
            .into_iter()
            .map(|row| {
                let (mut name, mut pending, mut idle) = (None, 0, 0);
                for (field, value) in pairs(row, "a consumer")? {
                    match field.as_str() {
                        "name" => name = Some(text(value, "a consumer name")?),
                        "pending" => pending = count(value, "a consumer's pending count")?,
                        "idle" => idle = count(value, "a consumer's idle time")?,
                        _ => {}
                    }
                }
                Ok(ConsumerInfo {
                    name: name.ok_or_else(|| corrupt("a consumer without a name"))?,
                    pending,
                    idle: Duration::from_millis(idle),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        consumers.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(consumers)
    }

    async fn delete_consumer(
        &self,
        key: &StreamKey,
        group: &str,
        consumer: &str,
    ) -> Result<ConsumerRemoval, StoreError> {
        validate_name("group", group)?;
        validate_name("consumer", consumer)?;
        let mut invocation = self.shared.scripts.delete_consumer.key(self.redis_key(key));
        invocation.arg(group).arg(consumer);
        let reply = self
            .invoke(&invocation)
            .await
            .map_err(|e| map_group(e, key, group))?;
        let [outcome, pending] = tuple(reply, "delete_consumer's reply")?;
        match text(outcome, "delete_consumer's outcome")?.as_str() {
            "deleted" => Ok(ConsumerRemoval::Deleted),
            "missing" => Ok(ConsumerRemoval::NotFound),
            "pending" => Ok(ConsumerRemoval::HasPending(count(
                pending,
                "a consumer's pending count",
            )?)),
            other => Err(corrupt(format_args!("delete_consumer answered {other:?}"))),
        }
    }

    async fn range(
        &self,
        key: &StreamKey,
        after: StreamEntryId,
        count: usize,
    ) -> Result<Vec<StreamEntry>, StoreError> {
        validate_count("count", count)?;
        let Some(start) = start_above(after) else {
            return Ok(Vec::new());
        };
        let mut command = redis::cmd("XRANGE");
        command
            .arg(self.redis_key(key))
            .arg(start)
            .arg("+")
            .arg("COUNT")
            .arg(count);
        let reply = self.query(&command).await.map_err(map)?;
        array(reply, "XRANGE's entries")?
            .into_iter()
            .map(|value| match raw_entry(value)? {
                (entry_id, Some(fields)) => Ok(decode(entry_id, fields)),
                (entry_id, None) => Err(corrupt(format_args!(
                    "XRANGE returned deleted entry {entry_id}"
                ))),
            })
            .collect()
    }

    /// Exact trims (`=`, not `~`). A `MaxLen` above `i64::MAX` keeps everything.
    async fn trim(&self, key: &StreamKey, bound: TrimBound) -> Result<u64, StoreError> {
        let mut command = redis::cmd("XTRIM");
        command.arg(self.redis_key(key));
        match bound {
            TrimBound::MaxLen(len) => {
                command
                    .arg("MAXLEN")
                    .arg("=")
                    .arg(i64::try_from(len).unwrap_or(i64::MAX));
            }
            TrimBound::MinId(min) => {
                command.arg("MINID").arg("=").arg(min.to_string());
            }
        }
        let reply = self.query(&command).await.map_err(map)?;
        count(reply, "XTRIM's count")
    }

    /// The dead-letter entry is not held to append's limits (payload size,
    /// header count): the entry it keeps was already stored.
    async fn dead_letter(
        &self,
        key: &StreamKey,
        group: &str,
        entry: &DeliveredEntry,
        errors: &[String],
    ) -> Result<bool, StoreError> {
        validate_name("group", group)?;
        let dead_key = key.dead_letters()?;
        let dead = dead_letter_entry(key, entry, errors);
        let payload = serde_json::to_string(&dead.payload)
            .map_err(|e| ValidationError::new("payload", e.to_string()))?;
        let mut invocation = self.shared.scripts.dead_letter.key(self.redis_key(key));
        invocation
            .key(self.redis_key(&dead_key))
            .arg(group)
            .arg(entry.entry.id.to_string())
            .arg(encode(&dead, payload));
        let reply = self
            .invoke(&invocation)
            .await
            .map_err(|e| map_group(e, key, group))?;
        Ok(int(reply, "dead_letter's outcome")? == 1)
    }

    /// Walks every key of the store's prefix with `SCAN ... TYPE stream`
    /// (of `{prefix}{tenant}:` for one tenant), skipping keys whose rest is
    /// not a valid `{tenant}:{stream}`, and sums up the page's streams with
    /// one script. A stream deleted between the two is left out of its page.
    async fn list_streams(
        &self,
        tenants: Option<&[String]>,
        after: Option<&StreamKey>,
        limit: usize,
    ) -> Result<StreamPage, StoreError> {
        validate_tenants(tenants)?;
        let limit = limit.clamp(1, MAX_STREAM_PAGE);
        if tenants.is_some_and(<[String]>::is_empty) {
            return Ok(StreamPage::default());
        }
        let mut keys: Vec<StreamKey> = self
            .scan_streams(tenants, after, limit)
            .await?
            .into_iter()
            .collect();
        let more = keys.len() > limit;
        keys.truncate(limit);
        let mut page = StreamPage {
            items: Vec::with_capacity(keys.len()),
            next: if more { keys.last().cloned() } else { None },
        };
        if keys.is_empty() {
            return Ok(page);
        }
        let mut invocation = self.shared.scripts.stream_summaries.prepare_invoke();
        for key in &keys {
            invocation.key(format!("{}{}:{}", self.prefix, key.tenant(), key.stream()));
        }
        let reply = self.invoke(&invocation).await.map_err(map)?;
        let summaries = array(reply, "stream_summaries's reply")?;
        if summaries.len() != keys.len() {
            return Err(corrupt(format_args!(
                "{} summaries of {} streams",
                summaries.len(),
                keys.len()
            )));
        }
        for (key, summary) in keys.into_iter().zip(summaries) {
            page.items.extend(stream_summary(key, summary)?);
        }
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_up_to_a_millisecond() {
        assert_eq!(block_millis(Duration::from_micros(1)), 1);
        assert_eq!(block_millis(Duration::from_micros(1_500)), 2);
        assert_eq!(block_millis(Duration::from_secs(30)), 30_000);
    }

    #[test]
    fn keys_parse_under_their_prefix_and_patterns_match_it_literally() {
        let key = stream_key_of("p*:", b"p*:acme:orders.dead").unwrap();
        assert_eq!((key.tenant(), key.stream()), ("acme", "orders.dead"));
        for foreign in [
            &b"q:acme:orders"[..],
            b"p*:acme",
            b"p*:acme:a:b",
            b"p*::orders",
            b"p*:acme:\xff",
        ] {
            assert_eq!(stream_key_of("p*:", foreign), None, "{foreign:?}");
        }
        assert_eq!(glob_literal("a*b?[c]\\^:"), "a\\*b\\?\\[c\\]\\\\\\^:");
    }

    #[test]
    fn nothing_is_above_the_last_id() {
        assert_eq!(start_above(StreamEntryId::ZERO).as_deref(), Some("0-1"));
        assert_eq!(start_above(StreamEntryId::new(u64::MAX, u64::MAX)), None);
    }
}
