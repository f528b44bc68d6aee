#!/bin/bash
# The one-launch RaBitQ search on the GPU machine, in one call: its GPU
# tests (against the staged kernels and the CPU engine) with the IVFPQ one
# launch's, whose parts it shares; gpu_bench --rabitq (the "one launch"
# column); then, if the tests passed, the SQL rows of rabitq_codes.sh with
# ONE_LAUNCH=1 (WHAT=768 by default: 200k x 768, lists 1024, 4 bits).
# Binaries: .gpubin/gpubin.tar.xz (bench/gpu/pack_binaries.sh) and
# .gpubin2/libgpu_ivfpq_gpu.a.xz when carried, else built here; the kit in
# .device as for run_on_device.sh.
set -uo pipefail
B=/tmp/gpubin
mkdir -p $B
if [ -s .gpubin/gpubin.tar.xz ]; then
  tar xJf .gpubin/gpubin.tar.xz -C $B
else
  { cmake -S . -B build-gpu -DGPU_IVFPQ_CUDA=ON -DGPU_IVFPQ_TESTS=ON -DCMAKE_BUILD_TYPE=Release &&
    cmake --build build-gpu -j"$(nproc)" --target gpu_tests gpu_bench; } > /tmp/build-tests.log 2>&1 ||
    { tail -30 /tmp/build-tests.log; exit 1; }
  cp build-gpu/gpu/gpu_tests build-gpu/gpu/gpu_bench $B/
fi
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/device.txt
nproc >> $OUT/device.txt
(cd /tmp && timeout ${TEST_TIMEOUT:-240} $B/gpu_tests --gtest_filter="${GTEST_FILTER:-RabitqIndex.*:SmallBatch.*}") \
  > $OUT/gpu-tests-one-launch.log 2>&1
tests_rc=$?
echo "gpu_tests rc=$tests_rc"
tail -5 $OUT/gpu-tests-one-launch.log
timeout ${BENCH_TIMEOUT:-180} $B/gpu_bench --rabitq > $OUT/gpu-mirror-search-one-launch.txt 2>&1
echo "gpu_bench rc=$?"
[ "$tests_rc" = 0 ] || exit 1
[ "${SQL:-1}" = 1 ] || exit 0
# The kernels' library for the extension: .gpubin2/libgpu_ivfpq_gpu.a.xz when
# carried, else device_build.sh builds it.
if [ -s .gpubin2/libgpu_ivfpq_gpu.a.xz ] && [ ! -s build-gpu/gpu/libgpu_ivfpq_gpu.a ]; then
  mkdir -p build-gpu/gpu && xz -dc .gpubin2/libgpu_ivfpq_gpu.a.xz > build-gpu/gpu/libgpu_ivfpq_gpu.a
fi
export ONE_LAUNCH=1 PQ=${PQ:-0} BITS=${BITS:-4}
WHAT=${WHAT:-768} bash bench/gpu/results/rabitq-codes/run_on_device.sh
