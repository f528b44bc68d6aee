#!/bin/bash
# The direct path at sentence-embedding size on the GPU machine (PostgreSQL
# kit in .device, kernels from build-gpu): 200k x 768 (tools/gen_synthetic),
# lists 1024, m 96, probes 32, the k-NN statement beside its same-shape
# ceiling (bench/gpu/direct_path.sh). BUILDS=1 first runs the 1M x 128 build
# benchmark once with a RaBitQ build beside it (bench/gpu/build_bench.sh,
# build-bench.txt) on the same server.
set -uo pipefail
. bench/gpu/device_build.sh
if [ "${BUILDS:-0}" = 1 ]; then
  N=1000000 WIDE_N=0 REPEAT=1 SERIAL=0 RABITQ_BITS=${RABITQ_BITS:-4} DATA=/tmp/d timeout ${BUILD_TIMEOUT:-240} bash bench/gpu/build_bench.sh
  echo "build_bench rc=$?"
fi
DIM=768 LISTS=1024 DATA=/tmp/d768 PROBES=${PROBES:-32} SECS=${SECS:-5} CHURN_SECS=${CHURN_SECS:-5} LANES=0 IN_FLIGHT=0 POLL_AB=0 \
  timeout ${SQL_TIMEOUT:-330} bash bench/gpu/direct_path.sh 96 200000
echo "direct_path rc=$?"
grep -E "gpu_ivfpq|PANIC|FATAL|terminat" /tmp/pgkit-server.log | tail -40 > $OUT/server-log.txt
