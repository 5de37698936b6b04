-- The lowest entry of stream (?1 tenant, ?2 stream) that relays outbox
-- message ?3 (its id as text), if any.
-- Touches: stream_entries (read, index stream_entries_origin). Locks: none
-- beyond the caller's transaction (a relay runs it inside the delivery's
-- BEGIN IMMEDIATE, so no other writer can append between this look and the
-- append that follows it).
SELECT id
FROM stream_entries
WHERE tenant = ?1 AND stream = ?2 AND message_id = ?3
ORDER BY id
LIMIT 1
