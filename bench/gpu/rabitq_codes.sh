#!/bin/bash
# Codes = rabitq beside codes = pq on the set of the SQL benchmarks
# (tools/gen_synthetic, seed 42, N x DIM, default 1M x 128): the same table indexed
# one way after the other, lists LISTS (4096). For each index: CREATE INDEX
# time, its size and bytes per row; then recall@10 over the 1000 queries
# against their exact top 10, q/s with 1 and 64 clients and the median
# latency at 1 client, for
#   SELECT id FROM base ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10
# PQ (m M, default 32, vector copies) and RaBitQ codes of BITS bits per
# dimension, each on the GPU (its mirror's size; RERANKS candidates
# re-ranked, default "100 40 20": PQ on the GPU from its vector copies,
# RaBitQ from the table) and on the CPU engine; and gpu_ivfpq_knn_batch of
# 10,000 queries (table rows) on the GPU.
#
# Runs after bash .device/pg-up.sh and an install of the extension linked
# with the kernels. usage: bench/gpu/rabitq_codes.sh (N, DIM, LISTS, M, SECS
# (pgbench seconds per row, default 6), BITS ("2 4 7"), PROBES ("16 32"),
# RERANKS ("100 40 20"), GPU_PROBES (probes of the GPU rows, "32"), PQ (0: no
# PQ rows), ONE_LAUNCH (1: RaBitQ's GPU rows again, searched in one launch))
set -euo pipefail
N=${N:-1000000}
DIM=${DIM:-128}
export DIM
LISTS=${LISTS:-4096}
M=${M:-32}
SECS=${SECS:-6}
BITS=${BITS:-"2 4 7"}
PROBES=${PROBES-"16 32"}
GPU_PROBES=${GPU_PROBES:-32}
RERANKS=${RERANKS:-"100 40 20"}
DATA=${DATA:-/tmp/gpu_ivfpq-synthetic-$N-$DIM}
RES=${OUT:-/tmp}/rabitq-codes-$DIM.txt
. "${PGENV:-/opt/pg/env.sh}"
say() { echo "$*" | tee -a "$RES"; }
: >"$RES"

. bench/gpu/lib.sh
bench_setup "work_mem = '256MB'" "q10k"
say "# codes = rabitq beside codes = pq: ${DATASET:-synthetic (tools/gen_synthetic, seed 42)} $N x $DIM, lists $LISTS"
say "# host: $(nproc) CPU cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); $SECS s per row; $(date -u +%F' '%T) UTC"
work=$(mktemp -d)
chmod 755 "$work"
printf '\\set q random(1, 1000)\nSELECT id FROM base ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10;\n' >"$work/knn.sql"
chmod 644 "$work/knn.sql"

build() {  # WITH-OPTIONS: builds base_idx, says time, size and bytes per row
  local t0
  psql -qc "DROP INDEX IF EXISTS base_idx"
  t0=$(date +%s.%N)
  psql -qc "CREATE INDEX base_idx ON base USING gpu_ivfpq (v) WITH ($1)"
  say "CREATE INDEX ... WITH ($1): $(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $t0 }") s, $(psql -qAtc "SELECT pg_size_pretty(pg_relation_size('base_idx')) || ', ' || round(pg_relation_size('base_idx')::numeric / $N, 1) || ' bytes per row'")"
}
row() {  # NAME DEVICE PROBES RERANK
  local r a a50 b opts="-c gpu_ivfpq.device=$2 -c gpu_ivfpq.probes=$3 -c gpu_ivfpq.rerank=$4"
  r=$(recall_at_10 "$2" "$3" "-c gpu_ivfpq.rerank=$4")
  read -r a a50 _ < <(pg_rate 1 "$work/knn.sql" "$SECS" "$opts")
  read -r b _ _ < <(pg_rate 64 "$work/knn.sql" "$SECS" "$opts")
  say "| $1 | $3 | $4 | $r | $a | $b | $a50 |"
}
header() {
  say ""
  say "| index | probes | rerank | recall@10 | q/s, 1 client | q/s, 64 clients | p50 ms, 1 client |"
  say "|---|---|---|---|---|---|---|"
}

psql -qc "CREATE TABLE q10k AS SELECT array_agg(v ORDER BY id) AS m FROM base WHERE id % $((N / 10000)) = 0 AND id <= $N"
# BATCH_WORKERS="2 8": the batch k-NN timed at each max_parallel_workers_per_gather (the
# participants of the re-rank from the table; PostgreSQL's default is 2).
batch() {  # NAME: gpu_ivfpq_knn_batch of 10,000 queries, k 10, probes 32, on the GPU
  local t0 t w sql
  for w in ${BATCH_WORKERS:-2}; do
    sql="SET gpu_ivfpq.device = gpu; SET gpu_ivfpq.probes = 32; SET max_parallel_workers_per_gather = $w; SELECT count(*) FROM gpu_ivfpq_knn_batch('base_idx', (SELECT m FROM q10k), 10)"
    psql -qAtc "$sql" >/dev/null
    t0=$(date +%s.%N)
    psql -qAtc "$sql" >/dev/null
    t=$(awk "BEGIN { printf \"%.3f\", $(date +%s.%N) - $t0 }")
    say "$1: gpu_ivfpq_knn_batch, 10000 queries, k 10, probes 32, rerank 100, GPU$([ "$w" = 2 ] || echo ", max_parallel_workers_per_gather $w"): $t s ($(awk "BEGIN { printf \"%.0f\", 10000 / $t }") queries/s)"
    # A third call with its DEBUG1 report: where the time goes (the GPU's search, the rows from the table).
    psql -qAtc "SET client_min_messages = debug1; $sql" 2>&1 >/dev/null |
      sed -n 's/^DEBUG:  gpu_ivfpq batch search on "base_idx": /  stages: /p' | tee -a "$RES"
  done
}
mirror() {
  psql -qAtc "SELECT gpu_ivfpq_prewarm('base_idx')" >/dev/null || true
  say "mirror on the GPU: $(psql -qAtc "SELECT sum(memory_used_mb) FROM gpu_ivfpq_devices") MB ($(psql -qAtc "SELECT round((sum(memory_used_mb) * 1048576.0 / $N)::numeric, 1) FROM gpu_ivfpq_devices") bytes per row)"
}

section() {  # NAME OPTIONS: index the table WITH (OPTIONS), then NAME's rows
  build "$2"
  mirror
  batch "$1"
  header
  for p in $GPU_PROBES; do
    for r in $RERANKS; do row "$1, GPU" auto "$p" "$r"; done
  done
  # ONE_LAUNCH=1: the RaBitQ GPU rows again with the GPU process searching
  # batches of up to 256 queries in one launch (GPU_IVFPQ_RABITQ_ONE_LAUNCH).
  if [ "${ONE_LAUNCH:-0}" = 1 ] && [ "${1#rabitq}" != "$1" ]; then
    restart_with "GPU_IVFPQ_RABITQ_ONE_LAUNCH=256"
    for p in $GPU_PROBES; do
      for r in $RERANKS; do row "$1, GPU, one launch" auto "$p" "$r"; done
    done
    restart_with ""
  fi
  for p in $PROBES; do row "$1, CPU" cpu "$p" 100; done
}

if [ "${PQ:-1}" = 1 ]; then  # PQ=0: the RaBitQ rows only
  section "pq m $M + vectors" "lists = $LISTS, m = $M"
fi
for b in $BITS; do
  say ""
  section "rabitq bits $b" "lists = $LISTS, codes = rabitq, bits = $b"
done
rm -rf "$work"
