-- One message of enqueue.sql: id, tenant, topic, schema_version, payload,
-- headers, ordering_key, idempotency_key, occurred_at (ms), then available_at:
-- the producer's instant (ms) if given, else the database clock plus a delay
-- (ms); then priority.
-- Lines starting with "--" are stripped before the tuple is repeated.
(?, ?, ?, ?, ?, ?, ?, ?, ?, coalesce(?, CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + coalesce(?, 0)), ?)
