-- Records migration $1 (named $2, checksum $3) as applied, in the
-- transaction that applied it. Touches: schema_migrations (insert).
INSERT INTO {schema}.schema_migrations (version, name, checksum) VALUES ($1, $2, $3)
