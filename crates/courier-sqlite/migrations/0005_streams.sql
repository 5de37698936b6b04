-- Courier's SQLite schema, version 5: native streams and consumer groups
-- (the `StreamStore` seam, with Redis Streams' semantics). Times are INTEGER
-- milliseconds on the database clock; a stream exists as long as it has
-- entries or groups, so there is no table of streams.

-- The entries of every tenant's streams. An entry's id is its rowid, written
-- `rowid-0`. AUTOINCREMENT: a rowid is never reused, not even after a trim
-- deleted the newest entry, so an append always lands above every id a
-- group's cursor may already have passed.
CREATE TABLE stream_entries (
  id             INTEGER PRIMARY KEY AUTOINCREMENT,
  tenant         TEXT    NOT NULL,
  stream         TEXT    NOT NULL,
  payload        TEXT    NOT NULL CHECK (json_valid(payload)),
  headers        TEXT    NOT NULL DEFAULT '{}'
                 CHECK (json_valid(headers) AND json_type(headers) = 'object'),
  -- The outbox message it relays: all four origin columns or none.
  message_id     TEXT,
  origin_tenant  TEXT,
  topic          TEXT,
  schema_version INTEGER,
  created_at     INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)),
  CHECK ((message_id IS NULL) = (origin_tenant IS NULL)
         AND (message_id IS NULL) = (topic IS NULL)
         AND (message_id IS NULL) = (schema_version IS NULL))
) STRICT;

-- Reads, ranges and trims walk a stream in id order.
CREATE INDEX stream_entries_position ON stream_entries (tenant, stream, id);
-- A relay looks up whether a stream already holds a message. Not UNIQUE: the
-- trait's append does not dedupe, and every group that dead-letters a
-- relayed entry appends its own copy (same origin) to `{stream}.dead`.
CREATE INDEX stream_entries_origin ON stream_entries (tenant, stream, message_id)
  WHERE message_id IS NOT NULL;

-- Consumer groups: each reads the stream once, from its cursor `last_id`
-- (the highest entry id it has handed out, or where it was told to start).
CREATE TABLE stream_groups (
  tenant     TEXT    NOT NULL,
  stream     TEXT    NOT NULL,
  group_name TEXT    NOT NULL,
  last_id    INTEGER NOT NULL CHECK (last_id >= 0),
  created_at INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)),
  PRIMARY KEY (tenant, stream, group_name)
) STRICT;

-- A group's consumers, created on their first read or claim; `seen_at` is
-- their last read or claim.
CREATE TABLE stream_consumers (
  tenant     TEXT    NOT NULL,
  stream     TEXT    NOT NULL,
  group_name TEXT    NOT NULL,
  consumer   TEXT    NOT NULL,
  seen_at    INTEGER NOT NULL,
  PRIMARY KEY (tenant, stream, group_name, consumer)
) STRICT;

-- Entries a group handed out and nobody has acked yet, with the consumer
-- each is pending for. A row outlives a trim of its entry (its re-read
-- reports it deleted) until it is acked or claimed.
CREATE TABLE stream_pending (
  tenant       TEXT    NOT NULL,
  stream       TEXT    NOT NULL,
  group_name   TEXT    NOT NULL,
  entry_id     INTEGER NOT NULL,
  consumer     TEXT    NOT NULL,
  delivered_at INTEGER NOT NULL,
  deliveries   INTEGER NOT NULL CHECK (deliveries >= 1),
  PRIMARY KEY (tenant, stream, group_name, entry_id)
) STRICT;

-- A consumer's own pending list, in id order (re-reads, counts, the refusal
-- to delete a consumer that still has entries).
CREATE INDEX stream_pending_consumer
  ON stream_pending (tenant, stream, group_name, consumer, entry_id);

-- Receipts of stream subscriptions: entry `correlation_id`
-- (`{subscription}:{stream}:{entry id}`) took effect. Written with a
-- transactional handler's effect, or after a plain one; pruned with the
-- outbox's receipts.
CREATE TABLE stream_receipts (
  subscription   TEXT    NOT NULL,
  correlation_id TEXT    NOT NULL,
  created_at     INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)),
  PRIMARY KEY (subscription, correlation_id)
) STRICT;

CREATE INDEX stream_receipts_created ON stream_receipts (created_at);
