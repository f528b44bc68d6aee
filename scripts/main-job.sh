#!/usr/bin/env bash
# The main job: Fashion-MNIST through the gpu_ivfpq index, end to end.
#
#   scripts/main-job.sh
#
# Installs the dependencies (SKIP_DEPS=1 skips), builds and installs the
# extension and the tools, starts a throwaway PostgreSQL server (postgres OS
# user, temp dir, unix socket only), loads Fashion-MNIST train (60k) with
# fmnist_load, creates a gpu_ivfpq index, runs the test-set queries through
# knn_bench for a few probes/rerank settings and prints recall@10 and latency.
# On a machine with an NVIDIA GPU and the CUDA toolkit (nvcc), `make` links
# the CUDA kernels; the server then preloads gpu_ivfpq so that its GPU
# service serves, and every setting runs twice, on the GPU path
# (gpu_ivfpq.device = gpu) and on the CPU engine (device = cpu), followed by
# the service's status (which engine served how many queries). Elsewhere, or
# with USE_CUDA=0, the CPU engine alone. The server and its directory are
# removed on exit.
#
# Environment (defaults):
#   LISTS=256 M=16        index options (M must divide 784)
#   NQ=1000               test-set queries used (at most 10000)
#   K=10                  neighbours per query
#   SETTINGS="probes=1,rerank=100;probes=4,rerank=100;probes=10,rerank=100;probes=32,rerank=200"
#   OP='<->'              <-> (L2), <#> (inner product: real_ip_ops), <=> (cosine: real_cosine_ops)
#   KEEP=1                keep the temp dir (the server is still stopped)
#   USE_CUDA=0            build and run without the GPU even where one is
#   PG_CONFIG=...         the PostgreSQL to build for and run (default Debian's
#                         15, which install-deps.sh installs; another version:
#                         PG_CONFIG=$(scripts/install-postgres.sh 18))
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

LISTS=${LISTS:-256}
M=${M:-16}
NQ=${NQ:-1000}
K=${K:-10}
OP=${OP:-<->}
SETTINGS=${SETTINGS:-"probes=1,rerank=100;probes=4,rerank=100;probes=10,rerank=100;probes=32,rerank=200"}
case "$OP" in
  '<->') OPCLASS="" ;;
  '<#>') OPCLASS=real_ip_ops ;;
  '<=>') OPCLASS=real_cosine_ops ;;
  *) warn "OP must be <->, <#> or <=>"; exit 2 ;;
esac

[ "${SKIP_DEPS:-0}" = 1 ] || "$REPO_ROOT/scripts/install-deps.sh"

TMP=$(mktemp -d /tmp/gpu_ivfpq-main.XXXXXX)
chmod 755 "$TMP"
finish() {
  pg_temp_stop
  if [ "${KEEP:-0}" = 1 ]; then say "kept $TMP"; else rm -rf "$TMP"; fi
}
trap finish EXIT

build_extension "$TMP/make.log"
build_tools "$TMP/tools.log"
# The GPU path: the kernels were linked (the Makefile found nvcc) and a GPU is visible.
GPU=0
cuda_info=$(make -s -C "$REPO_ROOT" cuda-info PG_CONFIG="$PG_BIN/pg_config" 2>/dev/null || true)
gpus=$(nvidia-smi -L 2>/dev/null || true)
if [[ $cuda_info == *USE_CUDA=1* && $gpus == GPU\ * ]]; then
  GPU=1
fi
mkdir "$TMP/pg"
if [ "$GPU" = 1 ]; then
  pg_temp_start "$TMP/pg" "shared_preload_libraries = 'gpu_ivfpq'"
  say "server: $PGHOST port $PGPORT, gpu_ivfpq preloaded (GPU service): $(nvidia-smi -L | head -1)"
else
  pg_temp_start "$TMP/pg"
  say "server: $PGHOST port $PGPORT (CPU engine: no GPU or no CUDA toolkit here)"
fi

psql_ -c "CREATE EXTENSION gpu_ivfpq"
t0=$EPOCHREALTIME
load_fmnist fm_train train
load_fmnist fm_test test "$NQ"
say "loaded Fashion-MNIST: $(psql_ -At -c 'SELECT count(*) FROM fm_train') train rows, $(psql_ -At -c 'SELECT count(*) FROM fm_test') queries ($(duration_since "$t0") s)"

secs=$(create_index_timed fm_train "$LISTS" "$M" "$OPCLASS")
say "CREATE INDEX USING gpu_ivfpq (lists = $LISTS, m = $M${OPCLASS:+, $OPCLASS}): $secs s, $(psql_ -At -c "SELECT pg_size_pretty(pg_relation_size('fm_train_ivfpq'))")"

if [ "$GPU" = 1 ]; then
  # Each setting on the GPU path, then on the CPU engine, side by side.
  # (knn_bench separates settings by ';' or spaces; 'default' is no assignment.)
  RUNS=""
  for p in ${SETTINGS//;/ }; do
    [ "$p" = default ] && p="" || p="$p,"
    RUNS+="${p}device=gpu;${p}device=cpu;"
  done
  psql_ -qAt -c "SELECT 'mirror load: ' || gpu_ivfpq_prewarm('fm_train_ivfpq') || ' entries on the GPU'"
  "$TOOLS_BUILD/knn_bench" --table fm_train --query-table fm_test --k "$K" --op "$OP" \
    --settings "$RUNS" --warmup 20
  say "GPU service:"
  psql_ -c "SELECT state, device, queries_gpu, queries_cpu, gpu_fallbacks, round(mean_batch::numeric, 1) AS mean_batch
              FROM gpu_ivfpq_status"
  if [ "$(psql_ -At -c 'SELECT queries_gpu FROM gpu_ivfpq_status')" = 0 ]; then
    warn "the GPU served no query: the device=gpu rows above ran on the CPU engine (see last_error in gpu_ivfpq_status)"
    exit 1
  fi
  psql_ -c "SELECT index, entries, round(size_mb::numeric, 1) AS size_mb, queries, vectors FROM gpu_ivfpq_mirrors"
else
  "$TOOLS_BUILD/knn_bench" --table fm_train --query-table fm_test --k "$K" --op "$OP" \
    --settings "$SETTINGS" --warmup 20
fi
