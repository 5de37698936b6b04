-- Opens a transactional group's transaction by checking every lease at once:
-- ?1 is a JSON array of [delivery id, lease token]; the count of those whose
-- token matches, still running and unexpired on the database clock. Runs
-- first inside the BEGIN IMMEDIATE transaction, so from here to commit
-- nobody else can write: a count short of the group means a lost lease.
-- Touches nothing; the write lock is already held.
SELECT count(*)
FROM json_each(?1) AS c
JOIN deliveries d ON d.id = c.value ->> 0
WHERE d.lease_token = c.value ->> 1
  AND d.state = 'running'
  AND d.lease_expires_at > CAST(round(unixepoch('subsec') * 1000) AS INTEGER)
