-- The lowest entry of outbox message $3 in stream ($1, $2), as a new
-- snapshot sees it: after stream_relay_append found that a concurrent
-- transaction appended the message first and committed.
-- Touches: stream_entries (read by stream_entries_origin).
SELECT o.major, o.minor
FROM (
  SELECT e.major, e.minor
  FROM {schema}.stream_entries e
  WHERE e.tenant = $1 AND e.stream = $2 AND e.message_id = $3
  OFFSET 0
) o
ORDER BY o.major, o.minor
LIMIT 1
