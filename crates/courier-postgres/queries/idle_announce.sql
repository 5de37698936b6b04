-- A worker of subscription $1 going idle: records itself ($2) in idle_workers
-- and, in the same transaction, takes the subscription's idle lock exclusively,
-- which waits for every producer holding it shared (one that may have looked
-- for idle workers before this row existed) to commit. When this returns, every
-- such producer's messages are visible to the next claim, and every later
-- producer sees this row and notifies. See migrations/0003_idle_workers.sql.
WITH announced AS (
  INSERT INTO {schema}.idle_workers (subscription, worker_id) VALUES ($1, $2)
  ON CONFLICT (subscription, worker_id) DO UPDATE SET since = now()
  RETURNING subscription
)
SELECT pg_advisory_xact_lock(hashtextextended('{schema}:idle:' || subscription, 0))
FROM announced
