-- Lifts the rate limit of tenant ?2 in subscription ?1.
-- Touches: tenant_rate_limits (one row). Locks: one autocommit statement.
DELETE FROM tenant_rate_limits WHERE subscription = ?1 AND tenant = ?2
