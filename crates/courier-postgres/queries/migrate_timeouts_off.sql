-- Lifts the connection's statement and lock-wait bounds (see
-- SESSION_TIMEOUTS) for the rest of this migration's transaction: an index
-- built over a large table may take longer than any engine statement, and the
-- migration lock is waited for as long as another process migrates.
-- Touches: nothing.
SELECT set_config('statement_timeout', '0', true), set_config('lock_timeout', '0', true)
