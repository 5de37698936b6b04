-- The readers' horizon: entries of transactions below it can be handed out.
SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint
