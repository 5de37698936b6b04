-- Opens the savepoint of the first delivery of a transactional batch that
-- isolates failures, so that a failing handler can be rolled back alone
-- (batch_savepoint_rollback.sql). Touches: no table; locks nothing.
SAVEPOINT courier_item
