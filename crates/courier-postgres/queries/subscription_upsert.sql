-- Creates a subscription if it does not exist. Touches: subscriptions.
INSERT INTO {schema}.subscriptions (name) VALUES ($1) ON CONFLICT (name) DO NOTHING
