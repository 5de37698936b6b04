-- Courier's outbox schema, version 4: ordering keys hold under every
-- interleaving, and snoozes are counted apart from attempts.
--
-- A claim's check "no earlier delivery of my key is pending, none is running"
-- reads a snapshot, and a snapshot can be stale: a claim that committed after
-- it began, or an operator's retry of a dead head, is not in it. So the
-- running delivery of each (subscription, tenant, ordering key) also holds a
-- row here, inserted by the claim that starts it and deleted by the write
-- that settles it (complete, fail, snooze, release, rescue). The primary key
-- is the mutex: a second claim of the same key waits for the first claim's
-- transaction and then finds the row taken, whatever its snapshot showed.
-- Unordered deliveries never touch this table.
CREATE TABLE {schema}.ordering_locks (
  subscription text   NOT NULL,
  tenant       text   NOT NULL,
  ordering_key text   NOT NULL,
  delivery_id  bigint NOT NULL,
  PRIMARY KEY (subscription, tenant, ordering_key)
);

INSERT INTO {schema}.ordering_locks (subscription, tenant, ordering_key, delivery_id)
SELECT DISTINCT ON (subscription, tenant, ordering_key) subscription, tenant, ordering_key, id
FROM {schema}.deliveries
WHERE state = 'running' AND ordering_key IS NOT NULL
ORDER BY subscription, tenant, ordering_key, id;

-- Snoozes (a handler's "not now", e.g. a tenant over its quota) put a delivery
-- back without spending an attempt; they are counted here and bounded.
ALTER TABLE {schema}.deliveries ADD COLUMN snoozes integer NOT NULL DEFAULT 0;
