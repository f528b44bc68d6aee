#!/usr/bin/env bash
# Runs the GPU tests, the benchmark and the torch baseline on the device
# machine, from binaries built here and carried in .gpubin/ (the device has
# no GoogleTest). Logs go to $OUT (the device tool's folder) or bench/gpu/out.
# Usage (repository root): bash bench/gpu/run_on_device.sh [tests|bench|all]
set -uo pipefail
what=${1:-all}
out=${OUT:-bench/gpu/out}
mkdir -p "$out"
export LD_LIBRARY_PATH=$PWD/.gpubin${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/device.txt"
rc=0
if [[ $what == tests || $what == all ]]; then
    ./.gpubin/gpu_tests 2>&1 | tee "$out/gpu_tests.log" || rc=1
fi
if [[ $what == bench || $what == all ]]; then
    ./.gpubin/gpu_bench --dump /tmp 2>&1 | tee "$out/gpu_bench.log" || rc=1
    PYTHONUNBUFFERED=1 python3 bench/gpu/torch_baseline.py /tmp 2>&1 | tee "$out/torch_baseline.log" || rc=1
fi
exit $rc
