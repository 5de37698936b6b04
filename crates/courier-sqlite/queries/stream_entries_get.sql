-- The entries of stream (?1 tenant, ?2 stream) whose ids are in the JSON
-- array ?3 (trimmed ones are missing), in id order.
-- Touches: stream_entries (read by primary key). Locks: none of its own.
SELECT id, payload, headers, message_id, origin_tenant, topic, schema_version
FROM stream_entries
WHERE id IN (SELECT value FROM json_each(?3)) AND tenant = ?1 AND stream = ?2
ORDER BY id
