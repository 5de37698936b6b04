-- Trims stream (?1 tenant, ?2 stream) to its newest ?3 entries: deletes the
-- (?3 + 1)-th newest and everything older (nothing when there are no more
-- than ?3). Pending rows stay: their re-reads report the entries deleted.
-- Touches: stream_entries (delete along stream_entries_position). Locks:
-- one autocommit statement.
DELETE FROM stream_entries
WHERE tenant = ?1 AND stream = ?2
  AND id <= coalesce((SELECT e.id FROM stream_entries e
                      WHERE e.tenant = ?1 AND e.stream = ?2
                      ORDER BY e.id DESC
                      LIMIT 1 OFFSET ?3), -1)
