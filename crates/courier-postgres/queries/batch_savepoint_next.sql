-- Moves an isolating transactional batch on to its next delivery: releases
-- the previous delivery's savepoint (keeping its work in the transaction) and
-- opens the next one. Two statements, run as one simple query: one round trip
-- per delivery. Touches: no table; locks nothing.
RELEASE SAVEPOINT courier_item; SAVEPOINT courier_item
