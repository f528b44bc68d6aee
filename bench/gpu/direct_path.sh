#!/bin/bash
# The direct path against PostgreSQL's own ceiling, on the GPU machine:
# tools/gen_synthetic's set (seed 42), lists 4096, m $1, probes 32, rerank
# 100. Prints recall@10, then for 1, 64 and 128 clients the k-NN statement
#   SELECT id FROM base ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10
# beside the same statement shape with the search replaced by a 10-row key
# range (PostgreSQL's ceiling for it on this host)
#   SELECT id FROM base WHERE id BETWEEN :r AND :r + 9 AND (SELECT v FROM queries WHERE qid = :q) IS NOT NULL
# and SELECT 1, with their ratio; where each search's time goes (the status
# view's stages: queue wait, waiting for the change log, the GPU's work and
# the delivery per batch, the mean batch) and the host's CPU use; then 1 and
# 64 clients with gpu_ivfpq.gpu_poll 0 and 200, twice; then 64 readers
# beside 4 writers (insert + delete) and autovacuum, against the static
# rate, with the scan rounds the CPU engine served.
#
# Runs after bash .device/pg-up.sh and an install of the extension linked
# with the kernels. usage: bench/gpu/direct_path.sh [M] [N]
# (SECS: pgbench seconds per row, default 10; CHURN_SECS default 20;
# PROBES default 32, or auto: the fewest of 32, 48, 64, 96, ... reaching
# recall@10 0.95; LISTS default 4096; POLL_AB=0 skips the gpu_poll rows;
# STORAGE: the vector column's storage, e.g. main, set before the load;
# BATCH_SIZES="256 16 24": 64 and 128 clients at each gpu_ivfpq.batch_size;
# WAIT_AB=1: 1, 64 and 128 clients with the GPU process's serving threads
# spinning, then sleeping, while the GPU works (GPU_IVFPQ_HOST_WAIT), twice
# (WAIT_MODES: the modes in turn, default "spin block spin block");
# FRONTIER="P:R ...": after the main table, recall@10 and the 1- and
# 64-client rates at each probes P and gpu_ivfpq.rerank R, beside the
# ceiling's 64-client rate of the main table)
set -euo pipefail
M=${1:-32}
N=${2:-1000000}
SECS=${SECS:-10}
CHURN_SECS=${CHURN_SECS:-20}
PROBES=${PROBES:-32}
LISTS=${LISTS:-4096}
DATA=${DATA:-/tmp/gpu_ivfpq-synthetic-$N}
RES=${OUT:-/tmp}/direct-path-m$M.txt
. "${PGENV:-/opt/pg/env.sh}"
say() { echo "$*" | tee -a "$RES"; }
: >"$RES"

. bench/gpu/lib.sh
bench_setup "max_connections = 300
autovacuum_naptime = 2s
autovacuum_vacuum_scale_factor = 0
autovacuum_vacuum_threshold = 2000
autovacuum_vacuum_insert_scale_factor = 0
autovacuum_vacuum_insert_threshold = 2000
autovacuum_vacuum_cost_limit = 10000" ""
say "# gpu_ivfpq direct path: $N x ${DIM:-128} synthetic (tools/gen_synthetic, seed 42), lists $LISTS, m $M, probes $PROBES, rerank 100${STORAGE:+, column storage $STORAGE}"
say "# device: $(psql -qAtc 'SELECT device FROM gpu_ivfpq_status'); $(nproc) CPU cores; $SECS s per row"
say "# $(date -u +%F' '%T) UTC"

psql -qc "CREATE INDEX base_id ON base (id)"
t0=$(date +%s.%N)
psql -qc "CREATE INDEX base_idx ON base USING gpu_ivfpq (v) WITH (lists = $LISTS, m = $M)"
say "CREATE INDEX (GPU): $(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }") s"
psql -qc "DROP SEQUENCE IF EXISTS churn_id" -c "CREATE SEQUENCE churn_id START $((N + 1))"
psql -qAtc "SELECT 'prewarm: ' || gpu_ivfpq_prewarm('base_idx') || ' entries'" | tee -a "$RES"

work=$(mktemp -d)
chmod 755 "$work"
cat >"$work/knn.sql" <<'Q'
\set q random(1, 1000)
SELECT id FROM base ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10;
Q
cat >"$work/range.sql" <<Q
\set q random(1, 1000)
\set r random(1, $((N - 10)))
SELECT id FROM base WHERE id BETWEEN :r AND :r + 9 AND (SELECT v FROM queries WHERE qid = :q) IS NOT NULL;
Q
echo 'SELECT 1;' >"$work/one.sql"
cat >"$work/write.sql" <<Q
\set r random(1, $N)
INSERT INTO base SELECT nextval('churn_id'), v FROM base WHERE id = :r LIMIT 1;
DELETE FROM base WHERE id = :r;
Q
chmod 644 "$work"/*.sql
OPTS="-c gpu_ivfpq.probes=$PROBES -c enable_seqscan=off"

# PROBES=auto: the fewest probes of a doubling-and-halving sweep whose recall@10 reaches 0.95.
if [ "$PROBES" = auto ]; then
  for p in 32 48 64 96 128 192 256 384 512; do
    r=$(recall_at_10 gpu "$p")
    say "recall@10 (probes $p, GPU): $r"
    PROBES=$p
    awk -v r="$r" 'BEGIN { exit !(r >= 0.95) }' && break
  done
  OPTS="-c gpu_ivfpq.probes=$PROBES -c enable_seqscan=off"
  say "probes $PROBES from here on"
else
  r=$(recall_at_10 gpu "$PROBES")
  say "recall@10 (probes $PROBES, GPU): $r"
fi

# pgbench CLIENTS SCRIPT [SECS]: "tps p50_ms p99_ms" (lib.sh's pg_rate with this run's settings).
bench() { pg_rate "$1" "$2" "${3:-$SECS}" "$OPTS"; }
stat() { psql -qAtc "SELECT coalesce($1, 0) FROM gpu_ivfpq_status"; }
# cpu: "busy_jiffies total_jiffies gpu_process_jiffies" (the host's CPUs, and the GPU process's own).
cpu() {
  local gp
  gp=$(stat gpu_process_pid)
  awk -v g="$( [ -r "/proc/$gp/stat" ] && awk '{ print $14 + $15 }' "/proc/$gp/stat" || echo 0)" \
    '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; printf "%d %d %d\n", t - $5 - $6, t, g; exit }' /proc/stat
}
snap() { psql -qAtc "SELECT queued_searches, coalesce(mean_queue_wait_us * queued_searches, 0), coalesce(mean_log_wait_us * queued_searches, 0), batches, queries_gpu, queries_cpu, gpu_fallbacks FROM gpu_ivfpq_status"; }

say ""
say "## k-NN against the same-shape ceiling (10-row key range) and SELECT 1"
say "(CPU busy: the host's CPUs during the k-NN row, then the ceiling's; GPU process cores: its threads' CPU time over the k-NN row's)"
say "| clients | k-NN QPS | k-NN p50 ms | ceiling QPS | ceiling p50 ms | k-NN / ceiling | SELECT 1 QPS | mean batch | queue wait us | GPU us per batch | delivery us per batch | CPU busy k-NN / ceiling | GPU process cores |"
say "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
for c in 1 64 128; do
  IFS='|' read -r s0 w0 _ b0 q0 _ _ < <(snap)
  g0=$(stat "mean_gpu_us * batches"); d0=$(stat "mean_deliver_us * batches")
  read -r cb0 ct0 cg0 < <(cpu)
  read -r knn knn50 _ < <(bench "$c" "$work/knn.sql")
  read -r cb1 ct1 cg1 < <(cpu)
  IFS='|' read -r s1 w1 _ b1 q1 _ _ < <(snap)
  g1=$(stat "mean_gpu_us * batches"); d1=$(stat "mean_deliver_us * batches")
  read -r rb0 rt0 _ < <(cpu)
  read -r ceil ceil50 _ < <(bench "$c" "$work/range.sql")
  [ "$c" = 64 ] && ceil64=$ceil
  read -r rb1 rt1 _ < <(cpu)
  read -r one _ _ < <(bench "$c" "$work/one.sql" 5)
  say "$(awk -v c="$c" -v k="$knn" -v k50="$knn50" -v r="$ceil" -v r50="$ceil50" -v one="$one" \
    -v s="$((s1 - s0))" -v w="$w0 $w1" -v b="$((b1 - b0))" -v q="$((q1 - q0))" -v g="$g0 $g1" -v d="$d0 $d1" \
    -v kb="$((cb1 - cb0)) $((ct1 - ct0)) $((cg1 - cg0))" -v rb="$((rb1 - rb0)) $((rt1 - rt0))" -v ncpu="$(nproc)" 'BEGIN {
      split(w, W, " "); split(g, G, " "); split(d, D, " "); split(kb, K, " "); split(rb, R, " ");
      printf "| %d | %d | %.3f | %d | %.3f | %.2f | %d | %.1f | %.1f | %.1f | %.1f | %.2f / %.2f | %.2f |", c, k, k50, r, r50, (r > 0 ? k / r : 0), one,
        (b > 0 ? q / b : 0), (s > 0 ? (W[2] - W[1]) / s : 0), (b > 0 ? (G[2] - G[1]) / b : 0), (b > 0 ? (D[2] - D[1]) / b : 0),
        (K[2] > 0 ? K[1] / K[2] : 0), (R[2] > 0 ? R[1] / R[2] : 0), (K[2] > 0 ? K[3] / K[2] * ncpu : 0) }')"
done

# knn_row LABEL CLIENTS: the k-NN statement at CLIENTS clients as a table
# row: LABEL, clients, q/s, p50, the mean batch and the GPU's time per batch.
knn_row() {
  local knn knn50 b0 q0 b1 q1 g0 g1
  IFS='|' read -r _ _ _ b0 q0 _ _ < <(snap)
  g0=$(stat "mean_gpu_us * batches")
  read -r knn knn50 _ < <(bench "$2" "$work/knn.sql")
  IFS='|' read -r _ _ _ b1 q1 _ _ < <(snap)
  g1=$(stat "mean_gpu_us * batches")
  say "$(awk -v v="$1" -v c="$2" -v k="$knn" -v l="$knn50" -v b="$((b1 - b0))" -v q="$((q1 - q0))" -v g="$g0 $g1" 'BEGIN {
    split(g, G, " "); printf "| %s | %d | %d | %.3f | %.1f | %.1f |", v, c, k, l, (b > 0 ? q / b : 0), (b > 0 ? (G[2] - G[1]) / b : 0) }')"
}
# setting_rows SETTING "VALUES" "CLIENTS": knn_row at each client count for
# each value of gpu_ivfpq.SETTING (set and reloaded), then its default again.
setting_rows() {
  local v c
  say "| $1 | clients | k-NN QPS | p50 ms | mean batch | GPU us per batch |"
  say "|---|---|---|---|---|---|"
  for v in $2; do
    set_reload "gpu_ivfpq.$1" "$v"
    for c in $3; do knn_row "$v" "$c"; done
  done
  set_reload "gpu_ivfpq.$1"
}

if [ "${POLL_AB:-1}" = 1 ]; then
  say ""
  say "## gpu_ivfpq.gpu_poll (how long the GPU process polls for the next search before it sleeps, us)"
  setting_rows gpu_poll "0 200 0 200" "1 64"
fi
# BATCH_SIZES="256 16 ...": 64 and 128 clients at each gpu_ivfpq.batch_size
# (the most searches the GPU process merges into one batch).
if [ -n "${BATCH_SIZES:-}" ]; then
  say ""
  say "## gpu_ivfpq.batch_size (the most searches in one GPU batch)"
  setting_rows batch_size "$BATCH_SIZES" "64 128"
fi

# Delivery threads of the GPU process (DELIVERY_AB=1): the server restarted
# with GPU_IVFPQ_DELIVERY_THREADS 1, 4 (the default) and 0 (every answer on
# the serving thread), twice, then with the default again.
if [ "${DELIVERY_AB:-0}" = 1 ]; then
  say ""
  say "## Delivery threads (GPU_IVFPQ_DELIVERY_THREADS; the server restarted for each)"
  say "| delivery threads | clients | k-NN QPS | p50 ms | mean batch | GPU us per batch | delivery us per batch (work) |"
  say "|---|---|---|---|---|---|---|"
  for dt in 1 4 0 1 4 0; do
    restart_with "GPU_IVFPQ_DELIVERY_THREADS=$dt"
    for c in 1 64; do
      IFS='|' read -r _ _ _ b0 q0 _ _ < <(snap)
      g0=$(stat "mean_gpu_us * batches"); d0=$(stat "mean_deliver_us * batches")
      read -r knn knn50 _ < <(bench "$c" "$work/knn.sql")
      IFS='|' read -r _ _ _ b1 q1 _ _ < <(snap)
      g1=$(stat "mean_gpu_us * batches"); d1=$(stat "mean_deliver_us * batches")
      say "$(awk -v dt="$dt" -v c="$c" -v k="$knn" -v l="$knn50" -v b="$((b1 - b0))" -v q="$((q1 - q0))" -v g="$g0 $g1" -v d="$d0 $d1" 'BEGIN {
        split(g, G, " "); split(d, D, " ");
        printf "| %d | %d | %d | %.3f | %.1f | %.1f | %.1f |", dt, c, k, l, (b > 0 ? q / b : 0), (b > 0 ? (G[2] - G[1]) / b : 0), (b > 0 ? (D[2] - D[1]) / b : 0) }')"
    done
  done
  restart_with ""
fi

# How the GPU process's serving threads wait for the device (WAIT_AB=1):
# the server restarted with GPU_IVFPQ_HOST_WAIT spin (what the CUDA runtime
# chooses on a host with more cores than contexts) and block (asleep until
# the device's interrupt), twice, then as started.
if [ "${WAIT_AB:-0}" = 1 ]; then
  say ""
  say "## How the serving threads wait for the GPU (GPU_IVFPQ_HOST_WAIT; the server restarted for each)"
  say "| host wait | clients | k-NN QPS | p50 ms | mean batch | GPU us per batch |"
  say "|---|---|---|---|---|---|"
  for w in ${WAIT_MODES:-spin block spin block}; do
    restart_with "GPU_IVFPQ_HOST_WAIT=$w"
    for c in 1 64 128; do knn_row "$w" "$c"; done
  done
  restart_with ""
fi

# Serving threads of the GPU process (IN_FLIGHT=1): with two or more, a
# thread whose batch is queued lets go of the device while it waits, and
# the next takes its searches when that batch is near its expected end, so
# that batches queue one behind the other (IN_FLIGHT_VALUES, default
# "1 2 1 2": each value twice, in turn; IN_FLIGHT_CLIENTS default "1 64 128").
# LEAD_AB="10 30 60": then 64 and 128 clients at two threads with the
# server restarted for each GPU_IVFPQ_PIPELINE_LEAD_US (how long before the
# batch in flight is expected to end the next one takes its searches).
if [ "${IN_FLIGHT:-1}" = 1 ]; then
  say ""
  say "## gpu_ivfpq.batches_in_flight (serving threads of the GPU process; 0: one per GPU)"
  setting_rows batches_in_flight "${IN_FLIGHT_VALUES:-1 2 1 2}" "${IN_FLIGHT_CLIENTS:-1 64 128}"
fi
if [ -n "${LEAD_AB:-}" ]; then
  say ""
  say "## The pipeline's lead (GPU_IVFPQ_PIPELINE_LEAD_US, two serving threads; the server restarted for each)"
  say "| lead us | clients | k-NN QPS | p50 ms | mean batch | GPU us per batch |"
  say "|---|---|---|---|---|---|"
  set_reload gpu_ivfpq.batches_in_flight 2
  for l in $LEAD_AB; do
    restart_with "GPU_IVFPQ_PIPELINE_LEAD_US=$l"
    for c in 64 128; do knn_row "$l" "$c"; done
  done
  set_reload gpu_ivfpq.batches_in_flight
  restart_with ""
fi

# Two lanes on one GPU: the GPU process opens GPU 0 twice (two device
# contexts, each with its stream and a replica of the mirror), so that two
# serving threads keep two batches in flight on it at once (LANES=0 skips
# it); the two contexts share the GPU's memory budget.
if [ "${LANES:-1}" = 1 ]; then
  say ""
  say "## Two batches in flight on one GPU (gpu_ivfpq.devices = '0,0': GPU 0 opened twice, a replica on each)"
  say "| devices | clients | k-NN QPS | p50 ms | mean batch | GPU us per batch |"
  say "|---|---|---|---|---|---|"
  for devs in 0 0,0; do
    set_reload gpu_ivfpq.devices "'$devs'"
    want=$(echo "$devs" | tr ',' '\n' | wc -l)
    for _ in $(seq 300); do
      [ "$(psql -qAtc "SELECT (SELECT count(*) FROM gpu_ivfpq_devices) = $want AND (SELECT state = 'running (GPU)' FROM gpu_ivfpq_status)")" = t ] && break
      sleep 0.2
    done
    psql -qAtc "SELECT 'devices $devs: ' || string_agg(device::text || ' ' || description, '; ') FROM gpu_ivfpq_devices" | tee -a "$RES"
    psql -qAtc "SELECT gpu_ivfpq_prewarm('base_idx')" >/dev/null
    for c in 64 128; do knn_row "$devs" "$c"; done
  done
  set_reload gpu_ivfpq.devices
  for _ in $(seq 300); do
    [ "$(psql -qAtc "SELECT (SELECT count(*) FROM gpu_ivfpq_devices) >= 1 AND (SELECT state = 'running (GPU)' FROM gpu_ivfpq_status)")" = t ] && break
    sleep 0.2
  done
  psql -qAtc "SELECT gpu_ivfpq_prewarm('base_idx')" >/dev/null
fi

# FRONTIER: probes and rerank against recall and the 64-client rate.
if [ -n "${FRONTIER:-}" ]; then
  say ""
  say "## Probes and rerank: recall@10 against the rate (64-client ceiling of the table above: ${ceil64:-?} q/s)"
  say "| probes | rerank | recall@10 | 1 client QPS | 1 client p50 ms | 64 clients QPS | mean batch | GPU us per batch | k-NN / ceiling |"
  say "|---|---|---|---|---|---|---|---|---|"
  for pr in $FRONTIER; do
    p=${pr%%:*}; rr=${pr##*:}
    FOPTS="-c gpu_ivfpq.probes=$p -c gpu_ivfpq.rerank=$rr -c enable_seqscan=off"
    r=$(recall_at_10 gpu "$p" "-c gpu_ivfpq.rerank=$rr")
    read -r one1 one50 _ < <(pg_rate 1 "$work/knn.sql" "$SECS" "$FOPTS")
    IFS='|' read -r _ _ _ b0 q0 _ _ < <(snap); g0=$(stat "mean_gpu_us * batches")
    read -r k64 _ _ < <(pg_rate 64 "$work/knn.sql" "$SECS" "$FOPTS")
    IFS='|' read -r _ _ _ b1 q1 _ _ < <(snap); g1=$(stat "mean_gpu_us * batches")
    say "$(awk -v p="$p" -v rr="$rr" -v r="$r" -v o="$one1" -v o50="$one50" -v k="$k64" -v c="${ceil64:-0}" \
      -v b="$((b1 - b0))" -v q="$((q1 - q0))" -v g="$g0 $g1" 'BEGIN { split(g, G, " ");
      printf "| %d | %d | %s | %d | %.3f | %d | %.1f | %.1f | %.2f |", p, rr, r, o, o50, k,
        (b > 0 ? q / b : 0), (b > 0 ? (G[2] - G[1]) / b : 0), (c > 0 ? k / c : 0) }')"
  done
fi

say ""
say "## 64 readers alone, then beside 4 writers (insert + delete) and autovacuum ($CHURN_SECS s each)"
say "(mean batch, queue wait and GPU us per batch: the readers' searches; GPU busy: the share of the phase the GPU process spent in search calls, then in appends; appends: calls to the GPU process and its work per call; CPU busy: the host's CPUs)"
say "| phase | read QPS | vs static | write TPS | rounds on CPU | GPU fallbacks | waited for the log us (mean per search) | mean batch | queue wait us | GPU us per batch | GPU busy: searches / appends | appends | us per append | CPU busy |"
say "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
tps() { grep -oP 'tps = \K[0-9.]+(?= \(without)' "$1" | cut -d. -f1; }
readers() { PGOPTIONS="$OPTS" pgbench -n -M prepared -c 64 -j 16 -T "$CHURN_SECS" -f "$work/knn.sql" postgres >"$1" 2>&1; }
for phase in static churn; do
  IFS='|' read -r s0 w0 l0 b0 q0 c0 f0 < <(snap)
  g0=$(stat "mean_gpu_us * batches"); a0=$(stat append_calls); ad0=$(stat "mean_append_device_us * append_calls")
  read -r cb0 ct0 _ < <(cpu); t0=$(date +%s%N)
  if [ "$phase" = churn ]; then
    pgbench -n -M prepared -c 4 -j 4 -T "$CHURN_SECS" -f "$work/write.sql" postgres >"$work/writers.txt" 2>&1 &
    writers=$!
  fi
  readers "$work/$phase.txt"
  [ "$phase" = churn ] && wait "$writers"
  read -r cb1 ct1 _ < <(cpu); t1=$(date +%s%N)
  IFS='|' read -r s1 w1 l1 b1 q1 c1 f1 < <(snap)
  g1=$(stat "mean_gpu_us * batches"); a1=$(stat append_calls); ad1=$(stat "mean_append_device_us * append_calls")
  rate=$(tps "$work/$phase.txt")
  [ "$phase" = static ] && static=$rate
  say "$(awk -v p="$phase" -v r="$rate" -v st="$static" -v wt="$([ "$phase" = churn ] && tps "$work/writers.txt" || echo -)" \
    -v c="$((c1 - c0))" -v f="$((f1 - f0))" -v s="$((s1 - s0))" -v l="$l0 $l1" -v w="$w0 $w1" -v b="$((b1 - b0))" \
    -v q="$((q1 - q0))" -v g="$g0 $g1" -v a="$((a1 - a0))" -v ad="$ad0 $ad1" -v us="$(( (t1 - t0) / 1000 ))" \
    -v cpu="$((cb1 - cb0)) $((ct1 - ct0))" 'BEGIN {
      split(l, L, " "); split(w, W, " "); split(g, G, " "); split(ad, AD, " "); split(cpu, K, " ");
      printf "| %s | %d | %.2f | %s | %d | %d | %.1f | %.1f | %.1f | %.1f | %.2f / %.2f | %d | %.1f | %.2f |", p, r, (st > 0 ? r / st : 0), wt, c, f,
        (s > 0 ? (L[2] - L[1]) / s : 0), (b > 0 ? q / b : 0), (s > 0 ? (W[2] - W[1]) / s : 0), (b > 0 ? (G[2] - G[1]) / b : 0),
        (us > 0 ? (G[2] - G[1]) / us : 0), (us > 0 ? (AD[2] - AD[1]) / us : 0), a, (a > 0 ? (AD[2] - AD[1]) / a : 0),
        (K[2] > 0 ? K[1] / K[2] : 0) }')"
done
grep -h "failed transactions" "$work"/*.txt | sed 's/^/# /' | tee -a "$RES"
psql -qAtxc "SELECT * FROM gpu_ivfpq_status" | sed 's/^/# /' | tee -a "$RES"
rm -rf "$work"
