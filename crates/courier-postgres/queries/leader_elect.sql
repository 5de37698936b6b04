-- Takes or renews the maintenance lease for holder $1 until now + $2 ms;
-- returns a row when $1 leads. Another holder's lease is taken only once it
-- expired (database clock). Touches: maintenance_leader (one row).
INSERT INTO {schema}.maintenance_leader AS l (name, holder, elected_at, expires_at)
VALUES ('maintenance', $1, statement_timestamp(),
        statement_timestamp() + $2::bigint * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE
SET holder = excluded.holder,
    elected_at = CASE WHEN l.holder = excluded.holder THEN l.elected_at ELSE excluded.elected_at END,
    expires_at = excluded.expires_at
WHERE l.holder = excluded.holder OR l.expires_at < statement_timestamp()
RETURNING l.holder
