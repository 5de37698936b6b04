-- Takes the fan-out lock shared until the transaction ends, as producers do:
-- the pruner's delete then cannot remove a message a registration in
-- progress is replaying (it waits for the registration to commit, then its
-- next statement sees the replayed deliveries). Touches: nothing.
SELECT pg_advisory_xact_lock_shared(hashtextextended('{schema}:fan-out', 0))
