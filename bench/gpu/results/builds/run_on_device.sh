#!/bin/bash
# CREATE INDEX phase by phase on the GPU machine (PostgreSQL kit in .device, kernels from build-gpu).
set -uo pipefail
. bench/gpu/device_build.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/device.txt; nproc >> $OUT/device.txt; echo "transparent huge pages: $(cat /sys/kernel/mm/transparent_hugepage/enabled) / defrag $(cat /sys/kernel/mm/transparent_hugepage/defrag)" >> $OUT/device.txt
DATA=/tmp/d timeout ${SQL_TIMEOUT:-500} bash bench/gpu/build_bench.sh
echo "build_bench rc=$?"
grep -E "gpu_ivfpq|PANIC|FATAL|terminat" /tmp/pgkit-server.log | tail -40 > $OUT/server-log.txt
