-- Completes one delivery inside a transactional handler's transaction.
-- Touches: deliveries (delete). Fenced by the lease token ?2 and the running
-- state only: lease_check.sql proved the lease unexpired when this
-- BEGIN IMMEDIATE transaction took the database's single write lock, and
-- while that lock is held no rescuer or claimer can take the delivery over.
-- So a handler that outlives its lease inside the transaction still owns the
-- delivery (its heartbeat cannot write meanwhile, which is why the check is
-- made at the start).
DELETE FROM deliveries
WHERE id = ?1
  AND lease_token = ?2
  AND state = 'running'
