-- The second step of a claim: sets the picked deliveries running under fresh
-- leases and returns them with their messages.
-- Touches: deliveries (update), reads messages by primary key for the payload.
-- Locks: runs inside the claim's BEGIN IMMEDIATE transaction, so the tenant list,
-- the pick and the update see one state and no other claimer takes the same rows.
-- Shape: the picks placeholder is a UNION ALL of claim_pick.sql, one per tenant in the turn
-- (grouped to stay under SQLite's limit on compound terms), so each tenant's
-- share is walked along the index and stops early. ?1 subscription, ?2 routes as
-- a JSON array of [topic, schema_version, max_attempts], ?3 lease in ms, ?4 worker.
-- The lease token is a random UUIDv4 made per row from SQLite's CSPRNG.
-- RETURNING may come back in any order; the caller sorts by id.
WITH routes (topic, schema_version, max_attempts) AS MATERIALIZED (
  SELECT value ->> 0, value ->> 1, value ->> 2 FROM json_each(?2)
)
UPDATE deliveries
SET state = 'running',
    attempts = attempts + 1,
    max_attempts = (SELECT r.max_attempts FROM routes r
                    WHERE (r.topic = deliveries.topic OR r.topic = '*')
                      AND (r.schema_version = deliveries.schema_version OR r.schema_version = 0)
                    ORDER BY r.topic = '*', r.schema_version = 0
                    LIMIT 1),
    lease_token = lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) ||
                        '-4' || substr(hex(randomblob(2)), 2) ||
                        '-' || substr('89ab', 1 + (random() & 3), 1) || substr(hex(randomblob(2)), 2) ||
                        '-' || hex(randomblob(6))),
    lease_expires_at = CAST(round(unixepoch('subsec') * 1000) AS INTEGER) + ?3,
    claimed_by = ?4
WHERE id IN (
{picks}
)
RETURNING id, message_id, tenant, topic, schema_version, ordering_key, priority, attempts, max_attempts,
          lease_token, lease_expires_at,
          (SELECT m.payload FROM messages m WHERE m.id = deliveries.message_id) AS payload,
          (SELECT m.headers FROM messages m WHERE m.id = deliveries.message_id) AS headers,
          (SELECT m.occurred_at FROM messages m WHERE m.id = deliveries.message_id) AS occurred_at,
          (SELECT m.created_at FROM messages m WHERE m.id = deliveries.message_id) AS created_at
