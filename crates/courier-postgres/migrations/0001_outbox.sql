-- Courier's outbox schema, version 1. Rendered with {schema} replaced by the
-- store's schema (default `courier`), so it never collides with the application's tables.

CREATE SCHEMA IF NOT EXISTS {schema};

-- A UUIDv7 made in SQL, the default id for producers that INSERT without one:
-- 48 bits of Unix milliseconds (database clock) over a random v4 UUID, version bits set to 7.
CREATE FUNCTION {schema}.uuid_v7() RETURNS uuid LANGUAGE sql VOLATILE AS $$
  SELECT encode(
    set_bit(set_bit(
      overlay(uuid_send(gen_random_uuid())
              PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
              FROM 1 FOR 6),
      52, 1), 53, 1), 'hex')::uuid
$$;

-- The outbox: one row per event, written by producers in their own transaction.
-- This table is a public contract (see the README): any language may INSERT into it.
CREATE TABLE {schema}.messages (
  id              uuid        PRIMARY KEY DEFAULT {schema}.uuid_v7(),
  tenant          text        NOT NULL CHECK (tenant ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
  topic           text        NOT NULL CHECK (topic ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
  schema_version  integer     NOT NULL DEFAULT 1 CHECK (schema_version >= 1),
  payload         jsonb       NOT NULL,
  headers         jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
  ordering_key    text        CHECK (octet_length(ordering_key) BETWEEN 1 AND 255),
  idempotency_key text        CHECK (octet_length(idempotency_key) BETWEEN 1 AND 255),
  occurred_at     timestamptz NOT NULL DEFAULT now(),
  available_at    timestamptz NOT NULL DEFAULT now(),
  created_at      timestamptz NOT NULL DEFAULT now()
);

-- Idempotent enqueue: one message per (tenant, idempotency key) while it is retained.
CREATE UNIQUE INDEX messages_idempotency ON {schema}.messages (tenant, idempotency_key)
  WHERE idempotency_key IS NOT NULL;
-- Retention scans by age; BRIN costs almost nothing per insert on an append-only table.
CREATE INDEX messages_created_at ON {schema}.messages USING brin (created_at);

-- Subscriptions and the topic patterns they receive. Registered by library
-- workers at start and by the daemon from its config.
CREATE TABLE {schema}.subscriptions (
  name       text        PRIMARY KEY CHECK (name ~ '^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$'),
  paused     boolean     NOT NULL DEFAULT false,
  created_at timestamptz NOT NULL DEFAULT now()
);

-- `pattern` is an exact topic, `prefix.*`, or `*`; `prefix` is what a topic must start with
-- for a wildcard pattern (NULL for an exact one).
CREATE TABLE {schema}.subscription_topics (
  subscription text NOT NULL REFERENCES {schema}.subscriptions (name) ON DELETE CASCADE,
  pattern      text NOT NULL,
  prefix       text,
  PRIMARY KEY (subscription, pattern)
);

-- Delivery state per (message, subscription). A completed delivery is deleted
-- (its receipt remains), so this table holds only work in progress and dead
-- letters, and its ready index stays small however long the outbox grows.
CREATE TABLE {schema}.deliveries (
  id               bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  message_id       uuid        NOT NULL,
  subscription     text        NOT NULL,
  tenant           text        NOT NULL,
  topic            text        NOT NULL,
  schema_version   integer     NOT NULL,
  ordering_key     text,
  state            text        NOT NULL DEFAULT 'available'
                               CHECK (state IN ('available', 'running', 'dead')),
  attempts         integer     NOT NULL DEFAULT 0,
  max_attempts     integer,
  available_at     timestamptz NOT NULL,
  lease_token      uuid,
  lease_expires_at timestamptz,
  claimed_by       text,
  errors           jsonb       NOT NULL DEFAULT '[]',
  created_at       timestamptz NOT NULL DEFAULT now(),
  dead_at          timestamptz,
  UNIQUE (message_id, subscription)
);

-- The claim walks this index per (subscription, tenant) in enqueue order.
CREATE INDEX deliveries_ready ON {schema}.deliveries (subscription, tenant, id)
  WHERE state = 'available';
-- Ordering keys: is an earlier delivery with my key still pending?
CREATE INDEX deliveries_ordering ON {schema}.deliveries (subscription, tenant, ordering_key, id)
  WHERE ordering_key IS NOT NULL AND state <> 'dead';
-- In-flight counts per tenant, and the rescuer's scan for expired leases.
CREATE INDEX deliveries_running ON {schema}.deliveries (subscription, tenant)
  WHERE state = 'running';
-- Dead-letter listings.
CREATE INDEX deliveries_dead ON {schema}.deliveries (subscription, id)
  WHERE state = 'dead';

-- Proof that a subscription applied a message. Written in the same transaction
-- as a transactional handler's effect; a second delivery finds it and skips.
CREATE TABLE {schema}.receipts (
  tenant       text        NOT NULL,
  subscription text        NOT NULL,
  message_id   uuid        NOT NULL,
  completed_at timestamptz NOT NULL DEFAULT now(),
  -- message ids are unique across tenants; leading with the (time-ordered) id
  -- keeps inserts at the right edge of the index and serves per-message lookups.
  PRIMARY KEY (message_id, subscription)
);
CREATE INDEX receipts_completed_at ON {schema}.receipts USING brin (completed_at);

-- Fan-out: every inserted message owes one delivery to each subscription whose
-- patterns match its topic at insert time. A statement-level trigger with a
-- transition table turns a batch insert into one INSERT ... SELECT, and wakes
-- idle workers once per statement (NOTIFY is delivered at commit, deduplicated).
CREATE FUNCTION {schema}.fan_out() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- Producers of the same (tenant, ordering key) take turns until commit, so a
  -- key's deliveries get ids in commit order and a later message can never be
  -- claimed before an earlier one becomes visible. Locks are taken in a fixed
  -- order so two producers never deadlock on them.
  PERFORM pg_advisory_xact_lock(k.lock_key)
  FROM (SELECT DISTINCT hashtextextended('{schema}:' || n.tenant || ':' || n.ordering_key, 0) AS lock_key
        FROM new_messages n
        WHERE n.ordering_key IS NOT NULL
        ORDER BY 1) k;
  INSERT INTO {schema}.deliveries
    (message_id, subscription, tenant, topic, schema_version, ordering_key, available_at)
  SELECT n.id, s.subscription, n.tenant, n.topic, n.schema_version, n.ordering_key, n.available_at
  FROM new_messages n
  JOIN LATERAL (
    SELECT DISTINCT t.subscription
    FROM {schema}.subscription_topics t
    WHERE t.pattern = n.topic
       OR (t.prefix IS NOT NULL AND starts_with(n.topic, t.prefix))
  ) s ON true;
  PERFORM pg_notify('{schema}.courier', '');
  RETURN NULL;
END $$;

CREATE TRIGGER messages_fan_out AFTER INSERT ON {schema}.messages
  REFERENCING NEW TABLE AS new_messages
  FOR EACH STATEMENT EXECUTE FUNCTION {schema}.fan_out();
