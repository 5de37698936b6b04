-- Claims up to $4 ready deliveries of subscription $1, taking tenants in turn.
-- Touches: deliveries (locks the claimed rows with FOR UPDATE SKIP LOCKED, sets
-- them running under a fresh lease token), ordering_locks (one row per claimed
-- delivery with an ordering key), tenant_rate_limits (the buckets of limited
-- tenants it claimed for), reads messages for the payload.
-- Shape: a loose index scan of deliveries_ready finds up to $3 tenants with
-- ready work, starting after the cursor $2; each tenant then gets an equal share
-- of the batch, and what tenants with less ready work (or at their bound)
-- leave of their shares tops up the tenants that took their whole share (see
-- `topped`). A share is its ready deliveries of priority above 0 first (highest, then
-- oldest, along deliveries_urgent), then priority 0 walked in enqueue order
-- along deliveries_ready, so one tenant's backlog cannot crowd out the rest
-- and a tenant's urgent message never waits behind its backlog. Only the routes this worker handles
-- (topic '*' with version 0 is a catch-all: every topic the subscription receives)
-- ($5 topics, $6 versions, $7 attempt budgets) are claimed; a delivery with an
-- ordering key waits while an earlier delivery with that key is not done or
-- any delivery with that key is running (so a retried dead letter never runs
-- beside a later one), and runs only if it takes its key's row in
-- ordering_locks (see `keyed`); the fan-out trigger serialises producers per
-- key, so enqueue order is commit order. A
-- tenant at its in-flight limit $8 (NULL: none), or out of tokens in its rate
-- limit (tenant_rate_limits), is skipped without spending attempts.
-- A paused subscription claims nothing (see `turn`).
-- Times are the database's: statement_timestamp(), never the worker's clock.
WITH RECURSIVE tenants AS (
  (SELECT d.tenant FROM {schema}.deliveries d
    WHERE d.subscription = $1 AND d.state = 'available' AND d.tenant > $2
    ORDER BY d.tenant LIMIT 1)
  UNION ALL
  SELECT (SELECT d.tenant FROM {schema}.deliveries d
           WHERE d.subscription = $1 AND d.state = 'available' AND d.tenant > t.tenant
           ORDER BY d.tenant LIMIT 1)
  FROM tenants t
  WHERE t.tenant IS NOT NULL
),
-- The turn: the tenants this claim serves, each with the floor its scan
-- starts above. A full pass ($13 empty) discovers tenants after the cursor
-- with the walk above (the recursive CTE is only read when $13 is empty) and
-- scans each from its first ready row (floor 0). A floor pass serves the
-- tenants $13 the store already knows that have a ready row above their
-- floor $14, each from that floor: the store's floors sit just below the
-- lowest id its last claim of the tenant took (see src/floors.rs). Under a
-- snapshot held open elsewhere, claimed and completed rows leave index
-- entries that cannot be removed; a floor pass starts past them instead of
-- visiting each one.
-- A paused subscription gets an empty turn, so nothing is claimed and its
-- deliveries wait untouched. The check is uncorrelated: PostgreSQL runs it
-- once (a one-time filter) and skips the tenant walk entirely when paused.
turn AS (
  SELECT u.tenant, u.floor FROM (
    (SELECT tenant, 0::bigint AS floor FROM tenants
      WHERE tenant IS NOT NULL AND cardinality($13::text[]) = 0
      LIMIT $3)
    UNION ALL
    -- (A lateral probe, not EXISTS: as a semi-join the planner would scan
    -- the whole subscription and filter the floor afterwards.)
    SELECT g.tenant, g.floor FROM unnest($13::text[], $14::bigint[]) AS g (tenant, floor)
    CROSS JOIN LATERAL (
      SELECT 1 FROM {schema}.deliveries d
      WHERE d.subscription = $1
        AND (d.tenant, d.id) > (g.tenant, g.floor) AND d.tenant <= g.tenant
        AND d.state = 'available'
      ORDER BY d.tenant, d.id
      LIMIT 1
    ) ready
  ) u
  WHERE NOT EXISTS (SELECT 1 FROM {schema}.subscriptions p WHERE p.name = $1 AND p.paused)
),
share AS (
  SELECT greatest(1, $4::int / greatest(count(*), 1)::int) AS per_tenant,
         count(*)::int AS tenants
  FROM turn
),
routes AS (
  SELECT * FROM unnest($5::text[], $6::int[], $7::int[]) AS r (topic, schema_version, max_attempts)
),
-- How many each tenant may take: its share, at most its bound: what it
-- may still run under its in-flight limit, and the whole tokens of its rate
-- limit's bucket (see `metered`); least() ignores a NULL (no limit, no
-- bucket).
quota AS (
  SELECT t.tenant, t.floor, least(s.per_tenant, l.bound) AS n, l.bound
  FROM turn t
  CROSS JOIN share s
  CROSS JOIN LATERAL (
    SELECT least(
      CASE WHEN $8::int IS NOT NULL THEN greatest(0, $8::int - (
        SELECT count(*) FROM {schema}.deliveries f
        WHERE f.subscription = $1 AND f.tenant = t.tenant AND f.state = 'running')::int)
      END,
      (SELECT greatest(0, floor(least(b.burst, b.tokens + b.per_second * greatest(0,
                extract(epoch FROM statement_timestamp() - b.refilled_at)))))::int
       FROM {schema}.tenant_rate_limits b
       WHERE b.subscription = $1 AND b.tenant = t.tenant)) AS bound
  ) l
),
picked AS MATERIALIZED (
  SELECT c.id, c.tenant, c.ordering_key, c.priority
  FROM quota q
  -- Within the tenant's share, priority above 0 first (highest, then
  -- oldest, along deliveries_urgent), then priority 0 in enqueue order. The
  -- Append runs its branches in turn and the outer LIMIT stops it, so the
  -- priority-0 walk starts only when the urgent branch is short, and each
  -- branch locks only the rows it hands on. The urgent branch runs only when
  -- the subscription has a ready urgent delivery at all (an uncorrelated
  -- probe: one per claim, not one per tenant). The probe is a scalar
  -- subquery ordered as deliveries_urgent is (EXISTS would drop the ORDER
  -- BY): without it, once ANALYZE has seen many urgent rows
  -- the planner expects a sequential scan to find one at once, and after
  -- they were claimed that scan reads the whole table on every claim
  -- (seen: 28 ms of a 30 ms claim, 100,000 deliveries, 10 % urgent).
  CROSS JOIN LATERAL (
    -- (Each branch is a subquery of its own: FOR UPDATE is not allowed
    -- directly in a UNION's branches.)
    SELECT u.id, u.tenant, u.ordering_key, u.priority FROM (
      SELECT * FROM (SELECT d.id, d.tenant, d.ordering_key, d.priority
       FROM {schema}.deliveries d
       WHERE (SELECT x.id FROM {schema}.deliveries x
              WHERE x.subscription = $1 AND x.state = 'available' AND x.priority > 0
              ORDER BY x.tenant, x.priority DESC, x.id
              LIMIT 1) IS NOT NULL
         AND d.subscription = $1
         AND d.tenant = q.tenant
         AND d.state = 'available'
         AND d.priority > 0
         AND d.available_at <= statement_timestamp()
         AND EXISTS (SELECT 1 FROM routes r
                     WHERE (r.topic = d.topic OR r.topic = '*')
                       AND (r.schema_version = d.schema_version OR r.schema_version = 0))
         AND (d.ordering_key IS NULL OR NOT EXISTS (
               SELECT 1 FROM {schema}.deliveries e
               WHERE e.subscription = d.subscription AND e.tenant = d.tenant
                 AND e.ordering_key = d.ordering_key AND e.ordering_key IS NOT NULL
                 AND e.state <> 'dead'
                 AND (e.id < d.id OR e.state = 'running')))
       ORDER BY d.priority DESC, d.id
       LIMIT q.n
       FOR UPDATE OF d SKIP LOCKED) urgent
      UNION ALL
      SELECT * FROM (SELECT d.id, d.tenant, d.ordering_key, d.priority
       FROM {schema}.deliveries d
       -- The tenant is bounded from both sides instead of `d.tenant = t.tenant`:
       -- with an equality the planner treats the tenant as a constant, may walk
       -- the primary key in id order filtering every other tenant's rows (seen:
       -- 1.2 s per claim for 50 small tenants beside a 200,000-row backlog),
       -- whereas `ORDER BY d.tenant, d.id` over this range can only come from
       -- deliveries_ready, which starts at the tenant's first ready row.
       WHERE d.subscription = $1
         AND (d.tenant, d.id) > (q.tenant, q.floor)
         AND d.tenant <= q.tenant
         AND d.state = 'available'
         AND d.priority = 0
         AND d.available_at <= statement_timestamp()
         AND EXISTS (SELECT 1 FROM routes r
                     WHERE (r.topic = d.topic OR r.topic = '*')
                       AND (r.schema_version = d.schema_version OR r.schema_version = 0))
         AND (d.ordering_key IS NULL OR NOT EXISTS (
               SELECT 1 FROM {schema}.deliveries e
               WHERE e.subscription = d.subscription AND e.tenant = d.tenant
                 AND e.ordering_key = d.ordering_key AND e.ordering_key IS NOT NULL
                 AND e.state <> 'dead'
                 AND (e.id < d.id OR e.state = 'running')))
       ORDER BY d.tenant, d.id
       LIMIT q.n
       FOR UPDATE OF d SKIP LOCKED) plain
    ) u
    LIMIT q.n
  ) c
),
-- The top-up: what the shares left (the shares less what they took: tenants
-- with less ready work or at their bound; the split's remainder is not
-- handed out, as on SQLite, where claims of 100 rather than 128 over 50
-- backlogged tenants drained faster) goes to the tenants that took their
-- whole share, and may take more under their bound; split evenly (the
-- remainder one each from a tenant picked by the claim's random lease token
-- $11 on, so none is favoured claim after claim). Each goes on where its
-- share stopped, in the share's order: a share that was all urgent goes on
-- with its urgent walk after the last it took (the lowest priority it took,
-- and the newest at that priority) and then priority 0 from its floor; a
-- share that reached priority 0 had no more urgent work to take, and goes on
-- with its priority-0 walk above the last id it took. The walks are the
-- branches of `picked` over again. When nothing is left the LIMIT is 0 and
-- PostgreSQL runs neither walk.
wanting AS (
  SELECT q.tenant, q.bound - q.n AS room,
         coalesce(max(p.id) FILTER (WHERE p.priority = 0), q.floor) AS after,
         count(*) FILTER (WHERE p.priority = 0) = 0 AS urgent_only,
         min(p.priority) AS last_priority,
         (array_agg(p.id ORDER BY p.priority, p.id DESC))[1] AS last_urgent,
         (row_number() OVER (ORDER BY q.tenant))::int - 1 AS rank,
         (count(*) OVER ())::int AS m
  FROM quota q
  JOIN picked p ON p.tenant = q.tenant
  GROUP BY q.tenant, q.n, q.bound, q.floor
  HAVING count(*) = q.n
     AND (q.bound IS NULL OR q.bound > q.n)
),
topped AS MATERIALIZED (
  SELECT c.id, c.tenant, c.ordering_key
  FROM wanting w
  CROSS JOIN (SELECT greatest(0, least($4::int, s.per_tenant * s.tenants)
                               - (SELECT count(*) FROM picked)::int) AS n
              FROM share s) spare
  CROSS JOIN LATERAL (
    SELECT least(w.room, spare.n / w.m
                         + CASE WHEN (w.rank + (hashtext($11::text)::bigint + 2147483648)) % w.m
                                     < spare.n % w.m
                                THEN 1 ELSE 0 END) AS n
  ) more
  CROSS JOIN LATERAL (
    SELECT u.id, u.tenant, u.ordering_key FROM (
      SELECT * FROM (SELECT d.id, d.tenant, d.ordering_key
       FROM {schema}.deliveries d
       WHERE w.urgent_only
         AND d.subscription = $1
         AND d.tenant = w.tenant
         AND d.state = 'available'
         AND d.priority > 0
         AND (d.priority < w.last_priority
              OR (d.priority = w.last_priority AND d.id > w.last_urgent))
         AND d.available_at <= statement_timestamp()
         AND EXISTS (SELECT 1 FROM routes r
                     WHERE (r.topic = d.topic OR r.topic = '*')
                       AND (r.schema_version = d.schema_version OR r.schema_version = 0))
         AND (d.ordering_key IS NULL OR NOT EXISTS (
               SELECT 1 FROM {schema}.deliveries e
               WHERE e.subscription = d.subscription AND e.tenant = d.tenant
                 AND e.ordering_key = d.ordering_key AND e.ordering_key IS NOT NULL
                 AND e.state <> 'dead'
                 AND (e.id < d.id OR e.state = 'running')))
       ORDER BY d.priority DESC, d.id
       LIMIT more.n
       FOR UPDATE OF d SKIP LOCKED) urgent
      UNION ALL
      SELECT * FROM (SELECT d.id, d.tenant, d.ordering_key
       FROM {schema}.deliveries d
       WHERE d.subscription = $1
         AND (d.tenant, d.id) > (w.tenant, w.after)
         AND d.tenant <= w.tenant
         AND d.state = 'available'
         AND d.priority = 0
         AND d.available_at <= statement_timestamp()
         AND EXISTS (SELECT 1 FROM routes r
                     WHERE (r.topic = d.topic OR r.topic = '*')
                       AND (r.schema_version = d.schema_version OR r.schema_version = 0))
         AND (d.ordering_key IS NULL OR NOT EXISTS (
               SELECT 1 FROM {schema}.deliveries e
               WHERE e.subscription = d.subscription AND e.tenant = d.tenant
                 AND e.ordering_key = d.ordering_key AND e.ordering_key IS NOT NULL
                 AND e.state <> 'dead'
                 AND (e.id < d.id OR e.state = 'running')))
       ORDER BY d.tenant, d.id
       LIMIT more.n
       FOR UPDATE OF d SKIP LOCKED) plain
    ) u
    LIMIT more.n
  ) c
),
chosen AS (
  SELECT id, tenant, ordering_key FROM picked
  UNION ALL
  SELECT id, tenant, ordering_key FROM topped
),
-- The snapshot's ordering check above can be stale (a claim that committed
-- after this statement began, an operator's retry of a dead head): each
-- picked delivery with a key must also take its key's row in ordering_locks.
-- A row held by an uncommitted claim makes this wait for that claim; a row
-- that exists means the key is running, and the delivery is not claimed (it
-- stays as it was; its row lock ends with this statement's transaction).
-- Rows are inserted in key order, so two claims never deadlock on them.
keyed AS (
  INSERT INTO {schema}.ordering_locks (subscription, tenant, ordering_key, delivery_id)
  SELECT $1, p.tenant, p.ordering_key, p.id
  FROM chosen p
  WHERE p.ordering_key IS NOT NULL
  ORDER BY p.tenant, p.ordering_key
  ON CONFLICT DO NOTHING
  RETURNING delivery_id
),
claimed AS (
  UPDATE {schema}.deliveries d
  SET state = 'running',
      attempts = d.attempts + 1,
      -- $12: the budget every route shares (NULL: they differ; look it up).
      max_attempts = coalesce($12::int,
                              (SELECT r.max_attempts FROM routes r
                               WHERE (r.topic = d.topic OR r.topic = '*')
                                 AND (r.schema_version = d.schema_version OR r.schema_version = 0)
                               ORDER BY r.topic = '*', r.schema_version = 0
                               LIMIT 1)),
      -- One fresh token per claim: with the delivery id it names this lease.
      lease_token = $11::uuid,
      lease_expires_at = statement_timestamp() + $9::bigint * interval '1 millisecond',
      claimed_by = $10
  WHERE d.id = ANY (ARRAY(SELECT id FROM chosen WHERE ordering_key IS NULL
                          UNION ALL
                          SELECT delivery_id FROM keyed))
  RETURNING d.id, d.message_id, d.tenant, d.topic, d.schema_version, d.ordering_key,
            d.priority, d.attempts, d.max_attempts, d.lease_token, d.lease_expires_at
),
-- Rate-limited tenants spend a token per delivery claimed. The bucket read
-- above is the snapshot's; this update waits for any claim updating the same
-- bucket and refills from its latest version, so concurrent claims may take
-- the bucket below zero (the next claims then wait for the refill) but the
-- long-run rate holds.
-- The buckets are locked in tenant order first, so two claims over
-- overlapping tenants never deadlock on them.
buckets AS (
  SELECT b.tenant
  FROM {schema}.tenant_rate_limits b
  WHERE b.subscription = $1 AND b.tenant IN (SELECT cl.tenant FROM claimed cl)
  ORDER BY b.tenant
  FOR UPDATE
),
metered AS (
  UPDATE {schema}.tenant_rate_limits b
  SET tokens = least(b.burst, b.tokens + b.per_second * greatest(0,
                 extract(epoch FROM statement_timestamp() - b.refilled_at))) - c.n,
      refilled_at = greatest(b.refilled_at, statement_timestamp())
  FROM (SELECT cl.tenant, count(*) AS n FROM claimed cl
        WHERE cl.tenant IN (SELECT k.tenant FROM buckets k)
        GROUP BY cl.tenant) c
  WHERE b.subscription = $1 AND b.tenant = c.tenant
),
-- Floor passes: what was enqueued since the previous claim (see below).
since AS (
  SELECT n.id, n.tenant, n.subscription = $1 AND n.state = 'available' AS ready
  FROM {schema}.deliveries n
  WHERE $15::bigint > 0 AND n.id > $15::bigint
  ORDER BY n.id
  LIMIT 4096
)
-- One row per claimed delivery; when nothing was claimed, one row of NULLs
-- that still carries the turn (so the cursor advances past tenants whose
-- work was not claimable this time).
-- With it, for the store's floors: on floor passes ($15 > 0), the tenants
-- with ready deliveries among the (at most 4,096) deliveries enqueued above
-- id $15, the highest the previous claim saw: new tenants, found by walking
-- the primary key over what was enqueued since rather than every tenant's
-- first entries; and the highest id walked (else $15). On full passes the
-- highest delivery id there is.
SELECT c.id, c.message_id, c.tenant, c.topic, c.schema_version, c.ordering_key,
       c.priority, c.payload, c.headers, c.attempts, c.max_attempts,
       c.lease_token, c.lease_expires_at, c.occurred_at, c.created_at,
       meta.last_tenant, meta.tenants_in_turn, meta.turn_tenants,
       meta.max_id, meta.discovered
FROM (SELECT max(tenant) AS last_tenant, count(*)::int AS tenants_in_turn,
             coalesce(array_agg(tenant), '{}') AS turn_tenants,
             CASE WHEN $15::bigint > 0
                  THEN greatest($15::bigint, (SELECT max(w.id) FROM since w))
                  ELSE (SELECT coalesce(max(x.id), 0) FROM {schema}.deliveries x)
             END AS max_id,
             coalesce((SELECT array_agg(DISTINCT w.tenant) FROM since w WHERE w.ready),
                      '{}') AS discovered
      FROM turn) meta
LEFT JOIN (
  SELECT cl.id, cl.message_id, cl.tenant, cl.topic, cl.schema_version, cl.ordering_key,
         cl.priority, m.payload::text AS payload, m.headers::text AS headers, cl.attempts, cl.max_attempts,
         cl.lease_token, cl.lease_expires_at, m.occurred_at, m.created_at
  FROM claimed cl
  CROSS JOIN LATERAL (
    SELECT m.payload, m.headers, m.occurred_at, m.created_at
    FROM {schema}.messages m
    WHERE m.id = cl.message_id
  ) m
) c ON true
