-- Delivers again up to ?6 of consumer ?4's own pending entries above id ?5
-- in group ?3 of stream (?1 tenant, ?2 stream): one more delivery each, now.
-- Returns their ids and delivery counts; the caller fetches the entries
-- (trimmed ones are gone from stream_entries but stay pending).
-- Touches: stream_pending (update along stream_pending_consumer). Locks:
-- inside the read's BEGIN IMMEDIATE.
-- Shape: RETURNING's order is unspecified; the caller sorts by id.
UPDATE stream_pending
SET deliveries = deliveries + 1,
    delivered_at = CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
WHERE tenant = ?1 AND stream = ?2 AND group_name = ?3
  AND entry_id IN (
    SELECT p.entry_id FROM stream_pending p
    WHERE p.tenant = ?1 AND p.stream = ?2 AND p.group_name = ?3 AND p.consumer = ?4
      AND p.entry_id > ?5
    ORDER BY p.entry_id
    LIMIT ?6)
RETURNING entry_id, deliveries
