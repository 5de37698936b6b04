-- Courier's SQLite schema, version 10: message priorities.
--
-- `messages.priority` (0 to 9, default 0; higher first) is the producer's,
-- plain-SQL producers included; the fan-out trigger copies it to each
-- delivery. A claim serves each tenant of its turn its share as before, and
-- within that share takes the tenant's ready deliveries highest priority
-- first, oldest first within a priority: deliveries_ready now orders each
-- (subscription, tenant) by priority, then id, so the claim's walk stays one
-- index range per tenant and a priority-9 message waits at most for the
-- claim in progress, however long the priority-0 backlog.
ALTER TABLE messages ADD COLUMN priority INTEGER NOT NULL DEFAULT 0
  CHECK (priority BETWEEN 0 AND 9);
ALTER TABLE deliveries ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;

DROP INDEX deliveries_ready;
CREATE INDEX deliveries_ready ON deliveries (subscription, tenant, priority DESC, id)
  WHERE state = 'available';

DROP TRIGGER messages_fan_out;
CREATE TRIGGER messages_fan_out AFTER INSERT ON messages
FOR EACH ROW
BEGIN
  INSERT INTO deliveries
    (message_id, subscription, tenant, topic, schema_version, ordering_key, available_at,
     priority)
  SELECT NEW.id, s.subscription, NEW.tenant, NEW.topic, NEW.schema_version,
         NEW.ordering_key, NEW.available_at, NEW.priority
  FROM (
    SELECT t.subscription FROM subscription_topics t
    WHERE t.prefix IS NULL AND t.pattern = NEW.topic
    UNION
    SELECT t.subscription FROM subscription_topics t
    WHERE t.prefix IS NOT NULL AND substr(NEW.topic, 1, length(t.prefix)) = t.prefix
  ) s
  ORDER BY s.subscription;
END;
