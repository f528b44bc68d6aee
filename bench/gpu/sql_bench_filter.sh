#!/bin/bash
# Filtered k-NN on the GPU machine: the benchmark set (tools/gen_synthetic,
# seed 42) with a tenant column (a hash of id into 100 values, independent of
# the vectors), indexed as (v, tenant) with lists = 4096, m = $1. For 1% of
# the rows (tenant = t), 10% (tenant BETWEEN t0 AND t0 + 9) and no filter:
# recall@10 against the exact filtered answer of 100 queries, and the
# single-connection p50/p99 latency, with the filter pushed down to the GPU
# (and to the CPU engine), and for comparison the same filter written so it
# cannot be pushed down (tenant + 0 = t: the executor filters the scan's
# rows; path auto: its wider rounds leave the GPU). Then 64 clients.
#
# Runs after bash .device/pg-up.sh and an install of the extension linked
# with the kernels. usage: bench/gpu/sql_bench_filter.sh M [N]
# (SECS: pgbench seconds per row, default 5)
set -euo pipefail
M=${1:-32}
N=${2:-1000000}
SECS=${SECS:-5}
LISTS=${LISTS:-4096}
NQ=${NQ:-100}
DATA=${DATA:-/tmp/gpu_ivfpq-synthetic-$N}
RES=${OUT:-/tmp}/sql-bench-filter-m$M.txt
. "${PGENV:-/opt/pg/env.sh}"
say() { echo "$*" | tee -a "$RES"; }
: >"$RES"

. bench/gpu/lib.sh
bench_setup "max_connections = 200
max_parallel_workers_per_gather = 8" "fbase, fgt"
say "# gpu_ivfpq filtered k-NN: $N x 128 synthetic (tools/gen_synthetic, seed 42), lists $LISTS, m $M"
say "# device: $(psql -qAtc 'SELECT device FROM gpu_ivfpq_status'); $(nproc) CPU cores"
say "# $(date -u +%F' '%T) UTC"

# tenant: a multiplicative hash of id, 100 values of 1% each.
psql -q <<'SQL'
CREATE TABLE fbase AS
SELECT id, (((id::bigint * 2654435761) % 4294967296) / 65536 % 100)::int AS tenant, v FROM base;
VACUUM ANALYZE fbase;
SQL
t0=$(date +%s.%N)
psql -qc "CREATE INDEX fbase_idx ON fbase USING gpu_ivfpq (v, tenant) WITH (lists = $LISTS, m = $M)"
say "CREATE INDEX (v, tenant) on the GPU: $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }") s"
psql -qAtc "SELECT 'prewarm: ' || gpu_ivfpq_prewarm('fbase_idx') || ' entries'" | tee -a "$RES"

# Exact answers by parallel sequential scans: query q's 1% filter is tenant
# q % 100, its 10% filter tenants (q % 10) * 10 .. + 9.
t0=$(date +%s.%N)
psql -q <<SQL
SET enable_indexscan = off;
CREATE TABLE fgt AS
SELECT qid, v,
       ARRAY(SELECT id FROM fbase b WHERE b.tenant = q.qid % 100 ORDER BY b.v <-> q.v LIMIT 10) AS gt1,
       ARRAY(SELECT id FROM fbase b WHERE b.tenant BETWEEN (q.qid % 10) * 10 AND (q.qid % 10) * 10 + 9
             ORDER BY b.v <-> q.v LIMIT 10) AS gt10,
       gt[1:10] AS gt100
FROM queries q WHERE qid <= $NQ;
SQL
say "# exact filtered answers of $NQ queries: $(awk "BEGIN { printf \"%.0f\", $(date +%s.%N) - $t0 }") s"

# The filtered query of each kind, for query :q.
where() {
  case $1 in
  1) echo "tenant = :q % 100" ;;
  10) echo "tenant BETWEEN (:q % 10) * 10 AND (:q % 10) * 10 + 9" ;;
  1x) echo "tenant + 0 = :q % 100" ;;
  10x) echo "tenant + 0 BETWEEN (:q % 10) * 10 AND (:q % 10) * 10 + 9" ;;
  100) echo "true" ;;
  esac
}
gtcol() { case $1 in 1 | 1x) echo gt1 ;; 10 | 10x) echo gt10 ;; *) echo gt100 ;; esac; }

recall() {
  local kind=$1 device=$2 probes=$3 w
  w=$(where "$kind" | sed 's/:q/g.qid/g')
  PGOPTIONS="-c gpu_ivfpq.device=$device -c gpu_ivfpq.probes=$probes -c enable_seqscan=off" psql -qAt <<SQL
SELECT round(avg(hit) / 10, 4) FROM fgt g, LATERAL (
  SELECT count(*) AS hit FROM (SELECT id FROM fbase WHERE $w ORDER BY v <-> g.v LIMIT 10) r
  WHERE r.id = ANY (g.$(gtcol "$kind"))) h;
SQL
}

# pgbench CLIENTS SCRIPT OPTS: "tps p50_ms p99_ms" (lib.sh's pg_rate).
bench() { pg_rate "$1" "$2" "$SECS" "$3"; }
script() {
  local f=/tmp/filter-$1.sql
  printf '\\set q random(1, %d)\nSELECT id FROM fbase WHERE %s ORDER BY v <-> (SELECT v FROM fgt WHERE qid = :q) LIMIT 10;\n' \
    "$NQ" "$(where "$1")" >"$f"
  echo "$f"
}

row() {
  local kind=$1 device=$2 probes=$3 label=$4 r tps p50 p99
  r=$(recall "$kind" "$device" "$probes")
  read -r tps p50 p99 < <(bench 1 "$(script "$kind")" "-c gpu_ivfpq.device=$device -c gpu_ivfpq.probes=$probes -c enable_seqscan=off")
  say "| $label | $probes | $device | $r | $p50 | $p99 | $tps |"
}

say ""
say "## single connection, prepared, LIMIT 10, rerank 100"
say "| filter | probes | path | recall@10 | p50 ms | p99 ms | QPS |"
say "|---|---|---|---|---|---|---|"
for probes in 16 32 64; do
  row 100 gpu "$probes" "none"
  row 10 gpu "$probes" "10%, pushed down"
  row 1 gpu "$probes" "1%, pushed down"
done
# Continued rounds past the GPU's 2048 candidates run on the CPU: auto.
row 10x auto 32 "10%, not pushed down"
row 1x auto 32 "1%, not pushed down"
row 10 cpu 32 "10%, pushed down"
row 1 cpu 32 "1%, pushed down"
row 1x cpu 32 "1%, not pushed down"

say ""
say "## 64 clients, probes 32"
say "| filter | QPS | p50 ms | p99 ms |"
say "|---|---|---|---|"
for kind in 100 10 1; do
  read -r tps p50 p99 < <(bench 64 "$(script "$kind")" "-c gpu_ivfpq.device=gpu -c gpu_ivfpq.probes=32 -c enable_seqscan=off")
  say "| $kind% | $tps | $p50 | $p99 |"
done
psql -qAtxc "SELECT * FROM gpu_ivfpq_status" | sed 's/^/# /' | tee -a "$RES"
