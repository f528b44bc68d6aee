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
