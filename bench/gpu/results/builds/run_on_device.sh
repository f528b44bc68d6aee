#!/bin/bash
# CREATE INDEX phase by phase on the GPU machine (PostgreSQL kit in .device, kernels from build-gpu).
set -uo pipefail
bash .device/pg-up.sh > /tmp/pgup.log 2>&1 || { cat /tmp/pgup.log; exit 1; }
. /opt/pg/env.sh
GPU_LIB=$PWD/build-gpu/gpu/libgpu_ivfpq_gpu.a
t0=$(date +%s)
( make -s -j16 PG_CONFIG=$PG_CONFIG GPU_IVFPQ_CUDA_LIB=$GPU_LIB && make -s install PG_CONFIG=$PG_CONFIG GPU_IVFPQ_CUDA_LIB=$GPU_LIB ) > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "extension built in $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/device.txt; nproc >> $OUT/device.txt
DATA=/tmp/d timeout ${SQL_TIMEOUT:-500} bash bench/gpu/build_bench.sh
echo "build_bench rc=$?"
grep -E "gpu_ivfpq|PANIC|FATAL|terminat" /tmp/pgkit-server.log | tail -40 > $OUT/server-log.txt
