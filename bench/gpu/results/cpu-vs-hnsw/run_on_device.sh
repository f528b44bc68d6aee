#!/bin/bash
# The CPU engine beside pgvector HNSW at 1M x 128 on the GPU machine's host (PostgreSQL kit and
# pgvector's source in .device, kernels from build-gpu for the index build).
set -uo pipefail
. bench/gpu/device_build.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/device.txt; nproc >> $OUT/device.txt
rm -rf /tmp/pgvector && mkdir -p /tmp/pgvector && tar xzf .device/pgvector-0.8.6.tar.gz -C /tmp/pgvector --strip-components=1
( cd /tmp/pgvector && make -s -j"$(nproc)" PG_CONFIG=$PG_CONFIG with_llvm=no && make -s install PG_CONFIG=$PG_CONFIG with_llvm=no ) > /tmp/pgvector-build.log 2>&1 ||
  { tail -20 /tmp/pgvector-build.log; exit 1; }
DATA=/tmp/d SECS=${SECS:-8} timeout ${SQL_TIMEOUT:-520} bash bench/gpu/cpu_vs_hnsw.sh
echo "cpu_vs_hnsw rc=$?"
grep -E "gpu_ivfpq|PANIC|FATAL|terminat" /tmp/pgkit-server.log | tail -20 > $OUT/server-log.txt
