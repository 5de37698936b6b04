-- Serialises migrations of one schema ($1: 'courier-migrate:<schema>') across
-- processes: several processes starting at once migrate exactly once, each
-- after the previous one committed. Touches: no table. Locks: the advisory
-- lock, exclusively, until the migration's transaction ends.
SELECT pg_advisory_xact_lock(hashtext($1))
