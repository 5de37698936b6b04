-- When retained message ?1 was enqueued, in ms since the epoch (no row: not
-- retained). Touches: reads messages.
SELECT created_at FROM messages WHERE id = ?1
