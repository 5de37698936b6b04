-- The first step of a claim: up to ?3 tenants with available deliveries in
-- subscription ?1, in byte order after the cursor ?2, with (when ?4 is true)
-- how many deliveries each already has running, for the in-flight limit, and
-- the whole tokens of its rate limit's bucket, if it has one.
-- Touches: reads deliveries and subscriptions. Locks: runs inside the claim's
-- BEGIN IMMEDIATE transaction, so no other writer changes the answer before
-- the update.
-- Shape: a loose index scan; each step seeks deliveries_ready for the next
-- tenant after the previous one, so a tenant with a huge backlog costs one seek,
-- not a scan of its backlog. The running counts use deliveries_running.
-- A paused subscription gets no turn at all (the anchor row is filtered out
-- by one primary-key probe of subscriptions), so the claim takes nothing and
-- its deliveries wait untouched.
WITH RECURSIVE turn (tenant, position) AS (
  SELECT (SELECT d.tenant FROM deliveries d
           WHERE d.subscription = ?1 AND d.state = 'available' AND d.tenant > ?2
           ORDER BY d.tenant LIMIT 1),
         1
  WHERE NOT EXISTS (SELECT 1 FROM subscriptions p WHERE p.name = ?1 AND p.paused)
  UNION ALL
  SELECT (SELECT d.tenant FROM deliveries d
           WHERE d.subscription = ?1 AND d.state = 'available' AND d.tenant > t.tenant
           ORDER BY d.tenant LIMIT 1),
         t.position + 1
  FROM turn t
  WHERE t.tenant IS NOT NULL AND t.position < ?3
)
SELECT t.tenant,
       CASE WHEN ?4 THEN (SELECT count(*) FROM deliveries f
                           WHERE f.subscription = ?1 AND f.tenant = t.tenant
                             AND f.state = 'running')
            ELSE 0 END AS running,
       -- A rate-limited tenant's whole tokens (NULL: not limited).
       (SELECT max(0, CAST(min(b.burst, b.tokens + b.per_second * max(0,
                 CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - b.refilled_at) / 1000.0)
               AS INTEGER))
        FROM tenant_rate_limits b
        WHERE b.subscription = ?1 AND b.tenant = t.tenant) AS tokens
FROM turn t
WHERE t.tenant IS NOT NULL
ORDER BY t.tenant
