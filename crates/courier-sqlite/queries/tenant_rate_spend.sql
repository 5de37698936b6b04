-- A claim spends ?3 tokens of tenant ?2's bucket in subscription ?1, after
-- refilling it to now (database clock). Runs inside the claim's BEGIN
-- IMMEDIATE transaction, right after claim_tenants.sql read the bucket, so
-- the bucket never goes below zero.
-- Touches: tenant_rate_limits (one row).
UPDATE tenant_rate_limits
SET tokens = min(burst, tokens + per_second * max(0,
               CAST(round(unixepoch('subsec') * 1000) AS INTEGER) - refilled_at) / 1000.0) - ?3,
    refilled_at = max(refilled_at, CAST(round(unixepoch('subsec') * 1000) AS INTEGER))
WHERE subscription = ?1 AND tenant = ?2
