B=/tmp/gpubin; mkdir -p $B && tar xJf .gpubin/gpubin.tar.xz -C $B; export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
. bench/gpu/data.sh; DIM=768 make_data /tmp/d768 200000 || exit 1
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for b in 1000 16; do
  timeout 200 $NCU --kernel-name regex:rabitq_pairs --launch-count 6 --set full -o /tmp/prof$b -f \
    $B/gpu_bench --rabitq-data --base /tmp/d768/base.fvecs --queries /tmp/d768/queries.fvecs --lists 1024 --profile $b > $OUT/ncu-run-$b.log 2>&1
  echo "ncu $b rc=$?"
  $NCU -i /tmp/prof$b.ncu-rep --page details --csv > $OUT/ncu-details-$b.csv 2>&1
  $NCU -i /tmp/prof$b.ncu-rep --page source --csv --print-source sass --launch-skip 0 --launch-count 1 > $OUT/ncu-sass-g1-$b.csv 2>&1
  $NCU -i /tmp/prof$b.ncu-rep --page source --csv --print-source sass --launch-skip 3 --launch-count 1 > $OUT/ncu-sass-g4-$b.csv 2>&1
done
ls -la $OUT
