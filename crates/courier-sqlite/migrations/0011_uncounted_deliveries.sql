-- Courier's outbox schema for SQLite, version 11: a stream subscription
-- takes back the delivery of an entry it read but did not handle (a
-- deferral, an entry of its batch not run), so that such deliveries count
-- against max_deliveries nowhere, whichever consumer takes the entry next.
-- An entry read once and deferred is then pending with 0 deliveries, which
-- stream_pending's CHECK (deliveries >= 1) refused. SQLite cannot alter a
-- CHECK: the table is rebuilt with the same columns, rows and index.
CREATE TABLE stream_pending_v11 (
  tenant       TEXT    NOT NULL,
  stream       TEXT    NOT NULL,
  group_name   TEXT    NOT NULL,
  entry_id     INTEGER NOT NULL,
  consumer     TEXT    NOT NULL,
  delivered_at INTEGER NOT NULL,
  deliveries   INTEGER NOT NULL CHECK (deliveries >= 0),
  PRIMARY KEY (tenant, stream, group_name, entry_id)
) STRICT;

INSERT INTO stream_pending_v11
  (tenant, stream, group_name, entry_id, consumer, delivered_at, deliveries)
SELECT tenant, stream, group_name, entry_id, consumer, delivered_at, deliveries
FROM stream_pending;

DROP TABLE stream_pending;
ALTER TABLE stream_pending_v11 RENAME TO stream_pending;

-- A consumer's own pending list, in id order (re-reads, counts, the refusal
-- to delete a consumer that still has entries).
CREATE INDEX stream_pending_consumer
  ON stream_pending (tenant, stream, group_name, consumer, entry_id);
