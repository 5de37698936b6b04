-- Registers a reader blocked on stream ($1, $2) until $3 ms from now:
-- appends until then notify channel `{schema}.streams`.
INSERT INTO {schema}.stream_waiters (tenant, stream, until)
VALUES ($1, $2, statement_timestamp() + $3::bigint * interval '1 millisecond')
ON CONFLICT (tenant, stream) DO UPDATE SET until = greatest({schema}.stream_waiters.until, excluded.until)
