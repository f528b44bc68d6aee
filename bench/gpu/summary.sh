#!/bin/bash
# One table of the SQL benchmarks' headline figures, read from their output
# files in DIR (sql-bench-m32.txt, sql-bench-churn-m32.txt,
# sql-bench-filter-m32.txt, sql-bench-functions.txt, as sql_bench.sh 32,
# sql_bench_churn.sh 32, sql_bench_filter.sh 32 and sql_bench_functions.sh
# write them). A missing file leaves its rows "not run". With RUN=1 it first
# runs the benchmarks that PARTS names (main churn filter functions; a GPU
# machine limits one command to 10 minutes, so run them in two calls and
# summarise after the second).
#
# usage: bench/gpu/summary.sh DIR        (RUN=1 PARTS="main churn" OUT=DIR ...)
set -euo pipefail
DIR=${1:-${OUT:-/tmp}}
if [ "${RUN:-0}" = 1 ]; then
  for part in ${PARTS:-main churn filter functions}; do
    case $part in
    main) OUT=$DIR SECS=${SECS:-5} CPU_BUILD=0 bash bench/gpu/sql_bench.sh 32 >/dev/null ;;
    churn) OUT=$DIR SECS=${CHURN_SECS:-20} bash bench/gpu/sql_bench_churn.sh 32 >/dev/null ;;
    filter) OUT=$DIR SECS=${SECS:-4} bash bench/gpu/sql_bench_filter.sh 32 >/dev/null ;;
    functions) OUT=$DIR bash bench/gpu/sql_bench_functions.sh >/dev/null ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
    esac
  done
fi

main=$DIR/sql-bench-m32.txt churn=$DIR/sql-bench-churn-m32.txt
filter=$DIR/sql-bench-filter-m32.txt functions=$DIR/sql-bench-functions.txt
# cell FILE AWK-PROGRAM: the program's output on FILE, or "not run".
cell() {
  local v=""
  [ -s "$1" ] && v=$(awk -F'|' "$2" "$1" | head -1)
  echo "${v:-not run}"
}
trim() { sed 's/^ *//; s/ *$//'; }

echo "# gpu_ivfpq headline figures: 1M x 128 synthetic, lists 4096, m 32 (from $DIR)"
[ -s "$main" ] && head -2 "$main" | tail -1
echo
echo "| what | measured |"
echo "|---|---|"
echo "| 64 clients, probes 32: QPS (mean batch); CPU engine QPS | $(cell "$main" '/^\| 64 \| [0-9]+ \| [0-9.]+ \| [0-9]+ \|/ { gsub(/ /, ""); print $3 " (" $4 "); " $5 }') |"
for rr in 100 40 20 10; do
  echo "| 64 clients, probes 32, rerank $rr: QPS (recall@10, mean batch) | $(cell "$main" "/^\| $rr \| [0-9.]+ \| [0-9]+ \|/ { gsub(/ /, \"\"); print \$4 \" (\" \$3 \", \" \$5 \")\" }") |"
done
echo "| 1 client, probes 32, GPU: p50 ms (recall@10) | $(cell "$main" '/^\| 32 \| gpu \|/ { gsub(/ /, ""); print $5 " (" $4 ")" }') |"
echo "| 1 client, probes 64, GPU: p50 ms (recall@10) | $(cell "$main" '/^\| 64 \| gpu \|/ { gsub(/ /, ""); print $5 " (" $4 ")" }') |"
echo "| 64 readers beside 4 writers and autovacuum: QPS, share of static | $(cell "$churn" '/^\| 4 writers/ { gsub(/ /, ""); print $3 ", " $4 }') |"
echo "| filtered 1% (pushed down), probes 16: recall@10, p50 ms | $(cell "$filter" '/^\| 1%, pushed down \| 16 \| gpu/ { gsub(/ /, ""); print $5 ", " $6 }') |"
echo "| filtered 10% (pushed down), probes 64: recall@10, p50 ms | $(cell "$filter" '/^\| 10%, pushed down \| 64 \| gpu/ { gsub(/ /, ""); print $5 ", " $6 }') |"
echo "| filtered 1%, not pushed down, probes 32: recall@10, p50 ms | $(cell "$filter" '/^\| 1%, not pushed down \| 32 \| auto/ { gsub(/ /, ""); print $5 ", " $6 }') |"
echo "| gpu_ivfpq_knn_batch, 10000 queries | $(cell "$functions" '/^- gpu: / { sub(/^- gpu: /, ""); print }' | trim) |"
echo "| gpu_ivfpq_knn_graph, 1M rows, k 10, probes 64 / rerank 100: s (recall@10) | $(cell "$functions" '/^\| 64 \| 100 \|/ { gsub(/ /, ""); print $4 " (" $6 ")" }') |"
echo "| gpu_ivfpq_exact_knn, 10000 x 1M | $(cell "$functions" '/^- GPU, 10000 queries: / { sub(/^- GPU, 10000 queries: /, ""); print }' | trim) |"
echo "| CPU engine, 1 client, probes 32: p50 ms (recall@10) | $(cell "$main" '/^\| 32 \| cpu \|/ { gsub(/ /, ""); print $5 " (" $4 ")" }') |"
