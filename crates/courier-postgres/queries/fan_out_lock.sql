-- Takes the fan-out lock exclusively, queueing for it behind the producers
-- that hold it (fan_out_lock_try.sql kept failing) for at most the
-- transaction's lock_timeout, which the caller keeps short: new producers
-- queue behind this request meanwhile. Touches: nothing (an advisory lock
-- held to commit).
SELECT pg_advisory_xact_lock(hashtextextended('{schema}:fan-out', 0))
