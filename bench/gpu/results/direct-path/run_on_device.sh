#!/bin/bash
# The direct path's SQL benchmark on the GPU machine (PostgreSQL kit in .device, kernels from build-gpu).
set -uo pipefail
bash .device/pg-up.sh > /tmp/pgup.log 2>&1 || { cat /tmp/pgup.log; exit 1; }
. /opt/pg/env.sh
GPU_LIB=$PWD/build-gpu/gpu/libgpu_ivfpq_gpu.a
t0=$(date +%s)
( make -s -j16 PG_CONFIG=$PG_CONFIG GPU_IVFPQ_CUDA_LIB=$GPU_LIB && make -s install PG_CONFIG=$PG_CONFIG GPU_IVFPQ_CUDA_LIB=$GPU_LIB ) > /tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
echo "extension built in $(( $(date +%s) - t0 )) s"
DATA=/tmp/d PROBES=${PROBES:-64} SECS=${SECS:-6} CHURN_SECS=${CHURN_SECS:-12} timeout ${SQL_TIMEOUT:-420} bash bench/gpu/direct_path.sh 32
echo "direct_path rc=$?"
grep -E "gpu_ivfpq|PANIC|FATAL|terminat" /tmp/pgkit-server.log | tail -40 > $OUT/server-log.txt
