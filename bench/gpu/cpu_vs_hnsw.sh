#!/bin/bash
# The CPU engine against pgvector's HNSW on the GPU machine's host (16
# cores), on the set of the SQL benchmarks: tools/gen_synthetic's (seed 42),
# N x 128 rows (default 1M), the gpu_ivfpq index with lists LISTS (4096),
# m 32 and vector copies (built on the GPU: the index is the same whatever
# builds it), pgvector's HNSW (m 16, ef_construction 64) on a copy of the
# rows as vector(128). For each setting: recall@10 over the 1000 queries
# against their exact top 10, then q/s with 1 and 64 clients and the median
# latency at 1 client, the gpu_ivfpq scans with gpu_ivfpq.device = cpu:
#   SELECT id FROM <table> ORDER BY v <-> (SELECT v FROM <queries> WHERE qid = :q) LIMIT 10
#
# Runs after bash .device/pg-up.sh, an install of the extension linked with
# the kernels and of pgvector. usage: bench/gpu/cpu_vs_hnsw.sh
# (N, LISTS, SECS (pgbench seconds per row, default 8), PROBES ("16 32 48"),
# EF ("40 80 160"))
set -euo pipefail
N=${N:-1000000}
LISTS=${LISTS:-4096}
SECS=${SECS:-8}
PROBES=${PROBES:-"16 32 48"}
EF=${EF:-"40 80 160"}
DATA=${DATA:-/tmp/gpu_ivfpq-synthetic-$N}
RES=${OUT:-/tmp}/cpu-vs-hnsw.txt
. "${PGENV:-/opt/pg/env.sh}"
say() { echo "$*" | tee -a "$RES"; }
: >"$RES"

. bench/gpu/lib.sh
bench_setup "" "hbase, hqueries"
psql -qc "CREATE EXTENSION IF NOT EXISTS vector"
say "# the CPU engine (gpu_ivfpq.device = cpu) beside pgvector HNSW: $N x 128 synthetic (tools/gen_synthetic, seed 42)"
say "# host: $(nproc) CPU cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); pgvector $(psql -qAtc "SELECT extversion FROM pg_extension WHERE extname = 'vector'"); $SECS s per row"
say "# $(date -u +%F' '%T) UTC"

psql -qc "CREATE TABLE hbase AS SELECT id, v::vector(128) AS v FROM base" -c "CREATE TABLE hqueries AS SELECT qid, v::vector(128) AS v, gt FROM queries" \
  -c "ALTER TABLE hqueries ADD PRIMARY KEY (qid)" -c "VACUUM ANALYZE hbase"
t0=$(date +%s.%N)
psql -qc "SET gpu_ivfpq.device = gpu" -c "CREATE INDEX base_idx ON base USING gpu_ivfpq (v) WITH (lists = $LISTS, m = 32)"
say "gpu_ivfpq CREATE INDEX (lists $LISTS, m 32, on the GPU): $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }") s, $(psql -qAtc "SELECT pg_size_pretty(pg_relation_size('base_idx'))")"
t0=$(date +%s.%N)
psql -qc "CREATE INDEX hbase_idx ON hbase USING hnsw (v vector_l2_ops) WITH (m = 16, ef_construction = 64)"
say "HNSW CREATE INDEX (m 16, ef_construction 64, $(psql -qAtc 'SHOW max_parallel_maintenance_workers') parallel workers): $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }") s, $(psql -qAtc "SELECT pg_size_pretty(pg_relation_size('hbase_idx'))")"
work=$(mktemp -d)
chmod 755 "$work"
for t in base hbase; do
  q=$([ $t = base ] && echo queries || echo hqueries)
  printf '\\set q random(1, 1000)\nSELECT id FROM %s ORDER BY v <-> (SELECT v FROM %s WHERE qid = :q) LIMIT 10;\n' "$t" "$q" >"$work/$t.sql"
done
chmod 644 "$work"/*.sql

recall() {  # TABLE QUERIES OPTS
  PGOPTIONS="$3 -c enable_seqscan=off" psql -qAt <<SQL
SELECT round(avg(hit) / 10, 4) FROM $2 q, LATERAL (
  SELECT count(*) AS hit FROM (SELECT id FROM $1 ORDER BY v <-> q.v LIMIT 10) r
  WHERE r.id = ANY (q.gt[1:10])) h;
SQL
}
row() {  # NAME TABLE QUERIES OPTS
  local r a b
  r=$(recall "$2" "$3" "$4")
  read -r a a50 _ < <(pg_rate 1 "$work/$2.sql" "$SECS" "$4")
  read -r b _ _ < <(pg_rate 64 "$work/$2.sql" "$SECS" "$4")
  say "| $1 | $r | $a | $b | $a50 |"
}
say ""
say "| setting | recall@10 | q/s, 1 client | q/s, 64 clients | p50 ms, 1 client |"
say "|---|---|---|---|---|"
for p in $PROBES; do
  row "gpu_ivfpq CPU, probes $p, rerank 100" base queries "-c gpu_ivfpq.device=cpu -c gpu_ivfpq.probes=$p -c gpu_ivfpq.rerank=100"
done
for e in $EF; do
  row "HNSW ef_search $e" hbase hqueries "-c hnsw.ef_search=$e"
done
rm -rf "$work"
