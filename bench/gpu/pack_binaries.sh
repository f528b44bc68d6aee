#!/usr/bin/env bash
# Packs the built GPU test and benchmark binaries (stripped) plus the
# OpenBLAS runtime they link into .gpubin/gpubin.tar.xz for the device run.
# Usage (repository root, after building build-gpu): bash bench/gpu/pack_binaries.sh
set -euo pipefail
tmp=$(mktemp -d)
cp build-gpu/gpu/gpu_tests build-gpu/gpu/gpu_bench "$tmp/"
strip "$tmp/gpu_tests" "$tmp/gpu_bench"
for lib in $(ldd build-gpu/gpu/gpu_tests | awk '/openblas|gfortran|quadmath/ {print $3}'); do
    cp -L "$lib" "$tmp/"
done
mkdir -p .gpubin
tar cf - -C "$tmp" . | xz -T2 -6 > .gpubin/gpubin.tar.xz
rm -rf "$tmp"
ls -la .gpubin/gpubin.tar.xz
