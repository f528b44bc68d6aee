#!/usr/bin/env bash
# Runs the GPU tests, the benchmark and the torch baseline on the device
# machine from binaries built on the build machine and carried compressed in
# .gpubin/gpubin.tar.xz (the device has no GoogleTest or OpenBLAS).
# Logs go to $OUT (the device tool's folder) or bench/gpu/out.
# Usage (repository root): bash bench/gpu/run_on_device.sh [tests|bench|all] [gtest filter]
set -uo pipefail
what=${1:-all}
filter=${2:-*}
out=${OUT:-bench/gpu/out}
bin=/tmp/gpubin
mkdir -p "$out" "$bin"
tar xJf .gpubin/gpubin.tar.xz -C "$bin"
export LD_LIBRARY_PATH=$bin:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/device.txt"
rc=0
if [[ $what == tests || $what == all ]]; then
    timeout 240 "$bin/gpu_tests" --gtest_filter="$filter" 2>&1 | tee "$out/gpu_tests.log" || rc=1
fi
if [[ $what == bench || $what == all ]]; then
    timeout 300 "$bin/gpu_bench" --dump /tmp 2>&1 | tee "$out/gpu_bench.log" || rc=1
    PYTHONUNBUFFERED=1 timeout 120 python3 bench/gpu/torch_baseline.py /tmp 2>&1 | tee "$out/torch_baseline.log" || rc=1
fi
exit $rc
