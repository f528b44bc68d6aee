#!/bin/bash
# The one-launch kernel's variants table (gpu_bench --small-ab) at NPROBES (default "80 32").
# DIM=768 ROWS=200000 BENCH_ARGS="--m 96 --lists 1024": another data set and index shape;
# STAGES=1 adds the new build's --stages table (its phase trace) at each nprobe.
set -o pipefail
. bench/gpu/ab_lib.sh
ab_setup
DIM=${DIM:-128}; D=/tmp/d; [ "$DIM" = 128 ] || D=/tmp/d$DIM
[ -s $D/base.fvecs ] || { (export DIM; . bench/gpu/data.sh; make_data $D ${ROWS:-1000000}) > /tmp/data.log 2>&1; }
[ -n "$TESTS" ] && ab_tests "$TESTS" 240
for np in ${NPROBES:-80 32}; do
  for v in $VARS new; do bin=$(ab_bin $v)
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
