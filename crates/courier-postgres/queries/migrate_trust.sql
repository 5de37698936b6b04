-- Records this build's checksums ($2, by version $1) for applied migrations
-- an older build recorded without one (trust on first use), before the
-- runner compares every recorded checksum with the build's. Rows that have
-- a checksum keep it, so an edited migration is still found. In the
-- migration's transaction, under the migration lock.
-- Touches: schema_migrations (update of NULL checksums only).
UPDATE {schema}.schema_migrations AS m SET checksum = shipped.checksum
FROM unnest($1::bigint[], $2::text[]) AS shipped (version, checksum)
WHERE m.version = shipped.version AND m.checksum IS NULL
