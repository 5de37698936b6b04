-- Retention: deletes up to ?2 receipts older than ?1 ms, by receipts_completed_at.
-- Touches: receipts (delete). Locks: one short autocommit statement.
DELETE FROM receipts
WHERE rowid IN (
  SELECT rowid FROM receipts
  WHERE completed_at < CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - ?1
  LIMIT ?2
)
