-- Why message ?1 cannot be cancelled (AdminStore::cancel_message), if it
-- cannot: the first subscription, by name, that has started on it, with
-- 'running' (leased), 'retrying' (an attempt spent), 'snoozed' (a handler ran
-- and deferred it, giving its attempt back), 'dead', or that has finished it:
-- 'discarded' or 'completed' (the view `completions`, as
-- message_deliveries.sql reports it). No row:
-- none has. Run inside the cancel's write transaction, so nothing can start
-- or finish between this check and the delete.
SELECT subscription, started FROM (
  SELECT d.subscription,
         CASE WHEN d.state = 'dead' THEN 'dead'
              WHEN d.state = 'running' OR d.lease_token IS NOT NULL THEN 'running'
              WHEN d.attempts > 0 THEN 'retrying'
              WHEN d.snoozes > 0 THEN 'snoozed'
         END AS started
  FROM deliveries d
  WHERE d.message_id = ?1
  UNION ALL
  SELECT x.subscription, 'discarded' FROM discards x
  WHERE x.message_id = ?1
    AND NOT EXISTS (SELECT 1 FROM deliveries d
                    WHERE d.message_id = ?1 AND d.subscription = x.subscription)
  UNION ALL
  SELECT c.subscription, 'completed' FROM completions c WHERE c.message_id = ?1
)
WHERE started IS NOT NULL
ORDER BY subscription
LIMIT 1
