-- Creates a subscription if it does not exist; returns a row only when it
-- created it. Touches: subscriptions (insert). Locks: runs in
-- register_subscription's BEGIN IMMEDIATE transaction with
-- subscription_topics_add.sql (SQLite's one writer: producers commit wholly
-- before or wholly after it).
INSERT INTO subscriptions (name) VALUES (?1) ON CONFLICT (name) DO NOTHING
RETURNING name
