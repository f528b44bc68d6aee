#!/usr/bin/env bash
# Wide PQ codes at d = 768 (sentence-embedding size) on the GPU machine:
# tools/gen_synthetic's set (seed 42) with --dim 768, N base rows and NQ
# queries in $DATA (kept between runs), then gpu/bench/wide_bench (PQ m 32..128
# at 8 bits, exact re-rank on the GPU, recall@10 against the GPU's exact
# top 10), its tables written to $OUT/wide-bench-768.txt.
#
# Usage (repository root): bash bench/gpu/wide_bench.sh [wide_bench options: --quick, --lists L]
#   N=200000 NQ=2000           base rows, queries
#   WIDE_BENCH=PATH            the binary (default build-gpu/gpu/wide_bench); one built
#                              elsewhere and carried in works too: the libraries it
#                              needs beyond CUDA (OpenBLAS, libgfortran, libquadmath)
#                              are looked for beside it, in /tmp/gpubin and the system.
#   DATA=/tmp/gpu_ivfpq-wide-768   data folder; OUT=/tmp   result folder
set -euo pipefail
# Paths given relative to the caller's folder, made absolute before moving to the root.
abs() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
N=${N:-200000}
NQ=${NQ:-2000}
DATA=$(abs "${DATA:-/tmp/gpu_ivfpq-wide-768}")
OUT=$(abs "${OUT:-/tmp}")
[ -n "${WIDE_BENCH:-}" ] && WIDE_BENCH=$(abs "$WIDE_BENCH")
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
WIDE_BENCH=${WIDE_BENCH:-$PWD/build-gpu/gpu/wide_bench}
RES=$OUT/wide-bench-768.txt

if [ ! -x "$WIDE_BENCH" ]; then
  echo "wide_bench.sh: no executable $WIDE_BENCH (build it: cmake --build build-gpu --target wide_bench," \
       "or set WIDE_BENCH to a carried-in binary)" >&2
  exit 1
fi
bin_dir=$(cd "$(dirname "$WIDE_BENCH")" && pwd)
export LD_LIBRARY_PATH=$bin_dir:/tmp/gpubin:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if ldd "$WIDE_BENCH" 2>/dev/null | grep -q "not found"; then
  echo "wide_bench.sh: $WIDE_BENCH misses libraries (copy them beside it):" >&2
  ldd "$WIDE_BENCH" | grep "not found" >&2
  exit 1
fi

# The generator, built (or found) as bench/gpu/data.sh does.
. bench/gpu/data.sh
build_gen_synthetic || exit 1

# Files named by their size, so that another N or NQ never reuses them; each
# written under a temporary name first, so that an interrupted run leaves none.
mkdir -p "$DATA" "$OUT"
base=$DATA/base-$N.fvecs
queries=$DATA/queries-$NQ.fvecs
if [ ! -s "$base" ]; then
  "$GEN" --what base --rows "$N" --dim 768 --format fvecs --threads "$(nproc)" --out "$base.tmp"
  mv "$base.tmp" "$base"
fi
if [ ! -s "$queries" ]; then
  "$GEN" --what queries --queries "$NQ" --dim 768 --format fvecs --out "$queries.tmp"
  mv "$queries.tmp" "$queries"
fi

{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null || true
  echo
} | tee "$RES"
"$WIDE_BENCH" --base "$base" --queries "$queries" "$@" 2>&1 | tee -a "$RES"
echo "results: $RES"
