#!/usr/bin/env bash
# What the hot-path schema changes of issue #13 would buy, measured on the
# statements themselves before any code changes (see BENCHMARKS.md, session 11).
#
#   scripts/experiments/hot-path.sh [courier binary] [seconds per run]
#
# Makes two schemas at the current Courier schema version with 100,000
# deliveries of one subscription and tenant: `hot_a` as migrated, `hot_b`
# with no index that names `state` (dead-ness is `dead_at IS NOT NULL`, no
# deliveries_running) and fillfactor 60, so a claim changes no indexed column
# and can be a HOT update. Then runs with pgbench -M prepared, alternating,
# each statement as `BEGIN; …; ROLLBACK` (the table stays as loaded):
#   claim_a / claim_b   queries/claim.sql, 256 rows, one tenant, no keys
#                       (claim_b adds `dead_at IS NULL` where the index needs it)
#   done_receipts       a delete of 256 with receipts (complete.sql without its
#                       lease fence and ordering-lock step)
#   done_plain          the same delete without receipts
# Prints each run's average latency and the tables' HOT update counts.
# Drops both schemas at the end. Needs psql, pgbench and python3.
set -euo pipefail
COURIER=${1:-target/release/courier}
SECONDS_PER_RUN=${2:-15}
U=${COURIER_BENCH_URL:-postgres://postgres@127.0.0.1:5432/test}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"; for s in hot_a hot_b; do psql -qc "DROP SCHEMA IF EXISTS $s CASCADE" "$U" 2>/dev/null || true; done' EXIT

for s in hot_a hot_b; do
  psql -qc "SET client_min_messages = warning; DROP SCHEMA IF EXISTS $s CASCADE" "$U"
  RUST_LOG=error "$COURIER" migrate --database-url "$U" --schema "$s" >/dev/null
  RUST_LOG=error "$COURIER" subscriptions create bench --topic bench.drain --database-url "$U" --schema "$s" >/dev/null
done
psql -q "$U" <<'SQL'
ALTER TABLE hot_b.deliveries SET (fillfactor = 60);
DROP INDEX hot_b.deliveries_ready, hot_b.deliveries_running, hot_b.deliveries_ordering,
           hot_b.deliveries_dead, hot_b.deliveries_dead_at;
CREATE INDEX deliveries_ready ON hot_b.deliveries (subscription, tenant, id) WHERE dead_at IS NULL;
CREATE INDEX deliveries_ordering ON hot_b.deliveries (subscription, tenant, ordering_key, id)
  WHERE ordering_key IS NOT NULL AND dead_at IS NULL;
CREATE INDEX deliveries_dead ON hot_b.deliveries (subscription, id) WHERE dead_at IS NOT NULL;
CREATE INDEX deliveries_dead_at ON hot_b.deliveries (dead_at, id) WHERE dead_at IS NOT NULL;
SQL
for s in hot_a hot_b; do
  psql -q "$U" -c "INSERT INTO $s.messages (tenant, topic, payload)
                   SELECT 'bench', 'bench.drain', jsonb_build_object('seq', g)
                   FROM generate_series(1, 100000) g" \
       -c "VACUUM ANALYZE $s.deliveries" -c "VACUUM ANALYZE $s.messages"
done

python3 - "$ROOT/crates/courier-postgres/queries/claim.sql" "$WORK" <<'PY'
import re, sys
src = open(sys.argv[1]).read()
params = {1: "'bench'::text", 2: "''::text", 3: "256", 4: "256",
          5: "'{bench.drain}'::text[]", 6: "'{1}'::int[]", 7: "'{25}'::int[]",
          8: "NULL::int", 9: "30000::bigint", 10: "'w1'::text", 11: "gen_random_uuid()",
          12: "25::int", 13: "'{}'::text[]", 14: "'{}'::bigint[]", 15: "0::bigint"}
def render(schema, hot):
    s = src.replace('{schema}', schema)
    s = re.sub(r'--[^\n]*', '', s)
    if hot:
        # Every ready-row probe needs the new partial index's predicate.
        assert s.count("d.state = 'available'") > 0, "claim.sql no longer probes d.state"
        s = s.replace("d.state = 'available'", "d.dead_at IS NULL AND d.state = 'available'")
    for n in sorted(params, reverse=True):
        s = re.sub(r'\$%d(?![0-9])' % n, params[n], s)
    return ' '.join(s.split())
for name, schema, hot in [('claim_a', 'hot_a', False), ('claim_b', 'hot_b', True)]:
    open(f'{sys.argv[2]}/{name}.sql', 'w').write('BEGIN;\n' + render(schema, hot) + ';\nROLLBACK;\n')
PY
cat > "$WORK/done_receipts.sql" <<'SQL'
BEGIN;
WITH done AS (DELETE FROM hot_a.deliveries d WHERE d.id = ANY (ARRAY(SELECT id FROM hot_a.deliveries ORDER BY id LIMIT 256)) RETURNING d.id, d.tenant, d.subscription, d.message_id), receipts AS (INSERT INTO hot_a.receipts (tenant, subscription, message_id) SELECT tenant, subscription, message_id FROM done ON CONFLICT DO NOTHING) SELECT count(*) FROM done;
ROLLBACK;
SQL
cat > "$WORK/done_plain.sql" <<'SQL'
BEGIN;
WITH done AS (DELETE FROM hot_a.deliveries d WHERE d.id = ANY (ARRAY(SELECT id FROM hot_a.deliveries ORDER BY id LIMIT 256)) RETURNING d.id, d.tenant, d.subscription, d.message_id) SELECT count(*) FROM done;
ROLLBACK;
SQL

for round in 1 2; do
  for script in claim_a claim_b done_receipts done_plain; do
    latency=$(PGOPTIONS='-c jit=off' pgbench -n -M prepared -T "$SECONDS_PER_RUN" -f "$WORK/$script.sql" "$U" 2>&1 \
              | sed -n 's/^latency average = //p')
    echo "round $round  $script  $latency"
  done
done
psql -Atc "SELECT schemaname || ': ' || n_tup_upd || ' updates, ' || n_tup_hot_upd || ' HOT'
           FROM pg_stat_user_tables WHERE relname = 'deliveries' AND schemaname IN ('hot_a', 'hot_b')
           ORDER BY 1" "$U"
