-- The per-subscription state of one message: open deliveries from
-- deliveries; `discarded` from discards; `completed` for every subscription
-- that applied it (a receipt) or receives it (a pattern matching its topic
-- since before it was enqueued, see migrations/0007_plain_completions.sql)
-- and has neither an open delivery nor a discard of it: a plain handler's
-- completion deletes the delivery and writes nothing else.
-- Touches: reads deliveries, discards, receipts, messages and
-- subscription_topics through their keys. Locks: nothing.
WITH owed AS (
  SELECT r.subscription FROM receipts r WHERE r.message_id = ?1
  UNION
  SELECT t.subscription
  FROM messages m
  JOIN subscription_topics t
    ON (t.pattern = m.topic
        OR (t.prefix IS NOT NULL AND substr(m.topic, 1, length(t.prefix)) = t.prefix))
   AND (m.created_at, m.id) >= (t.since, t.since_id)
  WHERE m.id = ?1
)
SELECT d.subscription, d.state, d.attempts, d.errors, d.id AS delivery_id
FROM deliveries d WHERE d.message_id = ?1
UNION ALL
SELECT x.subscription, 'discarded', NULL, '[]', NULL
FROM discards x WHERE x.message_id = ?1
  AND NOT EXISTS (SELECT 1 FROM deliveries d
                  WHERE d.message_id = ?1 AND d.subscription = x.subscription)
UNION ALL
SELECT o.subscription, 'completed', NULL, '[]', NULL
FROM owed o
WHERE NOT EXISTS (SELECT 1 FROM deliveries d
                  WHERE d.message_id = ?1 AND d.subscription = o.subscription)
  AND NOT EXISTS (SELECT 1 FROM discards x
                  WHERE x.message_id = ?1 AND x.subscription = o.subscription)
ORDER BY 1
