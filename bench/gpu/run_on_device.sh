#!/usr/bin/env bash
# Runs the GPU tests, the benchmark and the torch baseline on the device
# machine from binaries built on the build machine and carried compressed in
# .gpubin/gpubin.tar.xz (the device has no GoogleTest or OpenBLAS). The
# benchmark's data is tools/gen_synthetic's set (seed 42, the SQL and CPU
# benchmarks' vectors), built and written here (bench/gpu/data.sh).
# Logs go to $OUT (the device tool's folder) or bench/gpu/out.
# Usage (repository root): bash bench/gpu/run_on_device.sh [tests|bench|all] [gtest filter]
#   ROWS=1000000  base vectors; QUICK=1: 100000 rows and gpu_bench --quick
set -uo pipefail
what=${1:-all}
filter=${2:-*}
out=${OUT:-bench/gpu/out}
bin=/tmp/gpubin
quick=${QUICK:-0}
rows=${ROWS:-$([ "$quick" = 1 ] && echo 100000 || echo 1000000)}
mkdir -p "$out" "$bin"
tar xJf .gpubin/gpubin.tar.xz -C "$bin"
export LD_LIBRARY_PATH=$bin:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/device.txt"
rc=0
if [[ $what == tests || $what == all ]]; then
    timeout 240 "$bin/gpu_tests" --gtest_filter="$filter" 2>&1 | tee "$out/gpu_tests.log" || rc=1
fi
if [[ $what == bench || $what == all ]]; then
    . bench/gpu/data.sh
    data=/tmp/gpu_ivfpq-synthetic-$rows
    make_data "$data" "$rows" || exit 1
    timeout 300 "$bin/gpu_bench" --base "$data/base.fvecs" --queries "$data/queries.fvecs" \
        $([ "$quick" = 1 ] && echo --quick) 2>&1 | tee "$out/gpu_bench.log" || rc=1
    PYTHONUNBUFFERED=1 timeout 120 python3 bench/gpu/torch_baseline.py "$data/base.fvecs" "$data/queries.fvecs" 2>&1 |
        tee "$out/torch_baseline.log" || rc=1
fi
exit $rc
