-- The newest migration applied to the schema (NULL: none).
-- Touches: reads schema_migrations. Locks: nothing.
SELECT max(version) FROM {schema}.schema_migrations
