-- Completes a transactional group's deliveries inside its transaction: deletes
-- them. ?1 is a JSON array of [delivery id, lease token]. Fenced by the lease
-- token and the running state only: lease_check_many.sql proved every lease
-- unexpired when this BEGIN IMMEDIATE transaction took the database's single
-- write lock, and while that lock is held no rescuer or claimer can take a
-- delivery over. So a group that outlives its leases inside the transaction
-- still owns them (their heartbeat cannot write meanwhile, which is why the
-- check is made at the start). Returns the ids deleted.
DELETE FROM deliveries
WHERE id IN (
  SELECT d.id
  FROM json_each(?1) AS c
  JOIN deliveries d ON d.id = c.value ->> 0
  WHERE d.lease_token = c.value ->> 1
    AND d.state = 'running'
)
RETURNING id
