#!/bin/bash
# Several GPUs against one, on the GPU machine (a host with two GPUs or
# more): tools/gen_synthetic's 1M x 128 set (seed 42), lists 4096, m 32.
#
#  1. Kernel level (multi_gpu_bench, the GPU process's device layer over
#     the CUDA devices): batch k-NN of 10,000 queries, the k-NN graph of the
#     base rows and exact k-NN, on 1 GPU, on replicas and on shards, with
#     the shards' answers compared to one GPU's.
#  2. SQL: pgbench throughput with 64 and 128 clients (probes 32) with the
#     service on GPU 0 only (gpu_ivfpq.devices = '0') and on every GPU
#     (replicas), with each GPU's share of the queries.
#  3. An index larger than one GPU's budget (gpu_ivfpq.gpu_memory_budget set
#     below the mirror's size): served sharded, its answers compared with
#     the one-GPU answers of step 2 for 1,000 queries.
#
# Runs after bash .device/pg-up.sh and an install of the extension linked
# with the kernels; BIN names the folder holding multi_gpu_bench (skipped
# when absent). Output: $OUT/multi-gpu.txt and $OUT/multi_gpu_bench.log.
# usage: bench/gpu/multi_gpu.sh    (SECS: pgbench seconds; N: rows)
set -euo pipefail
N=${N:-1000000}
SECS=${SECS:-6}
M=32
LISTS=4096
DATA=${DATA:-/tmp/gpu_ivfpq-synthetic-$N}
OUTDIR=${OUT:-/tmp}
RES=$OUTDIR/multi-gpu.txt
BIN=${BIN:-}
. "${PGENV:-/opt/pg/env.sh}"
say() { echo "$*" | tee -a "$RES"; }
: >"$RES"
. bench/gpu/lib.sh

gpus=$(nvidia-smi -L | wc -l)
say "# gpu_ivfpq on several GPUs: $N x 128 synthetic (seed 42), lists $LISTS, m $M; $gpus GPU(s), $(nproc) CPU cores"
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader | sed 's/^/#   /' | tee -a "$RES"
say "# $(date -u +%F' '%T) UTC"

if [ -n "$BIN" ] && [ -x "$BIN/multi_gpu_bench" ]; then
  make_data "$DATA" "$N"
  say ""
  say "## 1. Kernel level (multi_gpu_bench)"
  timeout 400 "$BIN/multi_gpu_bench" --base "$DATA/base.fvecs" --queries "$DATA/queries.fvecs" \
    --lists $LISTS --m $M 2>&1 | tee "$OUTDIR/multi_gpu_bench.log" | tee -a "$RES"
fi

bench_setup "max_connections = 300" ""
psql -qc "CREATE INDEX base_idx ON base USING gpu_ivfpq (v) WITH (lists = $LISTS, m = $M)"
cat >/tmp/knn.sql <<'Q'
\set q random(1, 1000)
SELECT id FROM base ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10;
Q

stat() { psql -qAtc "SELECT $1 FROM gpu_ivfpq_status"; }
serving() {
  for _ in $(seq 100); do
    [ "$(stat "state = 'running (GPU)'")" = t ] && return 0
    sleep 0.2
  done
  echo "the service does not serve: $(stat 'state, last_error')" >&2
  return 1
}
# use_gpus LIST [BUDGET]: the service on those GPUs (a new GPU process), the mirror loaded.
use_gpus() {
  psql -qc "ALTER SYSTEM SET gpu_ivfpq.devices = '$1'"
  psql -qc "ALTER SYSTEM SET gpu_ivfpq.gpu_memory_budget = '${2:-0}'"
  psql -qc "SELECT pg_reload_conf()"
  sleep 1
  serving
  psql -qAtc "SELECT gpu_ivfpq_prewarm('base_idx')" >/dev/null
}
# answers FILE: the first ten ids of each of the 1,000 queries.
answers() {
  PGOPTIONS="-c gpu_ivfpq.device=gpu -c gpu_ivfpq.probes=32 -c enable_seqscan=off" psql -qAt >"$1" <<'SQL'
SELECT q.qid, (SELECT array_agg(id) FROM (SELECT id FROM base ORDER BY v <-> q.v LIMIT 10) r)
FROM queries q ORDER BY q.qid;
SQL
}
# bench CLIENTS: k-NN q/s at probes 32 on the GPU (lib.sh's pg_rate).
bench() {
  local tps
  read -r tps _ < <(pg_rate "$1" /tmp/knn.sql "$SECS" "-c gpu_ivfpq.device=gpu -c gpu_ivfpq.probes=32 -c enable_seqscan=off") || return 1
  printf '%s' "$tps"
}
devices_now() {
  psql -qAtc "SELECT string_agg(device || ': ' || queries || ' queries, ' || batches || ' batches, busy ' ||
                round(busy_ms::numeric) || ' ms', '; ' ORDER BY device) FROM gpu_ivfpq_devices"
}

say ""
say "## 2. SQL throughput, probes 32 (pgbench, $SECS s each)"
say "| GPUs | placement | batches in flight | clients | queries/s | mean batch | mean call us | per GPU |"
say "|---|---|---|---|---|---|---|---|"
all=$(seq -s, 0 $((gpus - 1)))
for list in 0 "$all"; do
  use_gpus "$list"
  placement=$(psql -qAtc "SELECT placement || ' on ' || devices::text FROM gpu_ivfpq_mirrors")
  [ "$list" = 0 ] && answers /tmp/answers-one.txt
  # gpu_ivfpq.batches_in_flight: 0 is one per GPU.
  for keep in $([ "$list" = 0 ] && echo 0 || echo 1 2 3); do
    psql -qc "ALTER SYSTEM SET gpu_ivfpq.batches_in_flight = $keep" -c "SELECT pg_reload_conf()" >/dev/null
    sleep 0.5
    for c in 64 128; do
      q0=$(stat queries_gpu); b0=$(stat batches)
      c0=$(psql -qAtc "SELECT coalesce(mean_call_us * search_rounds, 0) FROM gpu_ivfpq_status")
      qps=$(bench "$c")
      q1=$(stat queries_gpu); b1=$(stat batches)
      c1=$(psql -qAtc "SELECT coalesce(mean_call_us * search_rounds, 0) FROM gpu_ivfpq_status")
      say "| $list | $placement | $([ "$keep" = 0 ] && echo "1 (one per GPU)" || echo "$keep") | $c | $qps | $(awk -v q=$((q1 - q0)) -v b=$((b1 - b0)) 'BEGIN { printf "%.1f", b ? q / b : 0 }') | $(awk -v a="$c0" -v z="$c1" -v b=$((b1 - b0)) 'BEGIN { printf "%.0f", b ? (z - a) / b : 0 }') | $(devices_now) |"
    done
  done
  psql -qc "ALTER SYSTEM RESET gpu_ivfpq.batches_in_flight" -c "SELECT pg_reload_conf()" >/dev/null
done
say ""
say "What limits: the service's round (collecting, answering) and the channel, see gpu_ivfpq_status:"
psql -qAtc "SELECT 'mean_round_us ' || round(mean_round_us::numeric, 1) || ', mean_call_us ' || round(mean_call_us::numeric, 1) ||
            ', mean_device_us ' || round(mean_device_us::numeric, 1) || ', mean batch ' || round(mean_batch::numeric, 1)
            FROM gpu_ivfpq_status" | tee -a "$RES"

say ""
say "## 3. An index larger than one GPU's budget: sharded"
# One copy's size (a replicated mirror's size_mb counts every copy).
size=$(psql -qAtc "SELECT ceil(size_mb / array_length(devices, 1))::int FROM gpu_ivfpq_mirrors")
budget=$((size * 7 / 10))
say "mirror on one GPU: $size MiB; budget per GPU set to $budget MiB"
use_gpus "$all" "${budget}MB"
say "placement: $(psql -qAtc "SELECT placement || ' on ' || devices::text || ', ' || round(size_mb::numeric) || ' MiB in all, vectors ' || vectors FROM gpu_ivfpq_mirrors")"
say "per GPU: $(psql -qAtc "SELECT string_agg(device || ': ' || round(memory_used_mb::numeric) || ' of ' || round(memory_budget_mb::numeric) || ' MiB', '; ' ORDER BY device) FROM gpu_ivfpq_devices")"
answers /tmp/answers-shard.txt
same=$(paste -d'|' /tmp/answers-one.txt /tmp/answers-shard.txt | awk -F'|' '$2 == $4' | wc -l)
say "answers equal to one GPU's: $same of $(wc -l </tmp/answers-one.txt) queries (ids in order)"
for c in 64; do
  say "sharded, $c clients: $(bench "$c") queries/s"
done
psql -qc "ALTER SYSTEM RESET gpu_ivfpq.devices" -c "ALTER SYSTEM RESET gpu_ivfpq.gpu_memory_budget" -c "SELECT pg_reload_conf()" >/dev/null
