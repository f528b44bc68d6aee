#!/bin/bash
# The RaBitQ kernels' tests and gpu_bench --rabitq (the list scan alone and
# the GPU mirror's search) of the current build (.gpubin), beside each
# .gpubin2/gpu_bench_NAME.xz (NAME: old, the build before a change).
# TESTS: the gpu_tests filter (default 'Rabitq*').
set -o pipefail
. bench/gpu/ab_lib.sh
ab_setup
ab_tests "${TESTS:-Rabitq*}" 300
for v in $VARS new; do
  timeout 200 $(ab_bin $v) --rabitq > $OUT/rabitq-$v.log 2>&1; echo "rabitq $v rc=$?"
  grep -E "^\| (128|768) \| 4 " $OUT/rabitq-$v.log
done
# NCU=1: the list blocks (rabitq_pairs_kernel) of `gpu_bench --rabitq-profile 1000` under ncu, per
# variant: time, warp instructions, issue-slot use, registers, occupancy, loads and stall ratios of
# each launch (128-d, then 768-d; skewed lists; NCU_METRICS replaces all but the first four).
if [ "${NCU:-0}" = 1 ]; then
  for v in $VARS new; do
    timeout 150 ncu --kernel-name regex:rabitq_pairs --csv --metrics \
      gpu__time_duration.sum,sm__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__grid_size,${NCU_METRICS:-launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,l1tex__t_sector_hit_rate.pct,lts__t_sectors_srcunit_tex_op_read.sum} \
      $(ab_bin $v) --rabitq-profile 1000 > $OUT/ncu-pairs-$v.csv 2>&1; echo "ncu $v rc=$?"
  done
fi
