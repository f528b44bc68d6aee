#!/bin/bash
# The one-launch kernel's variants table (gpu_bench --small-ab) at NPROBES (default "80 32").
# DIM=768 ROWS=200000 BENCH_ARGS="--m 96 --lists 1024": another data set and index shape;
# STAGES=1 adds the new build's --stages table (its phase trace) at each nprobe.
set -o pipefail
B=/tmp/gpubin; mkdir -p $B; tar xJf .gpubin/gpubin.tar.xz -C $B; export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/device.txt
DIM=${DIM:-128}; D=/tmp/d; [ "$DIM" = 128 ] || D=/tmp/d$DIM
[ -s $D/base.fvecs ] || { (export DIM; . bench/gpu/data.sh; make_data $D ${ROWS:-1000000}) > /tmp/data.log 2>&1; }
if [ -n "$TESTS" ]; then
  timeout 240 $B/gpu_tests --gtest_filter=$TESTS > $OUT/gpu_tests.log 2>&1; echo "tests rc=$?"
  grep -E "FAILED|PASSED|SKIPPED \]" $OUT/gpu_tests.log | head -20; grep -B3 -A12 "Failure" $OUT/gpu_tests.log | head -40
fi
# Each .gpubin2/gpu_bench_NAME.xz (NAME: old, the kernel before a change, or
# a variant) runs the same table before the current build ("new").
VARS=""
for f in .gpubin2/gpu_bench_*.xz; do [ -s "$f" ] || continue
  v=$(basename $f .xz); v=${v#gpu_bench_}; xz -dc $f > $B/gpu_bench_$v; chmod +x $B/gpu_bench_$v; VARS="$VARS $v"
done
for np in ${NPROBES:-80 32}; do
  for v in $VARS new; do bin=$B/gpu_bench; [ $v = new ] || bin=$B/gpu_bench_$v
    timeout 200 $bin --base $D/base.fvecs --queries $D/queries.fvecs --nprobe $np $BENCH_ARGS --small-ab > $OUT/ab$np-$v.log 2>&1; echo "ab $np $v rc=$?"
    grep -v "^$" $OUT/ab$np-$v.log | sed -n '/^## one launch/,$p'
  done
  if [ -n "$STAGES" ]; then
    timeout 200 $B/gpu_bench --base $D/base.fvecs --queries $D/queries.fvecs --nprobe $np $BENCH_ARGS --stages > $OUT/stages$np.log 2>&1; echo "stages $np rc=$?"
    grep -v "^$" $OUT/stages$np.log | sed -n '/^## /,$p' | head -60
  fi
done
# NCU_BATCHES: each kernel's duration at those batches (ncu, basic set).
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for b in $NCU_BATCHES; do
  timeout 120 $NCU --clock-control none --section SpeedOfLight --section LaunchStats -k regex:"small_search_kernel|coarse_keys_kernel" -s 40 -c 4 \
    $B/gpu_bench --base $D/base.fvecs --queries $D/queries.fvecs --nprobe ${NCU_NPROBE:-80} $BENCH_ARGS --profile $b > $OUT/ncu_basic$b.txt 2>&1
  echo "ncu batch $b rc=$?"; grep -E "small_search_kernel|coarse_keys_kernel|Duration|Grid Size" $OUT/ncu_basic$b.txt | head -16
done
