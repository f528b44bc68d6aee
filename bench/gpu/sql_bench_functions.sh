#!/bin/bash
# Benchmark of the search functions on the GPU machine, on the same
# 1M x 128 set as sql_bench.sh (tools/gen_synthetic, seed 42; lists 4096,
# m 32): batch k-NN at batch 10000 (GPU vs CPU), the k-NN graph of the whole
# table (time and recall on 1000 sampled rows), exact brute force (GPU vs
# CPU, and a torch GEMM + topk baseline on the same vectors), exact range
# search vs a sequential scan.
#
# Runs after bash .device/pg-up.sh and an install of the extension linked
# with the kernels. usage: bench/gpu/sql_bench_functions.sh [N]
set -euo pipefail
N=${1:-1000000}
M=32
DATA=${DATA:-/tmp/gpu_ivfpq-synthetic-$N}
RES=${OUT:-/tmp}/sql-bench-functions.txt
. "${PGENV:-/opt/pg/env.sh}"
say() { echo "$*" | tee -a "$RES"; }
: >"$RES"

# Server: preloaded, large buffers; the data as tables base and queries.
. bench/gpu/lib.sh
bench_setup "work_mem = '256MB'
max_parallel_workers_per_gather = 0" "g, sample, ex, rq, q10k, q1k"
psql -q <<SQL
CREATE INDEX base_idx ON base USING gpu_ivfpq (v) WITH (lists = ${LISTS:-4096}, m = $M);
SELECT gpu_ivfpq_prewarm('base_idx');
CREATE TABLE q10k AS SELECT array_agg(v ORDER BY id) AS m FROM base WHERE id % 100 = 0;
CREATE TABLE q1k AS SELECT array_agg(v ORDER BY qid) AS m FROM queries;
SQL
say "# gpu_ivfpq search functions: $N x 128 synthetic (tools/gen_synthetic, seed 42), lists ${LISTS:-4096}, m $M"
say "# device: $(psql -qAtc 'SELECT device FROM gpu_ivfpq_status'); $(nproc) CPU cores; $(date -u +%F' '%T) UTC"

# Seconds of one statement (server-side, psql \timing).
timed() {
  local opts=$1 sql=$2
  PGOPTIONS="$opts" psql -qAt -c '\timing on' -c "$sql" | grep -oP 'Time: \K[0-9.]+' | tail -1 |
    awk '{ printf "%.2f", $1 / 1000 }'
}

say ""
say "## batch k-NN: gpu_ivfpq_knn_batch, 10000 queries (base rows), k 10, probes 32, rerank 100"
for dev in gpu cpu; do
  t=$(timed "-c gpu_ivfpq.device=$dev -c gpu_ivfpq.probes=32" \
      "SELECT count(*) FROM gpu_ivfpq_knn_batch('base_idx', (SELECT m FROM q10k), 10)")
  say "- $dev: $t s, $(awk -v t="$t" 'BEGIN { printf "%.0f", 10000 / t }') queries/s"
done
r=$(PGOPTIONS="-c gpu_ivfpq.probes=32" psql -qAt -c "
  SELECT round(avg(hit) / 10, 4) FROM (
    SELECT r.query, count(*) FILTER (WHERE b.id = ANY (q.gt[1:10])) AS hit
    FROM gpu_ivfpq_knn_batch('base_idx', (SELECT m FROM q1k), 10) r
    JOIN base b ON b.ctid = r.tid JOIN queries q ON q.qid = r.query GROUP BY r.query) x")
say "- recall@10 of batch search on the 1000 benchmark queries (exact float64 ground truth): $r"

say ""
say "## k-NN graph: gpu_ivfpq_knn_graph over all $N rows, k 10; recall@10 on 1000 sampled rows (against gpu_ivfpq_exact_knn, self excluded)"
psql -qAt -c "
  CREATE TABLE sample AS SELECT ctid AS t, v, row_number() OVER () AS n FROM base WHERE id % 1000 = 7;
  CREATE TABLE ex AS
    SELECT s.t AS src, e.tid AS dst FROM (SELECT array_agg(v ORDER BY n) AS m FROM sample) a,
         gpu_ivfpq_exact_knn('base', 'v', a.m, 11) e JOIN sample s ON s.n = e.query
    WHERE e.tid <> s.t" >/dev/null
say "| probes | rerank | seconds | edges | recall@10 |"
say "|---|---|---|---|---|"
for cfg in "16 20" "32 40" "64 100"; do
  set -- $cfg
  psql -qc "DROP TABLE IF EXISTS g"
  t=$(timed "-c gpu_ivfpq.probes=$1 -c gpu_ivfpq.rerank=$2 -c client_min_messages=warning" \
      "CREATE UNLOGGED TABLE g AS SELECT * FROM gpu_ivfpq_knn_graph('base_idx', 10)")
  rec=$(psql -qAtc "SELECT round((SELECT count(*) FROM ex JOIN g USING (src, dst))::numeric / (SELECT count(*) FROM ex), 4)")
  say "| $1 | $2 | $t | $(psql -qAtc 'SELECT count(*) FROM g') | $rec |"
done

say ""
say "## exact brute force: gpu_ivfpq_exact_knn over all $N rows, k 10"
t=$(timed "-c gpu_ivfpq.device=gpu" "SELECT count(*) FROM gpu_ivfpq_exact_knn('base', 'v', (SELECT m FROM q10k), 10)")
say "- GPU, 10000 queries: $t s (from the index's GPU mirror: its stored vectors, fp32 preselection, exact distances; visibility from one table pass)"
t1=$(timed "-c gpu_ivfpq.device=gpu" "SELECT count(*) FROM gpu_ivfpq_exact_knn('base', 'v', (SELECT m FROM q1k), 10)")
say "- GPU, 1000 queries: $t1 s"
t2=$(timed "-c gpu_ivfpq.device=cpu" "SELECT count(*) FROM gpu_ivfpq_exact_knn('base', 'v', (SELECT array_agg(v) FROM (SELECT v FROM queries ORDER BY qid LIMIT 100) s), 10)")
say "- CPU (one backend), 100 queries: $t2 s"
python3 - "$DATA" "$N" >/tmp/torch-baseline.txt 2>&1 <<'PY' && cat /tmp/torch-baseline.txt | tee -a "$RES" || say "- torch baseline: not available here ($(tail -1 /tmp/torch-baseline.txt))"
import sys, time, torch
sys.path.insert(0, 'bench/gpu')
from fvecs import read_fvecs
data, n = sys.argv[1], int(sys.argv[2])
torch.backends.cuda.matmul.allow_tf32 = False
base = torch.from_numpy(read_fvecs(data + '/base.fvecs')).cuda()
q = base[::100][:10000].contiguous()
def run():
    out = []
    for i in range(0, q.shape[0], 2000):
        qq = q[i:i + 2000]
        d = (qq * qq).sum(1, keepdim=True) - 2 * qq @ base.T + (base * base).sum(1)[None, :]
        out.append(torch.topk(d, 10, largest=False).indices)
    torch.cuda.synchronize()
    return out
run()
t0 = time.time(); run(); t = time.time() - t0
print('- torch baseline (vectors already on the GPU, fp32 GEMM + topk, tiles of 2000 queries), 10000 queries: %.3f s' % t)
PY

say ""
say "## exact range search vs sequential scan (5 benchmark queries, radius = their 100th neighbour distance)"
psql -qAt -c "CREATE TABLE rq AS SELECT q.qid, q.v, (SELECT v <-> q.v FROM base WHERE id = q.gt[100]) AS r FROM queries q WHERE qid <= 5" >/dev/null
t=$(timed "" "SELECT count(*) FROM rq, gpu_ivfpq_range('base_idx', rq.v, rq.r) g")
n1=$(psql -qAtc "SELECT count(*) FROM rq, gpu_ivfpq_range('base_idx', rq.v, rq.r) g")
ts=$(timed "-c enable_indexscan=off" "SELECT count(*) FROM rq, base WHERE base.v <-> rq.v <= rq.r")
n2=$(psql -qAtc "SET enable_indexscan = off; SELECT count(*) FROM rq, base WHERE base.v <-> rq.v <= rq.r")
say "- gpu_ivfpq_range: $t s, $n1 rows; sequential scan: $ts s, $n2 rows"
PGOPTIONS="-c client_min_messages=debug1" psql -qAt -c "SELECT count(*) FROM gpu_ivfpq_range('base_idx', (SELECT v FROM rq WHERE qid = 1), (SELECT r FROM rq WHERE qid = 1))" 2>&1 |
  grep -oP 'range search.*' | sed 's/^/- query 1: /' | tee -a "$RES"
psql -qAtxc "SELECT * FROM gpu_ivfpq_status" | sed 's/^/# /' | tee -a "$RES"
