-- One message per statement (the producer wraps it in BEGIN IMMEDIATE ... COMMIT).
INSERT INTO baseline_queue (tenant, topic, payload) VALUES (?1, ?2, ?3)
