-- Courier's outbox schema, version 8: maintenance (the rescuer and the
-- pruner) runs on one elected worker per database instead of on every worker.
--
-- The leader holds a lease in this one-row table and renews it before each
-- pass; when it stops it resigns (deletes the row), and when it dies its lease
-- runs out and the next worker to try takes over. Operators see who leads and
-- since when. Two leaders at once (a lease that lapsed while a pass was
-- running) is safe: every maintenance write is fenced on its own.
CREATE TABLE {schema}.maintenance_leader (
  name       text        PRIMARY KEY CHECK (name = 'maintenance'),
  holder     text        NOT NULL,
  elected_at timestamptz NOT NULL,
  expires_at timestamptz NOT NULL
);
