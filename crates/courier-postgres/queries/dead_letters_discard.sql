-- Discards dead letters for good (their messages are then pruned by
-- retention); returns how many. Selected like dead_letters_retry.sql,
-- $5 (tenants) and $9 (fingerprint) included.
-- Each is recorded in discards, so that the admin views do not take the
-- delivery it leaves missing for a completion.
-- Touches: deliveries, discards.
WITH gone AS (
  DELETE FROM {schema}.deliveries d
  WHERE d.state = 'dead'
    AND ($5::text[] IS NULL OR d.tenant = ANY ($5))
    AND (($1::bigint[] IS NOT NULL AND d.id = ANY ($1))
         OR ($1::bigint[] IS NULL
             AND ($2::text IS NULL OR d.tenant = $2)
             AND ($3::text IS NULL OR d.topic = $3)
             AND ($4::text IS NULL OR d.subscription = $4)
             AND ($6::uuid IS NULL OR d.message_id = $6)
             AND ($7::timestamptz IS NULL OR d.dead_at >= $7)
             AND ($8::timestamptz IS NULL OR d.dead_at < $8)
             AND ($9::text IS NULL OR coalesce(d.error_fingerprint, 'unknown') = $9)))
  RETURNING d.message_id, d.subscription, d.tenant
),
recorded AS (
  INSERT INTO {schema}.discards (message_id, subscription, tenant)
  SELECT message_id, subscription, tenant FROM gone
  ON CONFLICT (message_id, subscription) DO UPDATE SET discarded_at = excluded.discarded_at
)
SELECT count(*) FROM gone
