-- Removes topic patterns $2 (exactly as registered) from subscription $1;
-- returns the patterns removed. Touches: subscription_topics. Runs under the
-- fan-out lock, so messages committed after it are no longer owed to the
-- subscription and those committed before keep their deliveries.
DELETE FROM {schema}.subscription_topics t
WHERE t.subscription = $1 AND t.pattern = ANY ($2::text[])
RETURNING t.pattern
