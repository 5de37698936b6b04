-- Creates the schema and its schema_migrations table (one row per applied
-- migration, with the SHA-256 of the migration's SQL as shipped) if they do
-- not exist yet, and adds the checksum column to a table an older build
-- created (its rows keep a NULL checksum until the runner records this
-- build's: trust on first use). Inside the migration's transaction, under
-- the migration lock. Touches: schema_migrations (create, add column).
-- Locks: schema_migrations, ACCESS EXCLUSIVE, only when the column is
-- added: the ALTER runs only then, so readers of the version (health
-- checks) are not held up by every start's bootstrap.
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
  version bigint PRIMARY KEY,
  name text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now(),
  checksum text);
DO $$
BEGIN
  IF NOT EXISTS (
    SELECT 1 FROM pg_attribute
    WHERE attrelid = '{schema}.schema_migrations'::regclass
      AND attname = 'checksum' AND NOT attisdropped) THEN
    ALTER TABLE {schema}.schema_migrations ADD COLUMN checksum text;
  END IF;
END
$$;
