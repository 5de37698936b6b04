-- A page of messages, newest first: id below ?3 (NULL: from the newest), at most ?6.
-- Filters (NULL: any): tenants ?1 as a JSON array of names (a token's scope;
-- `[]` matches nothing), topic ?2, state ?4 and subscription ?5. State
-- `available`, `running` or `dead` means a delivery in that state (of
-- subscription ?5 if given); `completed` means a receipt with no open delivery
-- for the same subscription (exactly when message_deliveries.sql reports
-- `completed`); subscription alone means the message is owed to it or applied
-- by it. The caller checks ?4 against those four words before it gets here.
-- Ids are lowercase hyphenated UUID text, whose text order is the UUIDs' byte
-- order, so "newest first" and the cursor mean what they do on PostgreSQL.
-- Touches: reads messages, deliveries and receipts. Locks: nothing.
-- Shape: walks the messages primary key backwards from the cursor and probes
-- deliveries (UNIQUE (message_id, subscription)) and receipts (primary key
-- (message_id, subscription)) per message; a filter that matches few messages
-- of a long outbox reads further back (retention bounds how far).
SELECT m.id, m.tenant, m.topic, m.schema_version, m.payload, m.headers,
       m.ordering_key, m.idempotency_key, m.occurred_at, m.available_at, m.created_at
FROM messages m
WHERE (?1 IS NULL OR m.tenant IN (SELECT value FROM json_each(?1)))
  AND (?2 IS NULL OR m.topic = ?2)
  AND (?3 IS NULL OR m.id < ?3)
  AND CASE
        WHEN ?4 IS NULL AND ?5 IS NULL THEN 1
        WHEN ?4 IS NULL THEN
          EXISTS (SELECT 1 FROM deliveries d
                  WHERE d.message_id = m.id AND d.subscription = ?5)
          OR EXISTS (SELECT 1 FROM receipts r
                     WHERE r.message_id = m.id AND r.subscription = ?5)
        WHEN ?4 = 'completed' THEN
          EXISTS (SELECT 1 FROM receipts r
                  WHERE r.message_id = m.id
                    AND (?5 IS NULL OR r.subscription = ?5)
                    AND NOT EXISTS (SELECT 1 FROM deliveries d
                                    WHERE d.message_id = r.message_id
                                      AND d.subscription = r.subscription))
        ELSE
          EXISTS (SELECT 1 FROM deliveries d
                  WHERE d.message_id = m.id AND d.state = ?4
                    AND (?5 IS NULL OR d.subscription = ?5))
      END
ORDER BY m.id DESC
LIMIT ?6
