-- Bounds how long the rest of this transaction waits for any lock ($1, e.g.
-- '30000ms'). Touches: nothing.
SELECT set_config('lock_timeout', $1, true)
