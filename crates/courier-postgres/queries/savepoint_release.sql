-- Keeps the work since savepoint.sql. Touches: nothing.
RELEASE SAVEPOINT courier_fan_out
