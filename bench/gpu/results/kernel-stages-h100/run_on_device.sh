#!/usr/bin/env bash
# Device run for the fused-kernel branch: gpu_tests (whole suite) and
# gpu_bench --stages; if the newest build fails a test, the previous build
# (commit d4094f6) is tested and measured instead.
set -o pipefail
B=/tmp/gb; O=/tmp/gbold; mkdir -p $B $O; xz -dc .gpubin-fused/gpubin.tar.xz | tar xf - -C $B
xz -dc .gpubin-fused/gpubin-old.tar.xz | tar xf - -C $O
export LD_LIBRARY_PATH=$B
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $OUT/device.txt 2>&1
( source bench/gpu/data.sh && make_data /tmp/data 1000000 ) > /tmp/data.log 2>&1 &
DATA=$!
timeout 150 $B/gpu_tests > $OUT/gpu_tests.log 2>&1; rc=$?; echo "gpu_tests rc=$rc"
grep -E "^\[  FAILED|^\[  PASSED|tests from .* ran" $OUT/gpu_tests.log | head -20
BIN=$B
if [ $rc != 0 ]; then
  grep -B2 -A10 "Failure" $OUT/gpu_tests.log | head -40
  timeout 150 $O/gpu_tests > $OUT/gpu_tests_d4094f6.log 2>&1; echo "old gpu_tests rc=$?"
  grep -E "^\[  FAILED|^\[  PASSED|tests from .* ran" $OUT/gpu_tests_d4094f6.log | head
  BIN=$O
fi
wait $DATA; echo "data rc=$?"
timeout 150 $BIN/gpu_bench --base /tmp/data/base.fvecs --queries /tmp/data/queries.fvecs --stages > $OUT/gpu_bench_stages.log 2>&1; echo "gpu_bench ($BIN) rc=$?"
