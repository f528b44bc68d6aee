#!/bin/bash
# Each kernel's time in the staged RaBitQ search of small batches (ncu,
# gpu__time_duration only), 200k x 768 in 1024 k-means lists, 4 bits, nprobe
# 32, k 100 by lower bounds: gpu_bench --rabitq-data --profile B (three
# calls of B queries) for B in BATCHES (default "1 32"). Carries .gpubin.
set -uo pipefail
B=/tmp/gpubin
mkdir -p $B && tar xJf .gpubin/gpubin.tar.xz -C $B || exit 1
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
. bench/gpu/data.sh
DIM=768 make_data /tmp/d768 200000 || exit 1
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for b in ${BATCHES:-1 32}; do
  timeout 200 $NCU --metrics gpu__time_duration.sum --csv $B/gpu_bench --rabitq-data --base /tmp/d768/base.fvecs \
    --queries /tmp/d768/queries.fvecs --lists 1024 --profile $b > $OUT/ncu-kernel-times-768-b$b.csv 2>&1
  echo "ncu batch $b rc=$?"
done
