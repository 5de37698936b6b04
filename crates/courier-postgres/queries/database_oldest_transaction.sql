-- Health: how long (s) the oldest transaction open in this database, other
-- than this session's, has run; NULL when none is (or when this role may not
-- see other sessions' xact_start). Touches: pg_stat_activity only.
SELECT extract(epoch FROM clock_timestamp() - min(xact_start))::float8
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL
