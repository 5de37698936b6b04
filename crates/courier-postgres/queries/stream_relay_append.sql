-- The native relay's append: entry $3.. of outbox message $5 to stream ($1,
-- $2) unless the stream already holds an entry of that message; the look and
-- the append in one round trip. Returns one row: the appended entry's id
-- (duplicate false), or the lowest existing entry's (duplicate true).
-- Touches: stream_entries (read by stream_entries_origin, insert),
-- stream_waiters (read), the minor sequence. Locks: a transaction-level
-- advisory lock on (tenant, stream, message id), so that two transactions
-- relaying one message to one stream at once append it once (migration
-- 0018). The look sees plain MVCC visibility, not the readers' xmin
-- horizon: the relay asks "did an append of this message commit?", and an
-- entry of a committed transaction above the horizon counts, as do the
-- caller's own earlier appends.
SELECT r.entry_major AS major, r.entry_minor AS minor, r.is_duplicate AS duplicate
FROM {schema}.relay_append($1, $2, $3::jsonb, $4::jsonb, $5, $6, $7, $8) r
