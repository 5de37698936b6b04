-- Removes topic patterns $2 (exactly as registered) from subscription $1;
-- returns the patterns removed. Touches: subscription_topics, receipts (and
-- reads messages, deliveries, discards). Runs under the fan-out lock, so
-- messages committed after it are no longer owed to the subscription and
-- those committed before keep their deliveries. What the removed patterns
-- received and completed (no open delivery, not discarded) gets a receipt,
-- since the admin views can no longer read it from the pattern. (Deliveries
-- still open now read as not owed once completed; see README, "What
-- completed means".) Scans the retained messages once.
WITH removed AS (
  DELETE FROM {schema}.subscription_topics t
  WHERE t.subscription = $1 AND t.pattern = ANY ($2::text[])
  RETURNING t.pattern, t.prefix, t.since, t.since_id
),
kept AS (
  INSERT INTO {schema}.receipts (tenant, subscription, message_id)
  SELECT DISTINCT m.tenant, $1::text, m.id
  FROM {schema}.messages m
  JOIN removed t
    ON (t.pattern = m.topic OR (t.prefix IS NOT NULL AND starts_with(m.topic, t.prefix)))
   AND (m.created_at, m.id) >= (t.since, t.since_id)
  WHERE NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                    WHERE d.message_id = m.id AND d.subscription = $1::text)
    AND NOT EXISTS (SELECT 1 FROM {schema}.discards x
                    WHERE x.message_id = m.id AND x.subscription = $1::text)
  ON CONFLICT DO NOTHING
)
SELECT pattern FROM removed
