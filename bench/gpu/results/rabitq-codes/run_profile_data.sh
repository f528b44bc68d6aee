#!/bin/bash
# ncu of the RaBitQ list blocks (rabitq_pairs_kernel; the committed files
# also profiled groups of 4, a variant since dropped) over
# tools/gen_synthetic's 200k x 768 set and its k-means
# lists: gpu_bench --rabitq-data --profile B at B = 1000 and 16, each call
# three times; the details page and the SASS with its counters, to $OUT.
B=/tmp/gpubin; mkdir -p $B && tar xJf .gpubin/gpubin.tar.xz -C $B; export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
. bench/gpu/data.sh; DIM=768 make_data /tmp/d768 200000 || exit 1
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for b in 1000 16; do
  timeout 200 $NCU --kernel-name regex:rabitq_pairs --launch-count 6 --set full -o /tmp/prof$b -f \
    $B/gpu_bench --rabitq-data --base /tmp/d768/base.fvecs --queries /tmp/d768/queries.fvecs --lists 1024 --profile $b > $OUT/ncu-run-$b.log 2>&1
  echo "ncu $b rc=$?"
  $NCU -i /tmp/prof$b.ncu-rep --page details --csv > $OUT/ncu-details-$b.csv 2>&1
  $NCU -i /tmp/prof$b.ncu-rep --page source --csv --print-source sass 2>&1 | xz -T4 > $OUT/ncu-sass-$b.csv.xz
done
ls -la $OUT
