#!/bin/bash
# SQL benchmark of gpu_ivfpq on the GPU machine: tools/gen_synthetic's
# 1M x 128 set (seed 42, as bench/cpu), lists = 4096, m = $1; CREATE INDEX on the GPU and
# the CPU; single-connection prepared ORDER BY <-> LIMIT 10 latency (p50,
# p99) and recall@10 for several probes on each path; pgbench throughput with
# 1..64 clients and the mean GPU batch; SELECT 1 as PostgreSQL's own ceiling;
# a gpu_ivfpq.batch_wait sweep.
#
# Runs after bash .device/pg-up.sh and an install of the extension linked
# with the kernels. usage: bench/gpu/sql_bench.sh M [N]   (CPU_BUILD=0 skips
# the CPU CREATE INDEX; SECS sets the pgbench duration)
set -euo pipefail
M=${1:-16}
N=${2:-1000000}
SECS=${SECS:-8}
CPU_BUILD=${CPU_BUILD:-1}
DATA=${DATA:-/tmp/gpu_ivfpq-synthetic-$N}
RES=${OUT:-/tmp}/sql-bench-m$M.txt
LISTS=${LISTS:-4096}
. "${PGENV:-/opt/pg/env.sh}"
say() { echo "$*" | tee -a "$RES"; }
: >"$RES"

# Server: preloaded, large buffers; the data as tables base and queries.
. bench/gpu/lib.sh
bench_setup "max_connections = 200" ""
say "# gpu_ivfpq SQL benchmark: $N x 128 synthetic (tools/gen_synthetic, seed 42), lists $LISTS, m $M"
say "# device: $(psql -qAtc 'SELECT device FROM gpu_ivfpq_status'); $(nproc) CPU cores"
say "# $(date -u +%F' '%T) UTC"

build() {
  local device=$1 name=$2 t0 t1
  t0=$(date +%s.%N)
  PGOPTIONS="-c gpu_ivfpq.device=$device -c client_min_messages=debug1" \
    psql -qc "CREATE INDEX $name ON base USING gpu_ivfpq (v) WITH (lists = $LISTS, m = $M)" 2>&1 |
    grep -E 'gpu_ivfpq build' | sed 's/^/#   /' | tee -a "$RES"
  t1=$(date +%s.%N)
  say "CREATE INDEX on $device: $(awk "BEGIN { printf \"%.1f\", $t1 - $t0 }") s"
}
if [ "$CPU_BUILD" = 1 ]; then
  build cpu base_cpu_idx
  psql -qc "DROP INDEX base_cpu_idx"
fi
build gpu base_idx
say "index size: $(psql -qAtc "SELECT pg_size_pretty(pg_relation_size('base_idx'))") (table: $(psql -qAtc "SELECT pg_size_pretty(pg_relation_size('base'))"))"
t0=$(date +%s.%N)
psql -qAtc "SELECT 'prewarm: ' || gpu_ivfpq_prewarm('base_idx') || ' entries'" | tee -a "$RES"
say "mirror load (pages -> GPU, gpu_ivfpq_prewarm): $(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $t0 }") s"
psql -qAtc "SELECT 'mirror: ' || round(size_mb::numeric, 1) || ' MiB, vectors ' || vectors FROM gpu_ivfpq_mirrors" | tee -a "$RES"

cat >/tmp/knn.sql <<'Q'
\set q random(1, 1000)
SELECT id FROM base ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10;
Q
echo 'SELECT 1;' >/tmp/one.sql

# pgbench CLIENTS SCRIPT OPTS [SECS]: "tps p50_ms p99_ms" (lib.sh's pg_rate).
bench() { pg_rate "$1" "$2" "${4:-$SECS}" "$3"; }

say ""
say "## single connection, prepared ORDER BY v <-> q LIMIT 10 (rerank 100)"
say "| probes | path | recall@10 | p50 ms | p99 ms | QPS |"
say "|---|---|---|---|---|---|"
for probes in 8 16 32 64; do
  for device in gpu cpu; do
    r=$(recall_at_10 "$device" "$probes")
    read -r tps p50 p99 < <(bench 1 /tmp/knn.sql "-c gpu_ivfpq.device=$device -c gpu_ivfpq.probes=$probes -c enable_seqscan=off")
    say "| $probes | $device | $r | $p50 | $p99 | $tps |"
  done
done

stat() { psql -qAtc "SELECT $1 FROM gpu_ivfpq_status"; }
mean_batch() { awk -v q="$(($2 - $1))" -v b="$(($4 - $3))" 'BEGIN { printf "%.1f", (b > 0 ? q / b : 0) }'; }
say ""
say "## pgbench, probes 32: queries/second (mean GPU batch); SELECT 1 is PostgreSQL's ceiling"
say "| clients | GPU QPS | mean batch | CPU QPS | SELECT 1 QPS |"
say "|---|---|---|---|---|"
for c in 1 8 32 64; do
  q0=$(stat queries_gpu); b0=$(stat batches)
  read -r g _ _ < <(bench "$c" /tmp/knn.sql "-c gpu_ivfpq.device=gpu -c gpu_ivfpq.probes=32 -c enable_seqscan=off")
  q1=$(stat queries_gpu); b1=$(stat batches)
  read -r cpu _ _ < <(bench "$c" /tmp/knn.sql "-c gpu_ivfpq.device=cpu -c gpu_ivfpq.probes=32 -c enable_seqscan=off")
  read -r one _ _ < <(bench "$c" /tmp/one.sql "" 4)
  say "| $c | $g | $(mean_batch "$q0" "$q1" "$b0" "$b1") | $cpu | $one |"
done

say ""
say "## 64 clients, probes 32, by gpu_ivfpq.rerank (the candidates re-ranked on the GPU)"
say "| rerank | recall@10 | QPS | mean batch |"
say "|---|---|---|---|"
for rr in 100 40 20 10; do
  r=$(recall_at_10 gpu 32 "-c gpu_ivfpq.rerank=$rr")
  q0=$(stat queries_gpu); b0=$(stat batches)
  read -r g _ _ < <(bench 64 /tmp/knn.sql "-c gpu_ivfpq.device=gpu -c gpu_ivfpq.probes=32 -c gpu_ivfpq.rerank=$rr -c enable_seqscan=off")
  q1=$(stat queries_gpu); b1=$(stat batches)
  say "| $rr | $r | $g | $(mean_batch "$q0" "$q1" "$b0" "$b1") |"
done

say ""
say "## gpu_ivfpq.batch_wait (probes 32): 64-client throughput vs 1-client latency"
say "| batch_wait us | 64 clients QPS | mean batch | 1 client p50 ms | p99 ms |"
say "|---|---|---|---|---|"
for w in 0 50 200 1000; do
  set_reload gpu_ivfpq.batch_wait "$w"
  q0=$(stat queries_gpu); b0=$(stat batches)
  read -r g _ _ < <(bench 64 /tmp/knn.sql "-c gpu_ivfpq.device=gpu -c gpu_ivfpq.probes=32 -c enable_seqscan=off" 5)
  q1=$(stat queries_gpu); b1=$(stat batches)
  read -r _ p50 p99 < <(bench 1 /tmp/knn.sql "-c gpu_ivfpq.device=gpu -c gpu_ivfpq.probes=32 -c enable_seqscan=off" 5)
  say "| $w | $g | $(mean_batch "$q0" "$q1" "$b0" "$b1") | $p50 | $p99 |"
done
set_reload gpu_ivfpq.batch_wait
psql -qAtxc "SELECT * FROM gpu_ivfpq_status" | sed 's/^/# /' | tee -a "$RES"
