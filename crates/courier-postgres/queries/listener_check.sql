-- The notifier's liveness probe: a notification on the store's channel ($1)
-- with the listening connection's own check token ($2), which that connection
-- must receive within LISTEN_CHECK. NOTIFY takes a database-wide lock until
-- commit; this statement commits at once. Touches: nothing.
SELECT pg_notify($1, $2)
