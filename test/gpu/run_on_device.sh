#!/bin/bash
# The test suites on the GPU machine, with the extension linked to the CUDA
# kernels and the GPU service serving, through scripts/run-tests.sh:
# pg_regress (`make installcheck`, then `make installcheck-service`: the whole
# suite again on a preloaded instance whose service uses the GPU), and the
# TAP suite (`make prove_installcheck`) with GPU_IVFPQ_EXPECT_GPU=1 (005 and
# 006 then require the GPU).
#
# Run with the device tool from the repository root, carrying .device (the
# PostgreSQL kit, ../shared/device). The extension's `make` compiles the
# kernels there with nvcc; GPU_IVFPQ_CUDA_LIB names a prebuilt kernel archive
# instead (e.g. CMake's build-gpu/gpu/libgpu_ivfpq_gpu.a, carried along).
# Test/t/015 needs the word lists wspanish and wamerican: carry their .debs
# among the kit's packages.
# Logs go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-tests}
mkdir -p "$OUT"
bash .device/pg-up.sh >/tmp/pgup.log 2>&1 || { cat /tmp/pgup.log; exit 1; }
. /opt/pg/env.sh
# Word lists carried as kit packages (wspanish, wamerican: 015 reads them),
# where the machine's /usr/share/dict exists without them.
for f in "${PGKIT_ROOT:-/opt/pg}"/usr/share/dict/*; do
  [ -e "$f" ] || continue
  mkdir -p /usr/share/dict
  [ -e "/usr/share/dict/$(basename "$f")" ] || ln -s "$f" /usr/share/dict/
done
# TAP tests drive psql and pgbench through IPC::Run.
dpkg -x "$(ls .device/libipc-run-perl_*.deb .device/debs/libipc-run-perl_*.deb 2>/dev/null | head -1)" /
# The kit's server package has no LLVM: every test instance runs with jit = off.
echo "jit = off" >/tmp/gpu_ivfpq-jit-off.conf
chmod a+r /tmp/gpu_ivfpq-jit-off.conf
export TEMP_CONFIG=/tmp/gpu_ivfpq-jit-off.conf
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/device.txt"
# One TAP file at a time (TAP_JOBS=1): every file's clusters share the one
# GPU, and -v's output stays in order.
GPU_IVFPQ_EXPECT_GPU=1 SKIP_DEPS=1 GPU_IVFPQ_CUDA_LIB="${GPU_IVFPQ_CUDA_LIB:-}" TAP_JOBS="${TAP_JOBS:-1}" \
  PROVE_FLAGS=-v bash scripts/run-tests.sh --only "${SUITES:-regress,tap}" --keep 2>&1 | tee "$OUT/run-tests.log"
rc=${PIPESTATUS[0]}
work=$(ls -dt /tmp/gpu_ivfpq-tests.* | head -1)
cp "$work"/logs/*.log "$OUT"/ 2>/dev/null
# pg_regress's diffs, when a suite failed (named by the suite's folder).
find "$work" -name regression.diffs -exec sh -c 'cp "$1" "$2/$(basename "$(dirname "$1")")-regression.diffs"' _ {} "$OUT" \; 2>/dev/null
exit "$rc"
