-- The baseline: the least a queue on PostgreSQL can do. One table, no
-- fan-out, no leases, no receipts: a row is inserted, then claimed and
-- removed in one statement. Courier's numbers are divided by this one's.
CREATE TABLE {schema}.baseline_queue (
  id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  tenant     text        NOT NULL,
  topic      text        NOT NULL,
  payload    jsonb       NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
)
