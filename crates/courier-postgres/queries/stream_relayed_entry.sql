-- The lowest entry of stream ($1, $2) that relays outbox message $3, if any.
-- Touches: stream_entries (read, index stream_entries_origin). Locks: none.
-- Shape: plain MVCC visibility, not the readers' xmin horizon: the relay
-- asks "did an append of this message commit?", and an entry of a committed
-- transaction above the horizon counts. Run in the relaying transaction, so
-- its own earlier appends count too.
SELECT e.major, e.minor
FROM {schema}.stream_entries e
WHERE e.tenant = $1 AND e.stream = $2 AND e.message_id = $3
ORDER BY e.major, e.minor
LIMIT 1
