-- Courier's outbox schema, version 16: message priorities.
--
-- `messages.priority` (0 to 9, default 0; higher first) is the producer's,
-- plain-SQL producers included; the fan-out copies it to each delivery. A
-- claim serves each tenant of its turn its share as before, and within that
-- share takes the tenant's ready deliveries of priority above 0 first
-- (highest, then oldest), then priority 0 in enqueue order. So a priority-9
-- message waits at most for the claim in progress, however long the
-- priority-0 backlog, and tenants still take turns first.
--
-- deliveries_urgent indexes ready deliveries of priority above 0 only: most
-- messages have priority 0, so it stays small and costs a claim one probe
-- per tenant (none while it is empty), and the priority-0 walk keeps
-- deliveries_ready and its floors (src/floors.rs) unchanged.
--
-- Adding a column with a constant default rewrites nothing. The range check
-- is added NOT VALID: every existing row has the default, so checking them
-- (a scan of messages under this migration's lock) would prove nothing;
-- every new or updated row is checked.
ALTER TABLE {schema}.messages ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE {schema}.messages ADD CONSTRAINT messages_priority_range
  CHECK (priority BETWEEN 0 AND 9) NOT VALID;
ALTER TABLE {schema}.deliveries ADD COLUMN priority smallint NOT NULL DEFAULT 0;
CREATE INDEX deliveries_urgent ON {schema}.deliveries (subscription, tenant, priority DESC, id)
  WHERE state = 'available' AND priority > 0;

-- The fan-out of version 7, copying the priority.
CREATE OR REPLACE FUNCTION {schema}.fan_out() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  fanned text[];
BEGIN
  -- Registrations take effect in commit order: a registration (or topic
  -- removal) holds this lock exclusively until it commits, and bumps
  -- fan_out_epoch. Holding it shared to commit, a producer either fans out
  -- before a registration starts (which then waits for it to commit) or
  -- after the registration committed. In READ COMMITTED the statements below
  -- then see it; a REPEATABLE READ or SERIALIZABLE snapshot may predate it,
  -- and locking the epoch row fails with a serialization failure (40001)
  -- when it has changed since the snapshot, so the producer retries instead
  -- of silently missing the new subscription.
  -- Once a transaction holds the lock no registration can commit before it
  -- does, so the epoch is checked once per transaction (a rolled-back
  -- savepoint takes the lock, the row lock and the setting back together).
  PERFORM pg_advisory_xact_lock_shared(hashtextextended('{schema}:fan-out', 0));
  IF current_setting('transaction_isolation') <> 'read committed'
     AND current_setting('{schema}.fan_out_checked', true) IS DISTINCT FROM 'yes' THEN
    PERFORM 1 FROM {schema}.fan_out_epoch FOR SHARE;
    PERFORM set_config('{schema}.fan_out_checked', 'yes', true);
  END IF;
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
      (message_id, subscription, tenant, topic, schema_version, ordering_key, available_at,
       priority)
    SELECT n.id, r.subscription, n.tenant, n.topic, n.schema_version, n.ordering_key, n.available_at,
           n.priority
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
