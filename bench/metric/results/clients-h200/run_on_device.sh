#!/bin/bash
# gpu_metric scans by many clients on the GPU machine (bench/metric/sql_clients.sh
# over wspanish's words, carried as .device/spanish.txt): through the direct
# path (this tree), then, in the same run, through the service's relay (the
# tree before gpu_metric searches took the direct path: this tree's src/ with
# .device/metric-direct.patch reversed, rebuilt and installed).
set -uo pipefail
. bench/gpu/device_build.sh
ROOT=$PWD
W=$ROOT/.device/spanish.txt
mkdir -p /tmp/r1 /tmp/r2
WORDS=$W OUT=/tmp/r1 timeout 200 bash bench/metric/sql_clients.sh > /tmp/r1.log 2>&1
echo "direct rc=$?"; tail -3 /tmp/r1.log
cp /tmp/r1/metric-clients.txt $OUT/metric-clients-direct.txt
if [ -f .device/metric-direct.patch ]; then
  rm -rf /tmp/old && cp -a "$ROOT" /tmp/old && cd /tmp/old && patch -s -R -p1 < .device/metric-direct.patch && make -s clean >/dev/null 2>&1
  ( make -s -j"$(nproc)" PG_CONFIG=$PG_CONFIG GPU_IVFPQ_CUDA_LIB=$GPU_LIB &&
    make -s install PG_CONFIG=$PG_CONFIG GPU_IVFPQ_CUDA_LIB=$GPU_LIB ) > /tmp/build-old.log 2>&1 || { tail -30 /tmp/build-old.log; exit 1; }
  as_pg pg_ctl -D "$PGDATA" -l /tmp/pgkit-server.log -w restart >/dev/null
  WORDS=$W OUT=/tmp/r2 timeout 200 bash bench/metric/sql_clients.sh > /tmp/r2.log 2>&1
  echo "relay rc=$?"; tail -3 /tmp/r2.log
  cp /tmp/r2/metric-clients.txt $OUT/metric-clients-relay.txt
fi
grep -E "gpu_ivfpq|PANIC|FATAL|terminat" /tmp/pgkit-server.log | tail -20 > $OUT/server-log.txt
