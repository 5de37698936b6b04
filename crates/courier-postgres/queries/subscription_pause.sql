-- Pauses ($2 true) or resumes ($2 false) subscription $1; no row means no such
-- subscription. Touches: subscriptions (update, locks the one row briefly).
-- The claim reads `paused` in its own statement, so a claim that started
-- before the update may still take one batch; later claims take nothing.
UPDATE {schema}.subscriptions SET paused = $2 WHERE name = $1
