-- Courier's outbox schema for SQLite, version 6: indexes in the order
-- operators' lists walk, so a time-range filter is an index range, not a
-- filter on a walk.
--
-- Messages are listed newest first by (created_at, id): the enqueue time the
-- listing shows and filters on, the id breaking ties (many messages share a
-- millisecond). It replaces messages_created_at, which retention scanned by;
-- it serves that scan too. Dead letters are listed oldest first by
-- (dead_at, id), which a dead_at range seeks into.
CREATE INDEX messages_enqueued ON messages (created_at, id);
DROP INDEX messages_created_at;
CREATE INDEX deliveries_dead_at ON deliveries (dead_at, id) WHERE state = 'dead';
