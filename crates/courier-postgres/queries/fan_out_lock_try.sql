-- Takes the fan-out lock exclusively if no producer holds it; true when taken.
-- Producers hold it shared from their insert to their commit (see the fan_out
-- trigger, migration 0007), so while this transaction holds it no producer
-- fans out, and every producer that fanned out before has committed.
-- Trying instead of waiting: a waiting exclusive request would make every new
-- producer queue behind it for as long as the longest open producer
-- transaction. Touches: nothing (an advisory lock held to commit).
SELECT pg_try_advisory_xact_lock(hashtextextended('{schema}:fan-out', 0))
