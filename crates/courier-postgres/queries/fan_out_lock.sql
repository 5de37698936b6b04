-- Takes the fan-out lock exclusively, waiting for producers that hold it
-- (fan_out_lock_try.sql gave up). Bounded by the transaction's lock_timeout.
-- Touches: nothing (an advisory lock held to commit).
SELECT pg_advisory_xact_lock(hashtextextended('{schema}:fan-out', 0))
