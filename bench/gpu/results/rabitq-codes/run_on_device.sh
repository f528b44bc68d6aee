#!/bin/bash
# codes = rabitq beside codes = pq at 1M x 128 on the GPU machine (PostgreSQL kit in .device,
# kernels from build-gpu).
set -uo pipefail
. bench/gpu/device_build.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/device.txt; nproc >> $OUT/device.txt
DATA=/tmp/d SECS=${SECS:-6} timeout ${SQL_TIMEOUT:-540} bash bench/gpu/rabitq_codes.sh
echo "rabitq_codes rc=$?"
grep -E "gpu_ivfpq|PANIC|FATAL|terminat" /tmp/pgkit-server.log | tail -20 > $OUT/server-log.txt
