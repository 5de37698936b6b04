-- Readiness: a round trip that proves a connection works.
-- Touches: no table; locks nothing.
SELECT 1
