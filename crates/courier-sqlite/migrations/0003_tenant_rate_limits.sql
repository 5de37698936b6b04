-- Courier's SQLite schema, version 3: per-tenant rate limits, as token
-- buckets (see the PostgreSQL migration 0006). Times are integer
-- milliseconds. Tenants without a row are not limited.
CREATE TABLE tenant_rate_limits (
  subscription TEXT    NOT NULL,
  tenant       TEXT    NOT NULL,
  per_second   REAL    NOT NULL CHECK (per_second > 0),
  burst        INTEGER NOT NULL CHECK (burst >= 1),
  tokens       REAL    NOT NULL,
  refilled_at  INTEGER NOT NULL DEFAULT (CAST(round(unixepoch('subsec') * 1000) AS INTEGER)),
  PRIMARY KEY (subscription, tenant)
) STRICT;
