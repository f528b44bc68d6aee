#!/bin/bash
# The batch k-NN and k-NN graph functions with their DEBUG1 stage times
# (searching; visibility checks and result rows; the graph's visibility
# pass and reading), each twice, on the 1M x 128 set of the other SQL
# benchmarks: gpu_ivfpq_knn_batch of 10000 queries (k 10, probes 32), the
# graph of all rows (k 10, probes 64, rerank 100). Runs after bash
# .device/pg-up.sh and an install of the extension linked with the kernels.
set -euo pipefail
. /opt/pg/env.sh
N=1000000; DATA=${DATA:-/tmp/gpu_ivfpq-synthetic-$N}
. bench/gpu/lib.sh
bench_setup "work_mem = '256MB'
max_parallel_workers_per_gather = 0" "q10k"
psql -q <<SQL
CREATE INDEX base_idx ON base USING gpu_ivfpq (v) WITH (lists = 4096, m = 32);
SELECT gpu_ivfpq_prewarm('base_idx');
CREATE TABLE q10k AS SELECT array_agg(v ORDER BY id) AS m FROM base WHERE id % 100 = 0;
SQL
for i in 1 2; do
psql -X <<'SQL' 2>&1 | grep -E "gpu_ivfpq|Time"
\timing on
SET client_min_messages = debug1;
SELECT count(*) FROM gpu_ivfpq_knn_batch('base_idx', (SELECT m FROM q10k), 10);
SET gpu_ivfpq.probes = 64; SET gpu_ivfpq.rerank = 100;
SELECT count(*) FROM gpu_ivfpq_knn_graph('base_idx', 10);
SQL
done
