-- The lowest entry of stream ($1, $2) that relays outbox message $3, if any.
-- Touches: stream_entries (read, index stream_entries_origin). Locks: none.
-- Shape: plain MVCC visibility, not the readers' xmin horizon: the relay
-- asks "did an append of this message commit?", and an entry of a committed
-- transaction above the horizon counts. Run in the relaying transaction, so
-- its own earlier appends count too.
-- OFFSET 0 keeps the ORDER BY ... LIMIT 1 out of the inner query's plan:
-- with it, the generic plan walked the stream in id order (its primary key)
-- filtering on message_id, a scan of the whole stream per relayed message.
SELECT o.major, o.minor
FROM (
  SELECT e.major, e.minor
  FROM {schema}.stream_entries e
  WHERE e.tenant = $1 AND e.stream = $2 AND e.message_id = $3
  OFFSET 0
) o
ORDER BY o.major, o.minor
LIMIT 1
