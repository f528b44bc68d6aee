#!/bin/bash
# The direct path's SQL benchmark on the GPU machine (PostgreSQL kit in .device, kernels from build-gpu).
set -uo pipefail
. bench/gpu/device_build.sh
# DIM=768 N=200000 LISTS=1024 M=96: the sentence-embedding shape (its own data folder).
DIM=${DIM:-128}; export DIM
D=/tmp/d; [ "$DIM" = 128 ] || D=/tmp/d$DIM
DATA=$D PROBES=${PROBES:-64} SECS=${SECS:-6} CHURN_SECS=${CHURN_SECS:-12} timeout ${SQL_TIMEOUT:-420} bash bench/gpu/direct_path.sh ${M:-32} ${N:-1000000}
echo "direct_path rc=$?"
grep -E "gpu_ivfpq|PANIC|FATAL|terminat" /tmp/pgkit-server.log | tail -40 > $OUT/server-log.txt
