-- Opens a transactional handler's transaction by checking its lease: token
-- ?2, running, unexpired on the database clock. Runs first inside the
-- BEGIN IMMEDIATE transaction, so from here to commit nobody else can write.
-- Touches nothing; the write lock is already held.
SELECT count(*) FROM deliveries
WHERE id = ?1
  AND lease_token = ?2
  AND state = 'running'
  AND lease_expires_at > CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
