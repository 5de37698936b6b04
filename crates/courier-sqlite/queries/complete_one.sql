-- Completes one delivery inside a transactional handler's transaction, fenced
-- like complete.sql (lease token ?2, running, unexpired on the database clock).
-- Touches: deliveries (delete). Locks: the handler's BEGIN IMMEDIATE transaction
-- already holds the database's write lock.
DELETE FROM deliveries
WHERE id = ?1
  AND lease_token = ?2
  AND state = 'running'
  AND lease_expires_at > CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
