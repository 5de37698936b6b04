-- Courier's outbox schema, version 5: every advisory lock Courier takes has a
-- namespace of its own, so no tenant or ordering-key text can name another.
--
-- Until now a producer's ordering-key lock hashed `{schema}:{tenant}:{key}`,
-- so tenant `idle` with key `billing` took the lock a `billing` worker takes
-- to announce that it is idle (`{schema}:idle:billing`), and tenant `claim`
-- the one claims with an in-flight limit take. Tenant names cannot contain
-- `:`, so with a fixed second segment (`key`, `idle`, `in-flight`) the texts
-- hashed for different purposes can never be equal.
--
-- What a producer waits for (see the README, "What a producer waits for"):
-- another uncommitted producer of the same (tenant, ordering key), until it
-- commits or rolls back; nothing else of Courier's. Producers never wait for
-- workers: a worker announcing idleness waits for producers, not the reverse.
CREATE OR REPLACE FUNCTION {schema}.fan_out() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  fanned text[];
BEGIN
  -- Producers of the same (tenant, ordering key) take turns until commit, so a
  -- key's deliveries get ids in commit order and a later message can never be
  -- claimed before an earlier one becomes visible. Locks are taken in a fixed
  -- order so two producers never deadlock on them.
  PERFORM pg_advisory_xact_lock(k.lock_key)
  FROM (SELECT DISTINCT hashtextextended('{schema}:key:' || n.tenant || ':' || n.ordering_key, 0) AS lock_key
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
