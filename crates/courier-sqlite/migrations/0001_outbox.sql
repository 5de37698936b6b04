-- Courier's outbox schema for SQLite, version 1.
--
-- One SQLite file holds one Courier database, so the tables carry no prefix or
-- schema. Every table is STRICT: a producer in another language that INSERTs a
-- wrongly typed value gets an error instead of a row Courier cannot read.
-- Times are INTEGER milliseconds since the Unix epoch, taken from the database
-- clock (`unixepoch('subsec')`, which is constant within one statement).
-- Ids are UUIDs stored as lowercase hyphenated TEXT.

-- The outbox: one row per event, written by producers in their own transaction.
-- This table is a public contract (see the README): any language may INSERT into
-- it; only tenant, topic and payload are required. The default id is a UUIDv7:
-- 48 bits of Unix milliseconds (database clock), version 7, RFC 4122 variant,
-- random bits from SQLite's CSPRNG.
CREATE TABLE messages (
  id              TEXT    NOT NULL PRIMARY KEY
                  DEFAULT (lower(
                    substr(printf('%012x', CAST(round(unixepoch('subsec') * 1000) AS INTEGER)), 1, 8) || '-' ||
                    substr(printf('%012x', CAST(round(unixepoch('subsec') * 1000) AS INTEGER)), 9, 4) ||
                    '-7' || substr(hex(randomblob(2)), 2) ||
                    '-' || substr('89ab', 1 + (random() & 3), 1) || substr(hex(randomblob(2)), 2) ||
                    '-' || hex(randomblob(6))))
                  CHECK (id GLOB replace('########-####-####-####-############', '#', '[0-9a-f]')),
  tenant          TEXT    NOT NULL
                  CHECK (length(tenant) BETWEEN 1 AND 128 AND tenant GLOB '[A-Za-z0-9]*'
                         AND tenant NOT GLOB '*[^A-Za-z0-9._-]*'),
  topic           TEXT    NOT NULL
                  CHECK (length(topic) BETWEEN 1 AND 128 AND topic GLOB '[A-Za-z0-9]*'
                         AND topic NOT GLOB '*[^A-Za-z0-9._-]*'),
  schema_version  INTEGER NOT NULL DEFAULT 1 CHECK (schema_version >= 1),
  payload         TEXT    NOT NULL CHECK (json_valid(payload)),
  headers         TEXT    NOT NULL DEFAULT '{}'
                  CHECK (json_valid(headers) AND json_type(headers) = 'object'),
  ordering_key    TEXT    CHECK (length(CAST(ordering_key AS BLOB)) BETWEEN 1 AND 255),
  idempotency_key TEXT    CHECK (length(CAST(idempotency_key AS BLOB)) BETWEEN 1 AND 255),
  occurred_at     INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)),
  available_at    INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)),
  created_at      INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER))
) STRICT;

-- Idempotent enqueue: one message per (tenant, idempotency key) while it is retained.
CREATE UNIQUE INDEX messages_idempotency ON messages (tenant, idempotency_key)
  WHERE idempotency_key IS NOT NULL;
-- Retention scans by age.
CREATE INDEX messages_created_at ON messages (created_at);

-- Subscriptions and the topic patterns they receive. Registered by library
-- workers at start and by the daemon from its config.
CREATE TABLE subscriptions (
  name       TEXT    NOT NULL PRIMARY KEY
             CHECK (length(name) BETWEEN 1 AND 128 AND name GLOB '[A-Za-z0-9]*'
                    AND name NOT GLOB '*[^A-Za-z0-9._-]*'),
  paused     INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
  created_at INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER))
) STRICT;

-- `pattern` is an exact topic, `stem.*`, or `*`; `prefix` is what a topic must
-- start with for a wildcard pattern: NULL for an exact topic, '' for `*`, 'stem.'
-- for `stem.*`. The CHECK keeps the two consistent for rows written by hand.
CREATE TABLE subscription_topics (
  subscription TEXT NOT NULL REFERENCES subscriptions (name) ON DELETE CASCADE,
  pattern      TEXT NOT NULL CHECK (length(pattern) BETWEEN 1 AND 130),
  prefix       TEXT,
  PRIMARY KEY (subscription, pattern),
  CHECK ((pattern = '*' AND prefix = '')
         OR (pattern GLOB '[A-Za-z0-9]*.[*]'
             AND substr(pattern, 1, length(pattern) - 2) NOT GLOB '*[^A-Za-z0-9._-]*'
             AND prefix = substr(pattern, 1, length(pattern) - 1))
         OR (prefix IS NULL AND pattern GLOB '[A-Za-z0-9]*'
             AND pattern NOT GLOB '*[^A-Za-z0-9._-]*'))
) STRICT;

-- Delivery state per (message, subscription). A completed delivery is deleted
-- (its receipt remains), so this table holds only work in progress and dead
-- letters, and its ready index stays small however long the outbox grows.
-- AUTOINCREMENT: ids follow enqueue order and are never reused, so "an earlier
-- delivery" (ordering keys) and a stale claim's id always mean what they say.
CREATE TABLE deliveries (
  id               INTEGER PRIMARY KEY AUTOINCREMENT,
  message_id       TEXT    NOT NULL,
  subscription     TEXT    NOT NULL,
  tenant           TEXT    NOT NULL,
  topic            TEXT    NOT NULL,
  schema_version   INTEGER NOT NULL,
  ordering_key     TEXT,
  state            TEXT    NOT NULL DEFAULT 'available'
                           CHECK (state IN ('available', 'running', 'dead')),
  attempts         INTEGER NOT NULL DEFAULT 0,
  max_attempts     INTEGER,
  available_at     INTEGER NOT NULL,
  lease_token      TEXT,
  lease_expires_at INTEGER,
  claimed_by       TEXT,
  errors           TEXT    NOT NULL DEFAULT '[]' CHECK (json_valid(errors)),
  created_at       INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)),
  dead_at          INTEGER,
  UNIQUE (message_id, subscription)
) STRICT;

-- The claim walks this index per (subscription, tenant) in enqueue order, and
-- finds the tenants with ready work by seeking along it.
CREATE INDEX deliveries_ready ON deliveries (subscription, tenant, id)
  WHERE state = 'available';
-- Ordering keys: is an earlier delivery with my key still pending?
CREATE INDEX deliveries_ordering ON deliveries (subscription, tenant, ordering_key, id)
  WHERE ordering_key IS NOT NULL AND state <> 'dead';
-- In-flight counts per tenant, and the rescuer's scan for expired leases.
CREATE INDEX deliveries_running ON deliveries (subscription, tenant)
  WHERE state = 'running';
-- Dead-letter listings.
CREATE INDEX deliveries_dead ON deliveries (subscription, id)
  WHERE state = 'dead';

-- Proof that a subscription applied a message. Written in the same transaction
-- as a transactional handler's effect; a second delivery finds it and skips.
CREATE TABLE receipts (
  tenant       TEXT    NOT NULL,
  subscription TEXT    NOT NULL,
  message_id   TEXT    NOT NULL,
  completed_at INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)),
  PRIMARY KEY (message_id, subscription)
) STRICT;
CREATE INDEX receipts_completed_at ON receipts (completed_at);

-- Fan-out: every inserted message owes one delivery to each subscription whose
-- patterns match its topic at insert time, so a plain SQL INSERT gets the same
-- fan-out as Courier's own enqueue. A row trigger runs once per inserted message,
-- in insert order, so delivery ids follow enqueue order. Exact patterns are found
-- through subscription_topics_pattern; wildcard patterns are few and scanned.
-- UNION removes a subscription matched by two patterns.
CREATE INDEX subscription_topics_pattern ON subscription_topics (pattern)
  WHERE prefix IS NULL;

CREATE TRIGGER messages_fan_out AFTER INSERT ON messages
FOR EACH ROW
BEGIN
  INSERT INTO deliveries
    (message_id, subscription, tenant, topic, schema_version, ordering_key, available_at)
  SELECT NEW.id, s.subscription, NEW.tenant, NEW.topic, NEW.schema_version,
         NEW.ordering_key, NEW.available_at
  FROM (
    SELECT t.subscription FROM subscription_topics t
    WHERE t.prefix IS NULL AND t.pattern = NEW.topic
    UNION
    SELECT t.subscription FROM subscription_topics t
    WHERE t.prefix IS NOT NULL AND substr(NEW.topic, 1, length(t.prefix)) = t.prefix
  ) s
  ORDER BY s.subscription;
END;
