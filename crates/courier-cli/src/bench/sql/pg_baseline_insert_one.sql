-- One message per statement (the producer wraps it in its own transaction).
INSERT INTO {schema}.baseline_queue (tenant, topic, payload) VALUES ($1, $2, $3::jsonb)
