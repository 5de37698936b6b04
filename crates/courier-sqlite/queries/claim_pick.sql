-- One tenant's share of a claim (a fragment of claim.sql, repeated per tenant in
-- the turn; the tenant and quota placeholders become that tenant's parameter
-- numbers).
-- Walks deliveries_ready for (subscription ?1, tenant), highest priority first
-- and in enqueue order within a priority, and stops after the quota. Only routes the worker handles are taken (topic '*' with
-- version 0 is a catch-all); a delivery with an
-- ordering key waits while an earlier delivery with that key is not dead, or
-- while any delivery with that key is running (a retried dead letter must not
-- overtake a later one already running)
-- (deliveries_ordering answers that). Times are the database clock.
-- Lines starting with "--" are stripped before the fragment is repeated.
SELECT id FROM (
  SELECT d.id FROM deliveries d
  WHERE d.subscription = ?1
    AND d.tenant = ?{tenant}
    AND d.state = 'available'
    AND d.available_at <= CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
    AND EXISTS (SELECT 1 FROM routes r
                WHERE (r.topic = d.topic OR r.topic = '*')
                  AND (r.schema_version = d.schema_version OR r.schema_version = 0))
    AND (d.ordering_key IS NULL OR NOT EXISTS (
          SELECT 1 FROM deliveries e
          WHERE e.subscription = d.subscription AND e.tenant = d.tenant
            AND e.ordering_key = d.ordering_key
            AND e.state <> 'dead'
            AND (e.id < d.id OR e.state = 'running')))
  ORDER BY d.priority DESC, d.id
  LIMIT ?{quota}
)
