#!/bin/bash
# The direct path's SQL benchmark on the GPU machine (PostgreSQL kit in .device, kernels from build-gpu).
set -uo pipefail
. bench/gpu/device_build.sh
DATA=/tmp/d PROBES=${PROBES:-64} SECS=${SECS:-6} CHURN_SECS=${CHURN_SECS:-12} timeout ${SQL_TIMEOUT:-420} bash bench/gpu/direct_path.sh 32
echo "direct_path rc=$?"
grep -E "gpu_ivfpq|PANIC|FATAL|terminat" /tmp/pgkit-server.log | tail -40 > $OUT/server-log.txt
