-- Sets the rate limit of tenant ?2 in subscription ?1 (?3 per second, burst
-- ?4), its bucket full (or, if it had one, no fuller than before).
-- Touches: tenant_rate_limits (one row). Locks: one autocommit statement.
INSERT INTO tenant_rate_limits (subscription, tenant, per_second, burst, tokens)
VALUES (?1, ?2, ?3, ?4, ?4)
ON CONFLICT (subscription, tenant) DO UPDATE
SET per_second = excluded.per_second, burst = excluded.burst,
    tokens = min(excluded.burst, tenant_rate_limits.tokens)
