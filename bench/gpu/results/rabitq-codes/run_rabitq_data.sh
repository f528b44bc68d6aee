#!/bin/bash
# The RaBitQ mirror's search over real lists, on the GPU machine in one
# call: the GPU tests (GTEST_FILTER, RabitqIndex.* by default), then
# gpu_bench --rabitq-data (tools/gen_synthetic's sets and their k-means
# lists: 200k x 768 in 1024 lists, 1M x 128 in 4096) and, with UNIFORM=1
# (the default), gpu_bench --rabitq, of this build and, when
# .gpubin-old/gpubin.tar.xz is carried, of that one's --rabitq too.
# Binaries: .gpubin/gpubin.tar.xz (bench/gpu/pack_binaries.sh).
set -uo pipefail
B=/tmp/gpubin
mkdir -p $B
tar xJf .gpubin/gpubin.tar.xz -C $B || exit 1
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/device.txt
nproc >> $OUT/device.txt
(cd /tmp && timeout ${TEST_TIMEOUT:-200} $B/gpu_tests --gtest_filter="${GTEST_FILTER:-RabitqIndex.*}") \
  > $OUT/gpu-tests-rabitq-data.log 2>&1
echo "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]|Failure" $OUT/gpu-tests-rabitq-data.log | head -20
. bench/gpu/data.sh
DIM=768 make_data /tmp/d768 200000 || exit 1
DIM=128 make_data /tmp/d128 1000000 || exit 1
timeout ${DATA_TIMEOUT:-150} $B/gpu_bench --rabitq-data --base /tmp/d768/base.fvecs --queries /tmp/d768/queries.fvecs \
  --lists 1024 > $OUT/gpu-mirror-search-data-768.txt 2>&1
echo "gpu_bench 768 rc=$?"
timeout ${DATA_TIMEOUT:-150} $B/gpu_bench --rabitq-data --base /tmp/d128/base.fvecs --queries /tmp/d128/queries.fvecs \
  --lists 4096 > $OUT/gpu-mirror-search-data-128.txt 2>&1
echo "gpu_bench 128 rc=$?"
if [ "${UNIFORM:-1}" = 1 ]; then
  timeout ${BENCH_TIMEOUT:-120} $B/gpu_bench --rabitq > $OUT/gpu-mirror-search-rabitq.txt 2>&1
  echo "gpu_bench --rabitq rc=$?"
  if [ -s .gpubin-old/gpubin.tar.xz ]; then
    mkdir -p /tmp/gpubin-old && tar xJf .gpubin-old/gpubin.tar.xz -C /tmp/gpubin-old &&
      LD_LIBRARY_PATH=/tmp/gpubin-old:/usr/local/cuda/lib64 timeout ${BENCH_TIMEOUT:-120} \
        /tmp/gpubin-old/gpu_bench --rabitq > $OUT/gpu-mirror-search-rabitq-before.txt 2>&1
    echo "old gpu_bench --rabitq rc=$?"
  fi
fi
