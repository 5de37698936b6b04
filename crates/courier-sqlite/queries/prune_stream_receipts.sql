-- Retention: deletes up to ?2 stream receipts older than ?1 ms.
-- Touches: stream_receipts (delete). Locks: one short autocommit statement.
DELETE FROM stream_receipts
WHERE rowid IN (
  SELECT rowid FROM stream_receipts
  WHERE created_at < CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - ?1
  LIMIT ?2
)
