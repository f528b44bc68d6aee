#!/bin/bash
# The RaBitQ kernels' tests and gpu_bench --rabitq (the list scan alone and
# the GPU mirror's search) of the current build (.gpubin), beside each
# .gpubin2/gpu_bench_NAME.xz (NAME: old, the build before a change).
# TESTS: the gpu_tests filter (default 'Rabitq*').
set -o pipefail
. bench/gpu/ab_lib.sh
ab_setup
ab_tests "${TESTS:-Rabitq*}" 300
for v in $VARS new; do
  timeout 200 $(ab_bin $v) --rabitq > $OUT/rabitq-$v.log 2>&1; echo "rabitq $v rc=$?"
  grep -E "^\| (128|768) \| 4 " $OUT/rabitq-$v.log
done
# NCU=1: the list blocks (rabitq_pairs_kernel) of `gpu_bench --rabitq-profile 1000` under ncu, per
# variant: time, warp instructions and issue-slot use of each launch (128-d, then 768-d; skewed lists).
if [ "${NCU:-0}" = 1 ]; then
  for v in $VARS new; do
    timeout 150 ncu --kernel-name regex:rabitq_pairs --csv --metrics \
      gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__grid_size \
      $(ab_bin $v) --rabitq-profile 1000 > $OUT/ncu-pairs-$v.csv 2>&1; echo "ncu $v rc=$?"
  done
fi
