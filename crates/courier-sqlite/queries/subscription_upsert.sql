-- Creates a subscription if it does not exist.
-- Touches: subscriptions (insert). Locks: runs in register_subscription's
-- BEGIN IMMEDIATE transaction with subscription_topics_add.sql.
INSERT INTO subscriptions (name) VALUES (?1) ON CONFLICT (name) DO NOTHING
