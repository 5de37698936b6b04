-- Undoes the transaction's work since savepoint.sql (a lock wait that timed
-- out), keeping the transaction. Touches: nothing.
ROLLBACK TO SAVEPOINT courier_fan_out
