#!/bin/bash
# Kernel profile run: every GPU test, then ncu on the one-launch kernel at
# the batches given (BATCHES, default "16 1"), nprobe NPROBE (default 80).
set -o pipefail
B=/tmp/gpubin; mkdir -p $B; tar xJf .gpubin/gpubin.tar.xz -C $B; export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/device.txt
[ -s /tmp/d/base.fvecs ] || { (. bench/gpu/data.sh; make_data /tmp/d 1000000) > /tmp/data.log 2>&1 & }
if [ "${TESTS:-all}" != none ]; then
  timeout 240 $B/gpu_tests ${TESTS:+--gtest_filter=$TESTS} > $OUT/gpu_tests.log 2>&1; echo "tests rc=$?"
  grep -E "FAILED|PASSED|SKIPPED \]" $OUT/gpu_tests.log | head -20; grep -B3 -A12 "Failure" $OUT/gpu_tests.log | head -40
fi
wait
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU"
for b in ${BATCHES:-16 1}; do
  timeout 200 $NCU --clock-control none --set full --import-source yes -k regex:small_search_kernel -s 20 -c 1 \
    -o /tmp/prof$b $B/gpu_bench --base /tmp/d/base.fvecs --queries /tmp/d/queries.fvecs --nprobe ${NPROBE:-80} \
    --profile $b > $OUT/ncu_run$b.log 2>&1; echo "ncu batch $b rc=$?"; tail -2 $OUT/ncu_run$b.log
  $NCU -i /tmp/prof$b.ncu-rep --page details > $OUT/ncu_details$b.txt 2>&1
  $NCU -i /tmp/prof$b.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip -c > $OUT/ncu_sass$b.csv.gz
  $NCU -i /tmp/prof$b.ncu-rep --page source --csv --print-source cuda 2>/dev/null | gzip -c > $OUT/ncu_cuda$b.csv.gz
done
ls -la $OUT
