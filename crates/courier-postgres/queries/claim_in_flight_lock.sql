-- Takes the in-flight lock of one subscription ($1: '<schema>:in-flight:<subscription>',
-- see migrations/0005_lock_namespaces.sql) until the claim's transaction ends.
-- A claim with a tenant in-flight limit counts each tenant's running
-- deliveries, which is only exact if no other such claim of the subscription
-- is in flight: holding this lock, each claim's snapshot includes the
-- previous claim's rows. Touches: no table. Locks: the advisory lock, exclusively.
SELECT pg_advisory_xact_lock(hashtextextended($1, 0))
