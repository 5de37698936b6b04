-- Locks message $1's deliveries for a cancel (AdminStore::cancel_message)
-- and says of each whether it has started: 'running' (leased), 'retrying'
-- (an attempt spent), 'snoozed' (a handler ran and deferred it, giving its
-- attempt back), 'dead', or NULL (waiting, never tried). The cancel holds
-- the fan-out lock shared (fan_out_lock_shared.sql), so no replay adds a
-- delivery of the message meanwhile. A claim that
-- took one first has committed by the time the lock is granted, and its
-- row is read as it left it. Finished subscriptions are read by the next
-- statement (message_cancel_finished.sql), so
-- that it sees a completion committed while this one waited.
-- Touches: deliveries.
SELECT d.id, d.subscription,
       CASE WHEN d.state = 'dead' THEN 'dead'
            WHEN d.state = 'running' OR d.lease_token IS NOT NULL THEN 'running'
            WHEN d.attempts > 0 THEN 'retrying'
            WHEN d.snoozes > 0 THEN 'snoozed'
       END AS started
FROM {schema}.deliveries d
WHERE d.message_id = $1
ORDER BY d.subscription
FOR UPDATE
