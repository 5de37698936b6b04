-- A page of messages, newest first by (created_at, id), below the key (?7
-- created_at, ?8 id; NULL: from the newest), at most ?9. The caller passes
-- the cursor or the end of the enqueue range, whichever is lower
-- (MessageFilter::scan_bounds), so the range's end needs no bound of its own;
-- with a message id it narrows the key and the range's start (?6) to that
-- message's own key, so the scan is a seek.
-- Filters (NULL: any): tenants ?1 as a JSON array of names (a token's scope;
-- `[]` matches nothing), topic ?2, state ?3, subscription ?4, message id ?5,
-- and the enqueue range's start ?6 in milliseconds. State
-- `available`, `running` or `dead` means a delivery in that state (of
-- subscription ?4 if given); `completed` means a subscription in the view
-- `completions` (exactly when message_deliveries.sql reports `completed`);
-- subscription alone means the message is owed to it, applied or received
-- by it (the view `received`, see migrations/0008_removed_topics.sql). The
-- caller checks ?3 against those four words before it gets here. Ids are lowercase hyphenated UUID text, whose text order is the
-- UUIDs' byte order, so ties break as they do on PostgreSQL.
-- Touches: reads messages, deliveries, receipts, discards,
-- subscription_topics and removed_topics. Locks: nothing.
-- Shape: the key and the range's start are bounds on messages_enqueued
-- (created_at, id), written with coalesce (not `IS NULL OR`) so that the
-- planner, which plans before it sees the values, can seek on them: the scan
-- starts at the key and stops at the range's start.
-- Per message it probes deliveries (UNIQUE (message_id, subscription)),
-- receipts and discards (primary keys (message_id, subscription)), the
-- message again by its key (the views join it) and the subscriptions' few
-- topic patterns; a filter that matches
-- few messages of the range reads further back (the range, or retention,
-- bounds how far).
SELECT m.id, m.tenant, m.topic, m.schema_version, m.payload, m.headers,
       m.ordering_key, m.idempotency_key, m.priority, m.occurred_at, m.available_at, m.created_at
FROM messages m
WHERE (?1 IS NULL OR m.tenant IN (SELECT value FROM json_each(?1)))
  AND (?2 IS NULL OR m.topic = ?2)
  AND (?5 IS NULL OR m.id = ?5)
  AND m.created_at >= coalesce(?6, -9223372036854775808)
  AND (m.created_at, m.id) < (coalesce(?7, 9223372036854775807), coalesce(?8, 'g'))
  AND CASE
        WHEN ?3 IS NULL AND ?4 IS NULL THEN 1
        WHEN ?3 IS NULL THEN
          EXISTS (SELECT 1 FROM deliveries d
                  WHERE d.message_id = m.id AND d.subscription = ?4)
          OR EXISTS (SELECT 1 FROM discards x
                     WHERE x.message_id = m.id AND x.subscription = ?4)
          OR EXISTS (SELECT 1 FROM received o
                     WHERE o.message_id = m.id AND o.subscription = ?4)
        WHEN ?3 = 'completed' THEN
          EXISTS (SELECT 1 FROM completions c
                  WHERE c.message_id = m.id AND (?4 IS NULL OR c.subscription = ?4))
        ELSE
          EXISTS (SELECT 1 FROM deliveries d
                  WHERE d.message_id = m.id AND d.state = ?3
                    AND (?4 IS NULL OR d.subscription = ?4))
      END
ORDER BY m.created_at DESC, m.id DESC
LIMIT ?9
