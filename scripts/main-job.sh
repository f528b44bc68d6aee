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
# The server and its directory are removed on exit.
#
# Environment (defaults):
#   LISTS=256 M=16        index options (M must divide 784)
#   NQ=1000               test-set queries used (at most 10000)
#   K=10                  neighbours per query
#   SETTINGS="probes=1,rerank=100;probes=4,rerank=100;probes=10,rerank=100;probes=32,rerank=200"
#   OP='<->'              <-> (L2), <#> (inner product: real_ip_ops), <=> (cosine: real_cosine_ops)
#   KEEP=1                keep the temp dir (the server is still stopped)
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
mkdir "$TMP/pg"
pg_temp_start "$TMP/pg"
say "server: $PGHOST port $PGPORT"

psql_ -c "CREATE EXTENSION gpu_ivfpq"
t0=$EPOCHREALTIME
load_fmnist fm_train train
load_fmnist fm_test test "$NQ"
say "loaded Fashion-MNIST: $(psql_ -At -c 'SELECT count(*) FROM fm_train') train rows, $(psql_ -At -c 'SELECT count(*) FROM fm_test') queries ($(duration_since "$t0") s)"

secs=$(create_index_timed fm_train "$LISTS" "$M" "$OPCLASS")
say "CREATE INDEX USING gpu_ivfpq (lists = $LISTS, m = $M${OPCLASS:+, $OPCLASS}): $secs s, $(psql_ -At -c "SELECT pg_size_pretty(pg_relation_size('fm_train_ivfpq'))")"

"$TOOLS_BUILD/knn_bench" --table fm_train --query-table fm_test --k "$K" --op "$OP" \
  --settings "$SETTINGS" --warmup 20
