set -o pipefail
B=/tmp/gpubin; mkdir -p $B; tar xJf .gpubin/gpubin.tar.xz -C $B; xz -dc .gpubin2/gpu_bench_old.xz > $B/gpu_bench_old; chmod +x $B/gpu_bench_old
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $OUT/device.txt
[ -s /tmp/d/base.fvecs ] || { (. bench/gpu/data.sh; make_data /tmp/d 1000000) > /tmp/data.log 2>&1 & }
timeout 200 $B/gpu_tests --gtest_filter='SmallBatch*:SearchGraphs*:IvfPq*:PinnedHost*:Rabitq*' > $OUT/gpu_tests.log 2>&1; echo "tests rc=$?"
grep -E "FAILED|PASSED|SKIPPED \]" $OUT/gpu_tests.log | head -20; grep -B3 -A12 "Failure" $OUT/gpu_tests.log | head -45
wait
for v in old new; do bin=$B/gpu_bench; [ $v = old ] && bin=$B/gpu_bench_old
  timeout 150 $bin --base /tmp/d/base.fvecs --queries /tmp/d/queries.fvecs --stages --nprobe 80 > $OUT/stages80-$v.log 2>&1; echo "$v rc=$?"
  grep -v "^$" $OUT/stages80-$v.log | sed -n '/one launch (small/,/one-launch clusters resident/p' | head -45
done
grep -v "^$" $OUT/stages80-new.log | sed -n '/appends to the index/,$p'
