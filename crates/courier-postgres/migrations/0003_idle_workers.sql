-- Courier's outbox schema, version 3: producers wake workers only when one is
-- idle, and the fan-out matches subscriptions once per distinct topic.
--
-- NOTIFY takes a database-wide lock from before commit until the commit is
-- flushed, so transactions that notify commit one at a time: sixteen producers
-- of one message each commit no faster than one. A producer now notifies only
-- when a worker of a subscription it fans out to says it is idle.
--
-- The handshake, so that no message is left waiting for a poll:
-- - a producer takes a shared advisory lock per subscription it fans out to,
--   then (in a fresh READ COMMITTED snapshot) looks for an idle worker;
-- - a worker going idle inserts its row and takes the same lock exclusively in
--   one transaction, which waits until every producer that may have looked
--   before the row existed has committed; then it claims once more before it
--   sleeps. A producer that looks later sees the row and notifies.
-- Producers in REPEATABLE READ or SERIALIZABLE may hold a snapshot older than
-- the row, so they always notify. A row left by a crashed worker only costs
-- notifications that were not needed (the behaviour before this version).
CREATE UNLOGGED TABLE {schema}.idle_workers (
  subscription text        NOT NULL,
  worker_id    text        NOT NULL,
  since        timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (subscription, worker_id)
);

CREATE OR REPLACE FUNCTION {schema}.fan_out() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  fanned text[];
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
  -- The subscriptions each distinct topic fans out to, found once per
  -- statement; each message then scans that short list in insert order (the
  -- lateral subquery's OFFSET 0 keeps it a nested loop over new_messages), so
  -- delivery ids follow the order of the messages.
  WITH routes AS MATERIALIZED (
    SELECT DISTINCT tp.topic, t.subscription
    FROM (SELECT DISTINCT topic FROM new_messages) tp
    JOIN {schema}.subscription_topics t
      ON t.pattern = tp.topic OR (t.prefix IS NOT NULL AND starts_with(tp.topic, t.prefix))
  ),
  inserted AS (
    INSERT INTO {schema}.deliveries
      (message_id, subscription, tenant, topic, schema_version, ordering_key, available_at)
    SELECT n.id, r.subscription, n.tenant, n.topic, n.schema_version, n.ordering_key, n.available_at
    FROM new_messages n
    JOIN LATERAL (SELECT r.subscription FROM routes r WHERE r.topic = n.topic OFFSET 0) r ON true
  )
  SELECT array_agg(DISTINCT subscription) INTO fanned FROM routes;
  IF fanned IS NULL THEN
    RETURN NULL;
  END IF;
  PERFORM pg_advisory_xact_lock_shared(hashtextextended('{schema}:idle:' || s, 0))
  FROM unnest(fanned) AS s;
  IF current_setting('transaction_isolation') <> 'read committed'
     OR EXISTS (SELECT 1 FROM {schema}.idle_workers i WHERE i.subscription = ANY (fanned)) THEN
    PERFORM pg_notify('{schema}.courier', '');
  END IF;
  RETURN NULL;
END $$;
