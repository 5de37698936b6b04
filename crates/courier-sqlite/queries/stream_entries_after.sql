-- Up to ?4 entries of stream (?1 tenant, ?2 stream) above id ?3, in id order:
-- a group's next entries (?3 its cursor) or a range outside any group.
-- Touches: stream_entries (read along stream_entries_position). Locks: none
-- of its own (a group read runs it inside its write transaction).
SELECT id, payload, headers, message_id, origin_tenant, topic, schema_version
FROM stream_entries
WHERE tenant = ?1 AND stream = ?2 AND id > ?3
ORDER BY id
LIMIT ?4
