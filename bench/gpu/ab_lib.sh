# Sourced by the A/B scripts of bench/gpu/results (run on the GPU machine
# from the repository root): the carried binaries and their variants.
#
# ab_setup: unpacks .gpubin (gpu_tests, gpu_bench of the current build and
# their libraries) into B=/tmp/gpubin, writes the GPU to $OUT/device.txt,
# and unpacks each .gpubin2/gpu_bench_NAME.xz (NAME: old, the build before a
# change, or a variant) as $B/gpu_bench_NAME; VARS lists the NAMEs.
ab_setup() {
  B=/tmp/gpubin
  mkdir -p $B
  tar xJf .gpubin/gpubin.tar.xz -C $B
  export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/device.txt
  VARS=""
  local f v
  for f in .gpubin2/gpu_bench_*.xz; do [ -s "$f" ] || continue
    v=$(basename $f .xz); v=${v#gpu_bench_}; xz -dc $f > $B/gpu_bench_$v; chmod +x $B/gpu_bench_$v; VARS="$VARS $v"
  done
}

# ab_tests FILTER SECONDS: the current build's gpu_tests matching FILTER into
# $OUT/gpu_tests.log; prints the summary and the first failures.
ab_tests() {
  timeout "$2" $B/gpu_tests --gtest_filter="$1" > $OUT/gpu_tests.log 2>&1; echo "tests rc=$?"
  grep -E "FAILED|PASSED|SKIPPED \]" $OUT/gpu_tests.log | head -20; grep -B3 -A12 "Failure" $OUT/gpu_tests.log | head -40
}

# ab_bin NAME: the gpu_bench of variant NAME (new: the current build).
ab_bin() { if [ "$1" = new ]; then echo $B/gpu_bench; else echo $B/gpu_bench_$1; fi; }
