-- When retained message $1 was enqueued (no row: not retained). Touches: reads messages.
SELECT created_at FROM {schema}.messages WHERE id = $1
