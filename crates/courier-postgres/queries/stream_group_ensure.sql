-- Creates group $3 of stream ($1, $2) unless it exists; returns a row when
-- it created it. $4: 'beginning', 'end' or 'after' (then $5, $6 is the id).
-- At the end, the cursor sits below the transactions still running and the
-- creation snapshot decides those at or above its xmin.
INSERT INTO {schema}.stream_groups (tenant, stream, grp, last_major, last_minor, start_snapshot)
SELECT $1, $2, $3,
       CASE $4 WHEN 'end' THEN pg_snapshot_xmin(s.snap)::text::bigint - 1 WHEN 'after' THEN $5 ELSE 0 END,
       CASE $4 WHEN 'end' THEN 9223372036854775807 WHEN 'after' THEN $6 ELSE 0 END,
       CASE $4 WHEN 'end' THEN s.snap END
FROM (SELECT pg_current_snapshot() AS snap) s
ON CONFLICT (tenant, stream, grp) DO NOTHING
RETURNING 1
