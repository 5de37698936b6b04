-- Pauses (?2 = 1) or resumes (?2 = 0) subscription ?1; no row means no such
-- subscription. Touches: subscriptions (update; a single-statement write in
-- autocommit, so it waits its turn for the write lock like any other).
-- A claim already holding the write lock finishes its batch; the next claim
-- reads the new value in claim_tenants.sql and takes nothing.
UPDATE subscriptions SET paused = ?2 WHERE name = ?1
