-- Courier's outbox schema, version 7: which messages a subscription receives
-- is defined by commit order, whatever the producer's isolation level.
--
-- Until now the fan-out trigger matched a message against the subscriptions
-- its snapshot saw. A REPEATABLE READ producer whose transaction began before
-- a subscription was registered, and inserted after the registration
-- committed, owed the new subscription nothing (READ COMMITTED: one
-- delivery). Now every message whose transaction commits after a
-- registration's commit is owed to the subscription, and none committed
-- before it (unless the registration replays them).
--
-- What a producer waits for, besides another producer of its ordering key: a
-- registration or topic removal that has taken the fan-out lock, until it
-- commits (a few milliseconds; registrations that change nothing take no
-- lock), or one queued for it, at most 200 ms at a time (see lock_fan_out in
-- src/outbox.rs).

-- One row; registrations bump it. Its only reader locks it (FOR SHARE: a key
-- share lock would not conflict with the bump, which changes no key) to
-- learn whether it changed since the reader's snapshot.
CREATE TABLE {schema}.fan_out_epoch (
  id    integer PRIMARY KEY CHECK (id = 1),
  epoch bigint  NOT NULL
);
INSERT INTO {schema}.fan_out_epoch (id, epoch) VALUES (1, 0);

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
