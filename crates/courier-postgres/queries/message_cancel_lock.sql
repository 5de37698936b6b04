-- Locks message $1's deliveries for a cancel (AdminStore::cancel_message)
-- and says of each whether it has started: 'running' (leased), 'retrying'
-- (an attempt spent), 'dead', or NULL (waiting, never tried). A claim that
-- took one first has committed by the time the lock is granted, and its
-- row is read as it left it. Receipts are read by the next statement, so
-- that it sees a completion committed while this one waited.
-- Touches: deliveries.
SELECT d.subscription,
       CASE WHEN d.state = 'dead' THEN 'dead'
            WHEN d.state = 'running' OR d.lease_token IS NOT NULL THEN 'running'
            WHEN d.attempts > 0 THEN 'retrying'
       END AS started
FROM {schema}.deliveries d
WHERE d.message_id = $1
ORDER BY d.subscription
FOR UPDATE
