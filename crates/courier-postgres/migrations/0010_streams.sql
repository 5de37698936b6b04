-- Courier's outbox schema, version 10: native streams with consumer groups
-- (the Redis Streams model in PostgreSQL).
--
-- An entry's id is (major, minor): major is the appending transaction's id
-- (pg_current_xact_id(), 64 bits, never wraps), minor a sequence value, so
-- ids increase within a transaction and between transactions in the order
-- their ids were assigned. Transactions commit in any order, so an id can
-- become visible after a higher one: readers hand out only entries whose
-- transaction is below the reading snapshot's xmin. Every transaction below
-- xmin has ended and no new transaction gets an id below it, so a group's
-- cursor never moves past an entry that could still appear. An open writing
-- transaction anywhere on the server delays delivery; it never loses it.
CREATE SEQUENCE {schema}.stream_entry_minor;

CREATE TABLE {schema}.stream_entries (
  tenant         text        NOT NULL,
  stream         text        NOT NULL,
  major          bigint      NOT NULL,
  minor          bigint      NOT NULL,
  payload        jsonb       NOT NULL,
  headers        jsonb       NOT NULL DEFAULT '{}'::jsonb,
  -- Set when the entry relays an outbox message.
  message_id     uuid,
  origin_tenant  text,
  topic          text,
  schema_version integer,
  appended_at    timestamptz NOT NULL DEFAULT statement_timestamp(),
  PRIMARY KEY (tenant, stream, major, minor)
);

-- A consumer group: its cursor (the last id it handed out) and, for a group
-- created at the end of its stream, the snapshot it was created in (entries
-- visible in it are before the group, the rest after).
CREATE TABLE {schema}.stream_groups (
  tenant         text        NOT NULL,
  stream         text        NOT NULL,
  grp            text        NOT NULL,
  last_major     bigint      NOT NULL,
  last_minor     bigint      NOT NULL,
  start_snapshot pg_snapshot,
  created_at     timestamptz NOT NULL DEFAULT statement_timestamp(),
  PRIMARY KEY (tenant, stream, grp)
);

CREATE TABLE {schema}.stream_consumers (
  tenant   text        NOT NULL,
  stream   text        NOT NULL,
  grp      text        NOT NULL,
  consumer text        NOT NULL,
  seen_at  timestamptz NOT NULL,
  PRIMARY KEY (tenant, stream, grp, consumer),
  FOREIGN KEY (tenant, stream, grp) REFERENCES {schema}.stream_groups ON DELETE CASCADE
);

-- Entries a group handed out and nobody acked yet.
CREATE TABLE {schema}.stream_pending (
  tenant       text        NOT NULL,
  stream       text        NOT NULL,
  grp          text        NOT NULL,
  major        bigint      NOT NULL,
  minor        bigint      NOT NULL,
  consumer     text        NOT NULL,
  delivered_at timestamptz NOT NULL,
  deliveries   integer     NOT NULL,
  PRIMARY KEY (tenant, stream, grp, major, minor),
  FOREIGN KEY (tenant, stream, grp) REFERENCES {schema}.stream_groups ON DELETE CASCADE
);

CREATE INDEX stream_pending_consumer
  ON {schema}.stream_pending (tenant, stream, grp, consumer, major, minor);

-- Readers blocked on a stream: an append notifies (on channel
-- `{schema}.streams`) only while one waits, since NOTIFY serialises
-- committing transactions. Unlogged: a waiter outlives no server restart.
CREATE UNLOGGED TABLE {schema}.stream_waiters (
  tenant text        NOT NULL,
  stream text        NOT NULL,
  until  timestamptz NOT NULL,
  PRIMARY KEY (tenant, stream)
);

-- Receipts of stream subscriptions: entry `correlation_id`
-- (`{subscription}:{stream}:{entry id}`) took effect. Written with a
-- transactional handler's effect, or after a plain one; pruned with the
-- outbox's receipts.
CREATE TABLE {schema}.stream_receipts (
  subscription   text        NOT NULL,
  correlation_id text        NOT NULL,
  created_at     timestamptz NOT NULL DEFAULT statement_timestamp(),
  PRIMARY KEY (subscription, correlation_id)
);

CREATE INDEX stream_receipts_created ON {schema}.stream_receipts (created_at);
