-- Sets the rate limit of tenant $2 in subscription $1 ($3 per second, burst
-- $4), its bucket full; with $3 NULL, lifts it.
-- Touches: tenant_rate_limits (one row).
WITH lifted AS (
  DELETE FROM {schema}.tenant_rate_limits
  WHERE $3::double precision IS NULL AND subscription = $1 AND tenant = $2
)
INSERT INTO {schema}.tenant_rate_limits (subscription, tenant, per_second, burst, tokens)
SELECT $1, $2, $3, $4, $4
WHERE $3::double precision IS NOT NULL
ON CONFLICT (subscription, tenant) DO UPDATE
SET per_second = EXCLUDED.per_second, burst = EXCLUDED.burst,
    tokens = least(EXCLUDED.burst, {schema}.tenant_rate_limits.tokens)
