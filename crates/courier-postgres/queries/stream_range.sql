-- Up to $5 entries of stream ($1, $2) above id ($3, $4), in id order; like a
-- group's read, only entries of transactions below this snapshot's xmin, so
-- paging by the last id never skips one.
SELECT e.major, e.minor, e.payload, e.headers, e.message_id, e.origin_tenant, e.topic,
       e.schema_version
FROM {schema}.stream_entries e
WHERE e.tenant = $1 AND e.stream = $2
  AND (e.major, e.minor) > ($3, $4)
  AND e.major < pg_snapshot_xmin(pg_current_snapshot())::text::bigint
ORDER BY e.major, e.minor
LIMIT $5
