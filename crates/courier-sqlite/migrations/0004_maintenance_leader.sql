-- Courier's SQLite schema, version 4: maintenance (the rescuer and the
-- pruner) runs on one elected worker per database file instead of on every
-- worker. The leader holds a lease in this one-row table and renews it before
-- each pass; it resigns when it stops, and when it dies its lease runs out.
-- Times are ms since the epoch.
CREATE TABLE maintenance_leader (
  name       TEXT    NOT NULL PRIMARY KEY CHECK (name = 'maintenance'),
  holder     TEXT    NOT NULL,
  elected_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL
) STRICT;
