#!/bin/bash
# The batch re-rank by bounds in groups of queries, from SQL on the GPU
# machine in one call: 200k x 768 (PQ m 96 + copies beside RaBitQ 4 bits),
# then Fashion-MNIST (PQ m 16 beside RaBitQ 4 bits), as
# bench/gpu/results/rabitq-codes/run_on_device.sh runs them. Carries .device
# (the PostgreSQL kit), .devfm (the Fashion-MNIST package) and .gpubin2
# (the kernels' library).
# GPU_PROBES_768 and GPU_PROBES_FM (lists of probes) sweep the GPU rows.
set -uo pipefail
mkdir -p build-gpu/gpu && xz -dc .gpubin2/libgpu_ivfpq_gpu.a.xz > build-gpu/gpu/libgpu_ivfpq_gpu.a || exit 1
WHAT=768 PQ=1 BITS=4 SECS=3 GPU_PROBES=${GPU_PROBES_768:-32} PROBES="" RERANKS=100 SQL_TIMEOUT=${SQL_TIMEOUT_768:-380} \
  bash bench/gpu/results/rabitq-codes/run_on_device.sh
fm=$(mktemp -d) && dpkg-deb -x .devfm/*.deb "$fm" && mkdir -p /usr/share/datasets &&
  ln -sfn "$fm/usr/share/datasets/fashion-mnist" /usr/share/datasets/fashion-mnist || exit 1
PQ=1 GPU_PROBES=${GPU_PROBES_FM:-10} PROBES="" RERANKS=100 DATASET=fashion-mnist N=60000 DIM=784 LISTS=256 M=16 BITS=4 DATA=/tmp/fm \
  SECS=3 timeout ${SQL_TIMEOUT_FM:-170} bash bench/gpu/rabitq_codes.sh
echo "fashion rc=$?"
