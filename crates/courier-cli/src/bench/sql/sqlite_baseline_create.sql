-- The baseline on SQLite: one table, no fan-out, no leases, no receipts.
CREATE TABLE baseline_queue (
  id         INTEGER PRIMARY KEY,
  tenant     TEXT    NOT NULL,
  topic      TEXT    NOT NULL,
  payload    TEXT    NOT NULL,
  created_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) STRICT
