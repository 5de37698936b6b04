-- Health: dead row versions per table of the store's schema, by the
-- statistics collector. Touches: pg_stat_user_tables only.
SELECT relname::text AS name, n_dead_tup AS dead
FROM pg_stat_user_tables
WHERE schemaname = '{schema}'
ORDER BY relname
