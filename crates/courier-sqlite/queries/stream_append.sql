-- Appends a batch of entries to stream (?1 tenant, ?2 stream). ?3 is a JSON
-- array of [payload, headers, message_id, origin_tenant, topic,
-- schema_version] per entry, payload and headers as JSON text, the origin
-- fields null for an entry that relays nothing.
-- Touches: stream_entries (insert). Locks: the write lock, inside the
-- append's BEGIN IMMEDIATE transaction.
-- Shape: one statement for the whole batch, so it is all or nothing; rows
-- are inserted in array order and AUTOINCREMENT hands them consecutive ids
-- above every id ever used. RETURNING's order is unspecified: the caller
-- sorts the ids.
INSERT INTO stream_entries
  (tenant, stream, payload, headers, message_id, origin_tenant, topic, schema_version)
SELECT ?1, ?2, e.value ->> 0, e.value ->> 1, e.value ->> 2, e.value ->> 3, e.value ->> 4,
       e.value ->> 5
FROM json_each(?3) AS e
ORDER BY e.key
RETURNING id
