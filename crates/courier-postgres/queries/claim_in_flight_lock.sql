-- Before a claim under a per-tenant in-flight limit: takes, in tenant order,
-- the in-flight lock of every tenant the claim will serve, and returns them
-- in order. The tenants are $3 when given (a floor pass), else the tenants
-- with ready work after the cursor $2 (a full pass), at most $4.
-- Counting a tenant's running deliveries is only exact while no other claim
-- of that tenant is in flight: each claim holds its tenants' locks to commit,
-- and the claim statement that follows in the same transaction takes a new
-- snapshot (READ COMMITTED) that includes every earlier claim of them.
-- Claims of other tenants do not wait. Lock keys are namespaced
-- `{schema}:in-flight:{subscription}:{tenant}` (names cannot contain `:`).
-- Touches: reads deliveries (deliveries_ready); advisory locks held to commit.
WITH RECURSIVE tenants AS (
  (SELECT d.tenant FROM {schema}.deliveries d
    WHERE d.subscription = $1 AND d.state = 'available' AND d.tenant > $2
      AND cardinality($3::text[]) = 0
    ORDER BY d.tenant LIMIT 1)
  UNION ALL
  SELECT (SELECT d.tenant FROM {schema}.deliveries d
           WHERE d.subscription = $1 AND d.state = 'available' AND d.tenant > t.tenant
           ORDER BY d.tenant LIMIT 1)
  FROM tenants t
  WHERE t.tenant IS NOT NULL
),
turn AS (
  (SELECT tenant FROM tenants WHERE tenant IS NOT NULL LIMIT $4)
  UNION
  SELECT unnest($3::text[])
),
locked AS MATERIALIZED (
  SELECT t.tenant,
         pg_advisory_xact_lock(hashtextextended('{schema}:in-flight:' || $1 || ':' || t.tenant, 0))
  FROM (SELECT tenant FROM turn ORDER BY tenant) t
)
SELECT coalesce(array_agg(tenant ORDER BY tenant), '{}') AS tenants FROM locked
