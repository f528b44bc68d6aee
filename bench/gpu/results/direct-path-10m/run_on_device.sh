#!/bin/bash
# The direct path at 10M x 128 (lists 16384) on the GPU machine (PostgreSQL kit in .device, kernels from build-gpu):
# probes chosen for recall@10 >= 0.95, then 1/64/128 clients against the same-shape ceiling and the churn rows.
set -uo pipefail
. bench/gpu/device_build.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/device.txt; nproc >> $OUT/device.txt
# A 10M load and build write ~11 GB of WAL: checkpoints by WAL volume would dominate otherwise.
psql -qc "ALTER SYSTEM SET max_wal_size = '32GB'" -c "ALTER SYSTEM SET checkpoint_timeout = '30min'"
t0=$(date +%s)
DATA=/tmp/d10 LISTS=16384 PROBES=${PROBES:-auto} POLL_AB=0 LANES=0 IN_FLIGHT=0 SECS=${SECS:-5} CHURN_SECS=${CHURN_SECS:-8} \
  timeout ${SQL_TIMEOUT:-530} bash bench/gpu/direct_path.sh 32 10000000
echo "direct_path rc=$? after $(( $(date +%s) - t0 )) s"
grep -E "gpu_ivfpq|PANIC|FATAL|terminat|checkpoint" /tmp/pgkit-server.log | tail -40 > $OUT/server-log.txt
