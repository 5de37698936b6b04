-- Marks a point to roll back to within the current transaction. Touches: nothing.
SAVEPOINT courier_fan_out
