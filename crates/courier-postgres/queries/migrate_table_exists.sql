-- Whether schema $1 has a schema_migrations table, i.e. was ever migrated.
-- Touches: reads the pg_tables catalog view. Locks: nothing.
SELECT EXISTS (SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'schema_migrations')
