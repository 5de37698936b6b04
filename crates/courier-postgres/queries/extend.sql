-- Heartbeat: extends leases that are still held by $3 ms from now (database
-- clock). An expired lease cannot be extended: it may already be someone else's.
UPDATE {schema}.deliveries d
SET lease_expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond'
FROM unnest($1::bigint[], $2::uuid[]) AS l (id, lease_token)
WHERE d.id = l.id
  AND d.lease_token = l.lease_token
  AND d.state = 'running'
  AND d.lease_expires_at > clock_timestamp()
RETURNING d.id
