-- A page of messages, newest first: id below $3 (NULL: from the newest), at most $6.
-- Filters (NULL: any): tenants $1 (a token's scope; an empty array matches
-- nothing), topic $2, state $4 and subscription $5. State `available`,
-- `running` or `dead` means a delivery in that state (of subscription $5 if
-- given); `completed` means a receipt with no open delivery for the same
-- subscription (exactly when message_deliveries.sql reports `completed`);
-- subscription alone means the message is owed to it or applied by it.
-- The caller checks $4 against those four words before it gets here.
-- Touches: reads messages, deliveries and receipts. Locks: nothing.
-- Shape: walks the messages primary key backwards from the cursor and probes
-- deliveries (UNIQUE (message_id, subscription)) and receipts (primary key
-- (message_id, subscription)) per message, so a page costs its length in index
-- probes when most messages match; a filter that matches few messages of a long
-- outbox reads further back (retention bounds how far).
SELECT m.id, m.tenant, m.topic, m.schema_version, m.payload::text AS payload,
       m.headers::text AS headers, m.ordering_key, m.idempotency_key,
       m.occurred_at, m.available_at, m.created_at
FROM {schema}.messages m
WHERE ($1::text[] IS NULL OR m.tenant = ANY ($1::text[]))
  AND ($2::text IS NULL OR m.topic = $2::text)
  AND ($3::uuid IS NULL OR m.id < $3::uuid)
  AND CASE
        WHEN $4::text IS NULL AND $5::text IS NULL THEN true
        WHEN $4::text IS NULL THEN
          EXISTS (SELECT 1 FROM {schema}.deliveries d
                  WHERE d.message_id = m.id AND d.subscription = $5::text)
          OR EXISTS (SELECT 1 FROM {schema}.receipts r
                     WHERE r.message_id = m.id AND r.subscription = $5::text)
        WHEN $4::text = 'completed' THEN
          EXISTS (SELECT 1 FROM {schema}.receipts r
                  WHERE r.message_id = m.id
                    AND ($5::text IS NULL OR r.subscription = $5::text)
                    AND NOT EXISTS (SELECT 1 FROM {schema}.deliveries d
                                    WHERE d.message_id = r.message_id
                                      AND d.subscription = r.subscription))
        ELSE
          EXISTS (SELECT 1 FROM {schema}.deliveries d
                  WHERE d.message_id = m.id AND d.state = $4::text
                    AND ($5::text IS NULL OR d.subscription = $5::text))
      END
ORDER BY m.id DESC
LIMIT $6
