-- A page of messages, newest first by (created_at, id), below the key ($7
-- created_at, $8 id; NULL: from the newest), at most $9. The caller passes
-- the cursor or the end of the enqueue range, whichever is lower
-- (MessageFilter::scan_bounds), so the range's end needs no bound of its own;
-- with a message id it narrows the key and the range's start ($6) to that
-- message's own key, so the scan is a seek.
-- Filters (NULL: any): tenants $1 (a token's scope; an empty array matches
-- nothing), topic $2, state $3, subscription $4, message id $5, and the
-- enqueue range's start $6. State `available`, `running` or `dead`
-- means a delivery in that state (of subscription $4 if given); `completed`
-- means a subscription in the view `completions` (exactly when
-- message_deliveries.sql reports `completed`); subscription alone means the
-- message is owed to it, applied or received by it (the view `received`, see
-- migrations/0014_owed_by_fan_out_time.sql). The caller checks
-- $3 against those four words before it gets here.
-- Touches: reads messages, deliveries, receipts, discards,
-- subscription_topics and removed_topics. Locks: nothing.
-- Shape: the key and the range's start are bounds on messages_enqueued
-- (created_at, id), written with coalesce so that they stay index bounds in a
-- generic plan: the scan starts at the key and stops at the range's start,
-- walking backwards. (A separate `created_at < end` beside the key would
-- leave the scan to start at the newest and skip down.) Per message it probes deliveries
-- (UNIQUE (message_id, subscription)), receipts and discards (primary keys
-- (message_id, subscription)), the message itself again (the views join it
-- by its primary key) and the subscriptions' few topic patterns, so
-- a page costs its length in index probes when most
-- messages match; a filter that matches few messages of the range reads
-- further back (the range, or retention, bounds how far). The views are
-- probed with `OFFSET 0`: without it the planner may turn the EXISTS into a
-- hashed subplan that builds the whole view once (seen: 400 ms for a page of
-- 50 over 100,000 messages, against 1 ms probing per message).
SELECT m.id, m.tenant, m.topic, m.schema_version, m.payload::text AS payload,
       m.headers::text AS headers, m.ordering_key, m.idempotency_key, m.priority,
       m.occurred_at, m.available_at, m.created_at
FROM {schema}.messages m
WHERE ($1::text[] IS NULL OR m.tenant = ANY ($1::text[]))
  AND ($2::text IS NULL OR m.topic = $2::text)
  AND ($5::uuid IS NULL OR m.id = $5::uuid)
  AND m.created_at >= coalesce($6::timestamptz, '-infinity')
  AND (m.created_at, m.id) < (coalesce($7::timestamptz, 'infinity'),
                              coalesce($8::uuid, 'ffffffff-ffff-ffff-ffff-ffffffffffff'))
  AND CASE
        WHEN $3::text IS NULL AND $4::text IS NULL THEN true
        WHEN $3::text IS NULL THEN
          EXISTS (SELECT 1 FROM {schema}.deliveries d
                  WHERE d.message_id = m.id AND d.subscription = $4::text)
          OR EXISTS (SELECT 1 FROM {schema}.discards x
                     WHERE x.message_id = m.id AND x.subscription = $4::text)
          OR EXISTS (SELECT 1 FROM {schema}.received o
                     WHERE o.message_id = m.id AND o.subscription = $4::text OFFSET 0)
        WHEN $3::text = 'completed' THEN
          EXISTS (SELECT 1 FROM {schema}.completions c
                  WHERE c.message_id = m.id
                    AND ($4::text IS NULL OR c.subscription = $4::text)
                  OFFSET 0)
        ELSE
          EXISTS (SELECT 1 FROM {schema}.deliveries d
                  WHERE d.message_id = m.id AND d.state = $3::text
                    AND ($4::text IS NULL OR d.subscription = $4::text))
      END
ORDER BY m.created_at DESC, m.id DESC
LIMIT $9
