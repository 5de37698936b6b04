-- Courier's outbox schema, version 6: per-tenant rate limits, as token
-- buckets in the database so they hold across every worker and process.
-- A row limits how fast `subscription` starts `tenant`'s deliveries: claims
-- take at most the bucket's whole tokens (refilled at per_second up to burst
-- since refilled_at, on the database clock) and spend one per delivery they
-- claim. Tenants without a row are not limited.
CREATE TABLE {schema}.tenant_rate_limits (
  subscription text             NOT NULL,
  tenant       text             NOT NULL,
  per_second   double precision NOT NULL CHECK (per_second > 0),
  burst        integer          NOT NULL CHECK (burst >= 1),
  tokens       double precision NOT NULL,
  refilled_at  timestamptz      NOT NULL DEFAULT now(),
  PRIMARY KEY (subscription, tenant)
);
