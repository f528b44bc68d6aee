#!/bin/bash
# Kernel run: gpu_tests (SmallBatch + all), gpu_bench --stages, one ncu profile of the one-launch kernel.
set -o pipefail
B=/tmp/gpubin; mkdir -p $B; tar xJf .gpubin/gpubin.tar.xz -C $B; export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/device.txt
[ -s /tmp/d/base.fvecs ] || { (. bench/gpu/data.sh; make_data /tmp/d 1000000) > /tmp/data.log 2>&1 & }
timeout 240 $B/gpu_tests ${TESTS:+--gtest_filter=$TESTS} > $OUT/gpu_tests.log 2>&1; trc=$?; echo "tests rc=$trc"
grep -E "FAILED|PASSED|SKIPPED \]" $OUT/gpu_tests.log | head -20; grep -B3 -A12 "Failure" $OUT/gpu_tests.log | head -40
wait
timeout 300 $B/gpu_bench --base /tmp/d/base.fvecs --queries /tmp/d/queries.fvecs --stages > $OUT/gpu_bench_stages.log 2>&1; echo "bench rc=$?"
grep -v "^$" $OUT/gpu_bench_stages.log | sed -n '/one launch (small/,$p' | head -60
if [ "${PROFILE:-0}" = 1 ]; then
  NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
  echo "ncu: $NCU"
  if [ -n "$NCU" ]; then
    timeout 200 $NCU --set full --import-source yes -k regex:small_search -s 3 -c 1 -o /tmp/prof $B/gpu_bench --base /tmp/d/base.fvecs --queries /tmp/d/queries.fvecs --stages > /tmp/ncu.log 2>&1; echo "ncu rc=$?"; tail -3 /tmp/ncu.log
    $NCU -i /tmp/prof.ncu-rep --page details > $OUT/ncu_details.txt 2>&1
    $NCU -i /tmp/prof.ncu-rep --page source --csv --print-source cuda > /tmp/source.csv 2>&1
    gzip -c /tmp/source.csv > $OUT/ncu_source.csv.gz; ls -la $OUT
  fi
fi
exit ${trc:-1}
