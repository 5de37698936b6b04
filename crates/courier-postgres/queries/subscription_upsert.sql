-- Creates a subscription if it does not exist; returns a row only when it
-- created it. Touches: subscriptions. Runs under the fan-out lock
-- (fan_out_lock_try.sql) in register_subscription's transaction.
INSERT INTO {schema}.subscriptions (name) VALUES ($1) ON CONFLICT (name) DO NOTHING
RETURNING name
