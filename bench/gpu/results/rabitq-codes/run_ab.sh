#!/bin/bash
# The RaBitQ kernels' tests and gpu_bench --rabitq (the list scan alone and
# the GPU mirror's search) of the current build (.gpubin), beside each
# .gpubin2/gpu_bench_NAME.xz (NAME: old, the build before a change).
# TESTS: the gpu_tests filter (default 'Rabitq*').
set -o pipefail
B=/tmp/gpubin; mkdir -p $B; tar xJf .gpubin/gpubin.tar.xz -C $B; export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/device.txt
timeout 300 $B/gpu_tests --gtest_filter="${TESTS:-Rabitq*}" > $OUT/gpu_tests.log 2>&1; echo "tests rc=$?"
grep -E "FAILED|PASSED|SKIPPED \]" $OUT/gpu_tests.log | head -20; grep -B3 -A12 "Failure" $OUT/gpu_tests.log | head -40
VARS=""
for f in .gpubin2/gpu_bench_*.xz; do [ -s "$f" ] || continue
  v=$(basename $f .xz); v=${v#gpu_bench_}; xz -dc $f > $B/gpu_bench_$v; chmod +x $B/gpu_bench_$v; VARS="$VARS $v"
done
for v in $VARS new; do bin=$B/gpu_bench; [ $v = new ] || bin=$B/gpu_bench_$v
  timeout 200 $bin --rabitq > $OUT/rabitq-$v.log 2>&1; echo "rabitq $v rc=$?"
  grep -E "^\| (128|768) \| 4 " $OUT/rabitq-$v.log
done
