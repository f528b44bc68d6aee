#!/bin/bash
# A/B of two versions of src/am/scan.cpp on the same host and data (a warm
# GPU machine whose server still holds the direct-path benchmark's 1M x 128
# tables and index): .gpubin2/scan_old.cpp and .gpubin2/scan_new.cpp (carried),
# each built and installed in turn, then the k-NN statement at 1 and 64
# clients (pgbench, probes $PROBES), ROUNDS times A then B.
set -uo pipefail
. /opt/pg/env.sh
. bench/gpu/lib.sh 2>/dev/null || true
GPU_LIB=$PWD/build-gpu/gpu/libgpu_ivfpq_gpu.a
PROBES=${PROBES:-80}; SECS=${SECS:-6}
w=$(mktemp -d); chmod 755 "$w"
cat >"$w/knn.sql" <<Q
\set q random(1, 1000)
SELECT id FROM base ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10;
Q
chmod 644 "$w/knn.sql"
install_scan() {
  cp ".gpubin2/scan_$1.cpp" src/am/scan.cpp
  ( make -s -j"$(nproc)" PG_CONFIG=$PG_CONFIG GPU_IVFPQ_CUDA_LIB=$GPU_LIB &&
    make -s install PG_CONFIG=$PG_CONFIG GPU_IVFPQ_CUDA_LIB=$GPU_LIB ) >/tmp/ab-build.log 2>&1 || { tail -20 /tmp/ab-build.log; exit 1; }
  as_pg pg_ctl -D "$PGDATA" -l /tmp/pgkit-server.log -w restart >/dev/null
  for _ in $(seq 100); do psql -qAtc "SELECT state FROM gpu_ivfpq_status" 2>/dev/null | grep -q "running (GPU)" && break; sleep 0.2; done
  # Load the mirror (a scan before it is loaded runs on the CPU), then warm up.
  for _ in $(seq 100); do
    psql -qAtc "SET enable_seqscan = off; SET gpu_ivfpq.probes = $PROBES; SELECT id FROM base ORDER BY v <-> (SELECT v FROM queries WHERE qid = 1) LIMIT 10" >/dev/null
    [ "$(psql -qAtc "SELECT mirrors FROM gpu_ivfpq_status")" -ge 1 ] && sleep 1 && break
    sleep 0.5
  done
  pg_rate 16 "$w/knn.sql" 4 "-c gpu_ivfpq.probes=$PROBES -c enable_seqscan=off" >/dev/null
}
cpu_rounds() { psql -qAtc "SELECT queries_cpu + gpu_fallbacks FROM gpu_ivfpq_status"; }
cpu() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; printf "%d %d\n", t - $5 - $6, t; exit }' /proc/stat; }
echo "| scan.cpp | clients | k-NN QPS | p50 ms | CPU busy | CPU rounds + fallbacks |"
echo "|---|---|---|---|---|---|"
for r in $(seq "${ROUNDS:-2}"); do
  for v in old new; do
    install_scan "$v"
    for c in 1 64; do
      f0=$(cpu_rounds); read -r b0 t0 < <(cpu)
      read -r tps p50 _ < <(pg_rate "$c" "$w/knn.sql" "$SECS" "-c gpu_ivfpq.probes=$PROBES -c enable_seqscan=off")
      read -r b1 t1 < <(cpu); f1=$(cpu_rounds)
      echo "| $v | $c | $tps | $p50 | $(awk -v b=$((b1 - b0)) -v t=$((t1 - t0)) 'BEGIN { printf "%.2f", (t > 0 ? b / t : 0) }') | $((f1 - f0)) |"
    done
  done
done
psql -qAtc "SELECT queries_gpu, queries_cpu, gpu_fallbacks FROM gpu_ivfpq_status"
