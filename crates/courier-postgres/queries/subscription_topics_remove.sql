-- Removes topic patterns $2 (exactly as registered) from subscription $1;
-- returns the patterns removed. Touches: subscription_topics, removed_topics.
-- Runs under the fan-out lock, so messages committed after it are no longer
-- owed to the subscription and those committed before keep their deliveries.
-- The pattern moves to removed_topics, stamped with the clock under the lock:
-- what it received before (completed, or still open and completed later)
-- still reads so (see migrations/0014_owed_by_fan_out_time.sql).
WITH removed AS (
  DELETE FROM {schema}.subscription_topics t
  WHERE t.subscription = $1 AND t.pattern = ANY ($2::text[])
  RETURNING t.subscription, t.pattern, t.prefix, t.since, t.since_id, t.added_at
),
retired AS (
  INSERT INTO {schema}.removed_topics (subscription, pattern, prefix, since, since_id, added_at)
  SELECT subscription, pattern, prefix, since, since_id, added_at FROM removed
)
SELECT pattern FROM removed
