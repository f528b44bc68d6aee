#!/bin/bash
# The one-launch kernel's variants table (gpu_bench --small-ab) at NPROBES (default "80 32").
set -o pipefail
B=/tmp/gpubin; mkdir -p $B; tar xJf .gpubin/gpubin.tar.xz -C $B; export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/device.txt
[ -s /tmp/d/base.fvecs ] || { (. bench/gpu/data.sh; make_data /tmp/d 1000000) > /tmp/data.log 2>&1; }
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
    timeout 200 $bin --base /tmp/d/base.fvecs --queries /tmp/d/queries.fvecs --nprobe $np --small-ab > $OUT/ab$np-$v.log 2>&1; echo "ab $np $v rc=$?"
    grep -v "^$" $OUT/ab$np-$v.log | sed -n '/^## one launch/,$p'
  done
done
# NCU_BATCHES: each kernel's duration at those batches (ncu, basic set).
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
for b in $NCU_BATCHES; do
  timeout 120 $NCU --clock-control none --section SpeedOfLight --section LaunchStats -k regex:"small_search_kernel|coarse_keys_kernel" -s 40 -c 4 \
    $B/gpu_bench --base /tmp/d/base.fvecs --queries /tmp/d/queries.fvecs --nprobe ${NCU_NPROBE:-80} --profile $b > $OUT/ncu_basic$b.txt 2>&1
  echo "ncu batch $b rc=$?"; grep -E "small_search_kernel|coarse_keys_kernel|Duration|Grid Size" $OUT/ncu_basic$b.txt | head -16
done
