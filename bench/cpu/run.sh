#!/usr/bin/env bash
# CPU benchmark of the gpu_ivfpq index through SQL (not a test).
#
#   bench/cpu/run.sh
#
# For each dataset: loads it into a throwaway PostgreSQL server, times
# CREATE INDEX ... USING gpu_ivfpq, then runs the queries from one client
# with a prepared statement (knn_bench) for several probes/rerank settings and
# prints recall@K, QPS and p50/p99 latency. Datasets:
#   fmnist     Fashion-MNIST: 60k train rows indexed (784 dims, raw 0..255),
#              the first FMNIST_NQ test images as queries
#   synthetic  gen_synthetic: SYN_ROWS x 128 (clustered, overlapping), SYN_NQ
#              fresh queries from the same distribution
# Output goes to stdout and to bench/cpu/results-<date>-<time>.txt.
#
# Environment (defaults):
#   DATASETS="fmnist synthetic"
#   K=10  SKIP_DEPS=0  OUT=bench/cpu/results-<date>-<time>.txt
#   FMNIST_LISTS=256 FMNIST_M=16 FMNIST_NQ=1000
#   FMNIST_SETTINGS="probes=1,rerank=100;probes=4,rerank=100;probes=10,rerank=100;probes=20,rerank=200;probes=40,rerank=400"
#   SYN_ROWS=1000000 SYN_DIM=128 SYN_LISTS=1000 SYN_M=16 SYN_NQ=1000 SYN_SEED=42
#   SYN_SETTINGS="probes=8,rerank=100;probes=16,rerank=200;probes=32,rerank=200;probes=64,rerank=400;probes=128,rerank=800"
#   PG_SHARED_BUFFERS=2GB PG_MAINTENANCE_WORK_MEM=2GB   server settings
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/common.sh"

DATASETS=${DATASETS:-"fmnist synthetic"}
K=${K:-10}
FMNIST_LISTS=${FMNIST_LISTS:-256}
FMNIST_M=${FMNIST_M:-16}
FMNIST_NQ=${FMNIST_NQ:-1000}
FMNIST_SETTINGS=${FMNIST_SETTINGS:-"probes=1,rerank=100;probes=4,rerank=100;probes=10,rerank=100;probes=20,rerank=200;probes=40,rerank=400"}
SYN_ROWS=${SYN_ROWS:-1000000}
SYN_DIM=${SYN_DIM:-128}
SYN_LISTS=${SYN_LISTS:-1000}
SYN_M=${SYN_M:-16}
SYN_NQ=${SYN_NQ:-1000}
SYN_SEED=${SYN_SEED:-42}
SYN_SETTINGS=${SYN_SETTINGS:-"probes=8,rerank=100;probes=16,rerank=200;probes=32,rerank=200;probes=64,rerank=400;probes=128,rerank=800"}
export PG_SHARED_BUFFERS=${PG_SHARED_BUFFERS:-2GB}
export PG_MAINTENANCE_WORK_MEM=${PG_MAINTENANCE_WORK_MEM:-2GB}
OUT=${OUT:-$REPO_ROOT/bench/cpu/results-$(date +%Y%m%d-%H%M%S).txt}

bench_fmnist() {
  say "== Fashion-MNIST: 60000 rows x 784, $FMNIST_NQ queries, lists=$FMNIST_LISTS m=$FMNIST_M"
  local t0=$EPOCHREALTIME secs
  load_fmnist fm_train train >/dev/null
  load_fmnist fm_test test "$FMNIST_NQ" >/dev/null
  say "load (fmnist_load COPY + primary key + VACUUM ANALYZE): $(duration_since "$t0") s"
  secs=$(create_index_timed fm_train "$FMNIST_LISTS" "$FMNIST_M" 2>/dev/null)
  say "CREATE INDEX: $secs s (index $(psql_ -At -c "SELECT pg_size_pretty(pg_relation_size('fm_train_ivfpq'))"), table $(psql_ -At -c "SELECT pg_size_pretty(pg_table_size('fm_train'))"))"
  "$TOOLS_BUILD/knn_bench" --table fm_train --query-table fm_test --k "$K" \
    --settings "$FMNIST_SETTINGS" --warmup 50
  psql_ -c "DROP TABLE fm_train, fm_test"
  say ""
}

bench_synthetic() {
  say "== synthetic: $SYN_ROWS rows x $SYN_DIM (gen_synthetic seed $SYN_SEED), $SYN_NQ queries, lists=$SYN_LISTS m=$SYN_M"
  local t0=$EPOCHREALTIME secs
  "$TOOLS_BUILD/gen_synthetic" --what queries --queries "$SYN_NQ" --dim "$SYN_DIM" --seed "$SYN_SEED" \
    --format fvecs --out "$TMP/syn_queries.fvecs"
  psql_ -c "CREATE TABLE syn (id bigint, embedding real[])"
  "$TOOLS_BUILD/gen_synthetic" --rows "$SYN_ROWS" --dim "$SYN_DIM" --seed "$SYN_SEED" --table syn
  say "load (gen_synthetic COPY): $(duration_since "$t0") s"
  psql_ -c "ALTER TABLE syn ADD PRIMARY KEY (id)" -c "VACUUM ANALYZE syn"
  secs=$(create_index_timed syn "$SYN_LISTS" "$SYN_M" 2>/dev/null)
  say "CREATE INDEX: $secs s (index $(psql_ -At -c "SELECT pg_size_pretty(pg_relation_size('syn_ivfpq'))"), table $(psql_ -At -c "SELECT pg_size_pretty(pg_table_size('syn'))"))"
  "$TOOLS_BUILD/knn_bench" --table syn --queries "$TMP/syn_queries.fvecs" --k "$K" \
    --settings "$SYN_SETTINGS" --warmup 50
  psql_ -c "DROP TABLE syn"
  say ""
}

main() {
  [ "${SKIP_DEPS:-0}" = 1 ] || "$REPO_ROOT/scripts/install-deps.sh"
  TMP=$(mktemp -d /tmp/gpu_ivfpq-bench.XXXXXX)
  chmod 755 "$TMP"
  trap 'pg_temp_stop; rm -rf "$TMP"' EXIT
  build_extension "$TMP/make.log"
  build_tools "$TMP/tools.log"
  mkdir "$TMP/pg"
  pg_temp_start "$TMP/pg"
  psql_ -c "CREATE EXTENSION gpu_ivfpq"

  local commit
  commit=$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
  git -C "$REPO_ROOT" diff --quiet HEAD 2>/dev/null || commit="$commit+dirty"
  say "# gpu_ivfpq CPU benchmark, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit"
  say "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
  say "# $(psql_ -At -c 'SELECT version()' | cut -d, -f1); shared_buffers=$PG_SHARED_BUFFERS, one client, prepared statement, real[] parameter as text"
  say "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine skews QPS and latency)"
  say "# recall@$K against exact brute force (engine brute_force_knn); QPS = queries / wall time; latency per query round trip"
  say ""
  for ds in $DATASETS; do
    case "$ds" in
      fmnist) bench_fmnist ;;
      synthetic) bench_synthetic ;;
      *) warn "unknown dataset $ds"; return 2 ;;
    esac
  done
}

main 2>&1 | tee "$OUT"
say "results written to ${OUT#"$REPO_ROOT"/}"
