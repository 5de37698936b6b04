-- Creates the schema and its schema_migrations table (one row per applied
-- migration) if they do not exist yet, inside the migration's transaction.
-- Touches: schema_migrations (create only).
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.schema_migrations (
  version bigint PRIMARY KEY,
  name text NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now());
