-- A batch in one statement: SQLite has no arrays, so the rows come as one
-- JSON array of [tenant, topic, payload] triples, unpacked by json_each.
INSERT INTO baseline_queue (tenant, topic, payload)
SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]'), json_extract(value, '$[2]')
FROM json_each(?1)
