-- Courier's outbox schema, version 12: indexes in the order operators' lists
-- walk, so a time-range filter is an index range, not a filter on a walk.
--
-- Messages are listed newest first by (created_at, id): the enqueue time the
-- listing shows and filters on (`enqueued_after`, `enqueued_before`), with the
-- id breaking ties within a transaction. Ordering by id alone cannot serve a
-- time range exactly: producers may supply their own ids, so an id's time
-- need not be its enqueue time. The btree replaces the BRIN index retention
-- scanned by; it serves that scan too.
--
-- Dead letters are listed oldest first by (dead_at, id), which a `dead_after`
-- / `dead_before` range seeks into; partial like deliveries_dead, so open
-- work never enters it.
--
-- Built inside the migration's transaction (CREATE INDEX CONCURRENTLY cannot
-- run in one), so enqueues wait while messages_enqueued is built: on a large
-- outbox plan the upgrade for a quiet moment.
CREATE INDEX messages_enqueued ON {schema}.messages (created_at, id);
DROP INDEX {schema}.messages_created_at;
CREATE INDEX deliveries_dead_at ON {schema}.deliveries (dead_at, id) WHERE state = 'dead';
