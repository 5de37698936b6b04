-- Inserts a batch of messages in one statement; the rows placeholder below is
-- replaced by one enqueue_row.sql tuple per message (12 bound parameters each).
-- Touches: messages (insert) and, through the fan-out trigger, deliveries.
-- Locks: the database's write lock, for the caller's transaction (SQLite has
-- one writer; open producer transactions with BEGIN IMMEDIATE).
-- Shape: a repeated (tenant, idempotency key) is skipped, not an error, and is
-- missing from RETURNING; the caller looks up the first message's id for those.
-- Rows are inserted in VALUES order, so the trigger creates deliveries in enqueue order.
INSERT INTO messages
  (id, tenant, topic, schema_version, payload, headers, ordering_key, idempotency_key,
   occurred_at, available_at, priority)
VALUES
{rows}
ON CONFLICT (tenant, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id
