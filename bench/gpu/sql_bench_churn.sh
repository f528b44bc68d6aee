#!/bin/bash
# Readers under churn, on the GPU machine: 64 pgbench clients running
# prepared ORDER BY v <-> q LIMIT 10 on the benchmark set (tools/gen_synthetic,
# seed 42), first alone (the static rate), then while 4 clients insert and
# delete rows and autovacuum runs every few seconds. Prints both read rates
# and their ratio, the writers' rate, the scan rounds served by the CPU
# engine in each phase (a mirror being reloaded sends scans there), the
# VACUUMs that ran, and the mirror's entries before and after.
#
# Runs after bash .device/pg-up.sh and an install of the extension linked
# with the kernels. usage: bench/gpu/sql_bench_churn.sh M [N]
# (SECS: the length of each phase, default 30; PROBES: default 32)
set -euo pipefail
M=${1:-32}
N=${2:-1000000}
SECS=${SECS:-30}
PROBES=${PROBES:-32}
LISTS=${LISTS:-4096}
DATA=${DATA:-/tmp/gpu_ivfpq-synthetic-$N}
RES=${OUT:-/tmp}/sql-bench-churn-m$M.txt
. "${PGENV:-/opt/pg/env.sh}"
say() { echo "$*" | tee -a "$RES"; }
: >"$RES"

# Autovacuum often enough to run several times in a phase.
. bench/gpu/lib.sh
bench_setup "max_connections = 200
autovacuum_naptime = 2s
autovacuum_vacuum_scale_factor = 0
autovacuum_vacuum_threshold = 2000
autovacuum_vacuum_insert_scale_factor = 0
autovacuum_vacuum_insert_threshold = 2000
autovacuum_vacuum_cost_limit = 10000" ""
say "# gpu_ivfpq readers under churn: $N x 128 synthetic (tools/gen_synthetic, seed 42), lists $LISTS, m $M, probes $PROBES"
say "# device: $(psql -qAtc 'SELECT device FROM gpu_ivfpq_status'); $(nproc) CPU cores; $SECS s per phase"
say "# $(date -u +%F' '%T) UTC"

psql -qc "CREATE INDEX base_id ON base (id)"
psql -qc "CREATE INDEX base_idx ON base USING gpu_ivfpq (v) WITH (lists = $LISTS, m = $M)"
psql -qc "DROP SEQUENCE IF EXISTS churn_id" -c "CREATE SEQUENCE churn_id START $((N + 1))"
psql -qAtc "SELECT 'prewarm: ' || gpu_ivfpq_prewarm('base_idx') || ' entries'" | tee -a "$RES"

work=$(mktemp -d)
chmod 755 "$work"
cat >"$work/knn.sql" <<'Q'
\set q random(1, 1000)
SELECT id FROM base ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10;
Q
# Writers: a new row (a copy of a random row's vector) and a deleted one.
cat >"$work/write.sql" <<Q
\set r random(1, $N)
INSERT INTO base SELECT nextval('churn_id'), v FROM base WHERE id = :r LIMIT 1;
DELETE FROM base WHERE id = :r;
Q
chmod 644 "$work"/*.sql

stat() { psql -qAtc "SELECT $1 FROM gpu_ivfpq_status"; }
vacuums() { psql -qAtc "SELECT autovacuum_count + vacuum_count FROM pg_stat_user_tables WHERE relname = 'base'"; }
entries() { psql -qAtc "SELECT coalesce(max(entries), 0) FROM gpu_ivfpq_mirrors WHERE index = 'base_idx'"; }
tps() { grep -oP 'tps = \K[0-9.]+(?= \(without)' "$1" | cut -d. -f1; }
readers() {
  PGOPTIONS="-c gpu_ivfpq.probes=$PROBES -c enable_seqscan=off" pgbench -n -M prepared -c 64 -j 16 \
    -T "$SECS" -f "$work/knn.sql" postgres >"$1" 2>&1
}

say ""
say "| phase | read QPS | vs static | write TPS | rounds on CPU | GPU fallbacks | VACUUMs | mirror entries after |"
say "|---|---|---|---|---|---|---|---|"
c0=$(stat queries_cpu); f0=$(stat gpu_fallbacks); v0=$(vacuums)
readers "$work/static.txt"
static=$(tps "$work/static.txt")
say "| static | $static | 1.00 | - | $(($(stat queries_cpu) - c0)) | $(($(stat gpu_fallbacks) - f0)) | $(($(vacuums) - v0)) | $(entries) |"

c0=$(stat queries_cpu); f0=$(stat gpu_fallbacks); v0=$(vacuums)
pgbench -n -M prepared -c 4 -j 4 -T "$SECS" -f "$work/write.sql" postgres >"$work/writers.txt" 2>&1 &
writers=$!
readers "$work/churn.txt"
wait "$writers"
churn=$(tps "$work/churn.txt")
ratio=$(awk -v a="$churn" -v b="$static" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
say "| 4 writers + autovacuum | $churn | $ratio | $(tps "$work/writers.txt") | $(($(stat queries_cpu) - c0)) | $(($(stat gpu_fallbacks) - f0)) | $(($(vacuums) - v0)) | $(entries) |"
grep -h "failed transactions" "$work"/*.txt | sed 's/^/# /' | tee -a "$RES"
psql -qAtxc "SELECT * FROM gpu_ivfpq_status" | sed 's/^/# /' | tee -a "$RES"
rm -rf "$work"
