#!/bin/bash
# codes = rabitq beside codes = pq on the GPU machine (PostgreSQL kit in .device, kernels from
# build-gpu): WHAT=128 (1M x 128, lists 4096, m 32), WHAT=768 (200k x 768, lists 1024, m 96) or
# WHAT=fashion.
set -uo pipefail
# WHAT=fashion: Fashion-MNIST (60k x 784, lists 256, PQ m 16), its Debian package
# (dataset-fashion-mnist) carried in .devfm.
if [ "${WHAT:-128}" = fashion ] && [ ! -e /usr/share/datasets/fashion-mnist ]; then
  fm=$(mktemp -d) && dpkg-deb -x .devfm/*.deb "$fm" && mkdir -p /usr/share/datasets &&
    ln -s "$fm/usr/share/datasets/fashion-mnist" /usr/share/datasets/fashion-mnist || exit 1
fi
. bench/gpu/device_build.sh
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > $OUT/device.txt; nproc >> $OUT/device.txt
if [ "${WHAT:-128}" = fashion ]; then
  DATASET=fashion-mnist N=60000 DIM=784 LISTS=256 M=16 BITS=${BITS:-4} DATA=/tmp/fm SECS=${SECS:-6} timeout ${SQL_TIMEOUT:-540} bash bench/gpu/rabitq_codes.sh
elif [ "${WHAT:-128}" = 768 ]; then
  N=200000 DIM=768 LISTS=1024 M=96 BITS=${BITS:-"2 4"} DATA=/tmp/d768 SECS=${SECS:-6} timeout ${SQL_TIMEOUT:-540} bash bench/gpu/rabitq_codes.sh
else
  DATA=/tmp/d SECS=${SECS:-6} timeout ${SQL_TIMEOUT:-540} bash bench/gpu/rabitq_codes.sh
fi
echo "rabitq_codes rc=$?"
grep -E "gpu_ivfpq|PANIC|FATAL|terminat" /tmp/pgkit-server.log | tail -20 > $OUT/server-log.txt
