-- Every applied migration: version, name, recorded checksum, applied_at.
-- The checksum is read through to_jsonb so that the same query reads a
-- table an older build created without the column (`courier migrate
-- status` must not change the database, so it cannot add it): NULL then.
-- Touches: reads schema_migrations. Locks: nothing.
SELECT m.version, m.name, to_jsonb(m) ->> 'checksum' AS checksum, m.applied_at
FROM {schema}.schema_migrations AS m
ORDER BY m.version
