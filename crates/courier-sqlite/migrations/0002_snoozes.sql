-- Courier's SQLite schema, version 2: snoozes (a handler's "not now", e.g. a
-- tenant over its quota) put a delivery back without spending an attempt;
-- they are counted here and bounded.
ALTER TABLE deliveries ADD COLUMN snoozes INTEGER NOT NULL DEFAULT 0;
