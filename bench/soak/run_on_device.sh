#!/bin/bash
# The soak (bench/soak/soak.sh) on the GPU machine: builds the extension and
# its GPU process with the CUDA kernels, preloads it in the PostgreSQL kit's
# server (.device, see CONTRIBUTING.md), and runs the soak with the GPU
# serving; the report and the server log's gpu_ivfpq lines go to $OUT.
#
#   GPU_IVFPQ_CUDA_LIB=path/to/libgpu_ivfpq_gpu.a SOAK_SECONDS=480 bash bench/soak/run_on_device.sh
set -uo pipefail
OUT=${OUT:-/tmp/soak-out}
mkdir -p "$OUT"
GPU_LIB=${GPU_IVFPQ_CUDA_LIB:-$PWD/build-gpu/gpu/libgpu_ivfpq_gpu.a}
bash .device/pg-up.sh >/tmp/pgup.log 2>&1 || { cat /tmp/pgup.log; exit 1; }
. /opt/pg/env.sh
make -s -j"$(nproc)" PG_CONFIG="$PG_CONFIG" GPU_IVFPQ_CUDA_LIB="$GPU_LIB" >/tmp/soak-build.log 2>&1 &&
  make -s install PG_CONFIG="$PG_CONFIG" GPU_IVFPQ_CUDA_LIB="$GPU_LIB" >>/tmp/soak-build.log 2>&1 ||
  { tail -30 /tmp/soak-build.log; exit 1; }
cat >>"$PGDATA/postgresql.conf" <<CONF
shared_preload_libraries = 'gpu_ivfpq'
max_connections = 200
shared_buffers = 4GB
jit = off
CONF
as_pg pg_ctl -D "$PGDATA" -l /tmp/pgkit-server.log -w restart >/dev/null || { tail -20 /tmp/pgkit-server.log; exit 1; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
SOAK_OUT="$OUT" bash bench/soak/soak.sh
rc=$?
grep -E "gpu_ivfpq|crash|terminat|reinitializ|PANIC|FATAL" /tmp/pgkit-server.log | tail -200 >"$OUT/server-log.txt"
exit $rc
