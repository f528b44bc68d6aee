#!/usr/bin/env bash
# Metric range search on the GPU against the CPU engine (gpu/bench/
# metric_bench.cpp), on the GPU machine; no PostgreSQL needed.
#
#   bash bench/metric/gpu_bench.sh [TARBALL]
#
# TARBALL (default .gpucarry/metric.tar.xz) holds metric_bench (stripped),
# the OpenBLAS runtime it links and the data of gpu_bench_data.sh (*.txt.xz);
# bench/metric/gpu_bench.sh pack builds it on the build machine. Runs:
#   spanish  the wspanish dictionary (86,016 words), 40,000 queries; the
#            engine on every query, brute force on the first 5,000
#   merged   every EVERY-th (default 4th: 250,000) of the 1,000,000 words of
#            five dictionaries and seeded edits, 10,000 queries; the engine
#            on the first 2,000, brute force on 500. The whole 1M set does
#            not fit the time: the engine's List of Clusters build barely
#            scales with threads (4.4 s for the Spanish set on 16 cores, 3.7 s
#            on 2) and grows as n^2 / bucket (~1.5e10 distances at 1M: it
#            ran past 300 s on an H100 host). EVERY=1 runs it all
#            (LIMIT: seconds, default 300).
# on one GPU, and on two (the 1-stage split) when nvidia-smi lists two or
# more. Logs: $OUT/metric-spanish.log, $OUT/metric-merged.log (the markdown
# tables at their ends). About 2-3 minutes on an H100 host (16 cores).
set -euo pipefail

pack() {
  # Build machine: after cmake --build build-gpu --target metric_bench.
  local data=${DATA:-$(mktemp -d)}
  [ -f "$data/merged.txt.xz" ] || bash bench/metric/gpu_bench_data.sh "$data"
  local tmp
  tmp=$(mktemp -d)
  cp build-gpu/bench/device/metric_bench "$tmp/"
  strip "$tmp/metric_bench"
  for lib in $(ldd build-gpu/bench/device/metric_bench | awk '/openblas|gfortran|quadmath/ {print $3}'); do
    cp -L "$lib" "$tmp/"
  done
  cp "$data"/spanish.txt.xz "$data"/spanish-queries.txt.xz "$data"/merged.txt.xz "$data"/merged-queries.txt.xz "$tmp/"
  mkdir -p .gpucarry
  tar cf - -C "$tmp" . | xz -T2 -6 > .gpucarry/metric.tar.xz
  rm -rf "$tmp"
  ls -la .gpucarry/metric.tar.xz
}

if [ "${1:-}" = pack ]; then
  pack
  exit 0
fi

tarball=${1:-.gpucarry/metric.tar.xz}
out=${OUT:-/tmp}
mkdir -p "$out"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
xz -dc "$tarball" | tar xf - -C "$dir"
xz -d "$dir"/*.txt.xz
export LD_LIBRARY_PATH=$dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
use=1
[ "$gpus" -ge 2 ] && use=2
{
  echo "# $(date -u +%F' '%T) UTC, $(nproc) CPU cores, $gpus GPU(s):"
  nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/#   /' || true
} | tee "$out/metric-host.txt"

run() {
  local name=$1 limit=$2
  shift 2
  echo "== $name" >&2
  local rc=0
  timeout "$limit" "$dir/metric_bench" --name "$name" --gpus "$use" "$@" > "$out/metric-$name.log" 2>&1 || rc=$?
  echo "metric_bench $name: exit $rc" >> "$out/metric-$name.log"
  sed -n '/^## /,$p' "$out/metric-$name.log"
}
run spanish 120 --words "$dir/spanish.txt" --queries "$dir/spanish-queries.txt" --brute-queries 5000
every=${EVERY:-4}
awk -v e="$every" 'NR % e == 1 || e == 1' "$dir/merged.txt" > "$dir/merged-sub.txt"
run merged "${LIMIT:-300}" --words "$dir/merged-sub.txt" --queries "$dir/merged-queries.txt" --cpu-queries 2000 --brute-queries 500
