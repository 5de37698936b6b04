-- Completes one delivery inside a transactional handler's transaction, fenced
-- like complete.sql. Locks the delivery row until the transaction ends.
DELETE FROM {schema}.deliveries d
WHERE d.id = $1
  AND d.lease_token = $2
  AND d.state = 'running'
  AND d.lease_expires_at > clock_timestamp()
