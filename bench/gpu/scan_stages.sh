#!/bin/bash
# Where the time of index scans under load goes, for one index after another
# on the SQL benchmarks' set (tools/gen_synthetic, seed 42, N x DIM): each
# index of OPTS (WITH options, ';' between indexes) is built, warmed, then
# CLIENTS pgbench clients run
#   SELECT id FROM base ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10
# for SECS seconds at gpu_ivfpq.probes PROBES. Printed per index: q/s; over
# the run, from gpu_ivfpq_status, the searches and batches of the direct path
# and their mean stages (queue wait per search, GPU call and delivery per
# batch); and the host's CPU time per query (from /proc): all of it, the GPU
# process's, pgbench's, and the rest (the backends, the server's other
# processes), against the host's cores.
#
# Runs after bash .device/pg-up.sh and an install of the extension linked
# with the kernels (bench/gpu/device_build.sh). usage: N=200000 DIM=768
# OPTS="lists = 1024, m = 96;lists = 1024, codes = rabitq, bits = 4"
# bash bench/gpu/scan_stages.sh
set -euo pipefail
N=${N:-1000000}
DIM=${DIM:-128}
export DIM
OPTS=${OPTS:-"lists = 4096, m = 32;lists = 4096, codes = rabitq, bits = 4"}
CLIENTS=${CLIENTS:-64}
SECS=${SECS:-5}
PROBES=${PROBES:-32}
DATA=${DATA:-/tmp/gpu_ivfpq-synthetic-$N-$DIM}
. "${PGENV:-/opt/pg/env.sh}"
. bench/gpu/lib.sh
bench_setup "" ""
work=$(mktemp -d)
chmod 755 "$work"
printf '\\set q random(1, 1000)\nSELECT id FROM base ORDER BY v <-> (SELECT v FROM queries WHERE qid = :q) LIMIT 10;\n' >"$work/knn.sql"
chmod 644 "$work/knn.sql"
hz=$(getconf CLK_TCK)
busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
status() { psql -qAtF' ' -c "SELECT queued_searches, batches, mean_queue_wait_us * queued_searches, mean_gpu_us * batches, mean_deliver_us * batches, gpu_process_pid FROM gpu_ivfpq_status"; }
echo "# scans under load: $N x $DIM synthetic, $CLIENTS clients, $SECS s, probes $PROBES; $(nproc) cores; $(date -u +%F' '%T) UTC"
IFS=';' read -ra list <<<"$OPTS"
for o in "${list[@]}"; do
  psql -qc "DROP INDEX IF EXISTS base_idx" -c "CREATE INDEX base_idx ON base USING gpu_ivfpq (v) WITH ($o)"
  psql -qAtc "SELECT gpu_ivfpq_prewarm('base_idx')" >/dev/null || true
  PGOPTIONS="-c gpu_ivfpq.probes=$PROBES" pgbench -n -M prepared -c "$CLIENTS" -j 16 -T 2 -f "$work/knn.sql" postgres >/dev/null 2>&1
  read -r s0 b0 w0 g0 d0 gpid < <(status)
  c0=$(busy)
  p0=$(ticks "$gpid")
  TIMEFORMAT='%U %S'
  { time (cd "$work" && PGOPTIONS="-c gpu_ivfpq.probes=$PROBES" pgbench -n -M prepared -c "$CLIENTS" -j 16 \
      -T "$SECS" -f knn.sql postgres >out.txt 2>&1); } 2>"$work/times.txt"
  c1=$(busy)
  p1=$(ticks "$gpid")
  read -r s1 b1 w1 g1 d1 _ < <(status)
  tps=$(grep -oP 'tps = \K[0-9.]+(?= \(without)' "$work/out.txt")
  read -r pu ps <"$work/times.txt"
  awk -v o="$o" -v tps="$tps" -v secs="$SECS" -v hz="$hz" -v cores="$(nproc)" \
      -v s="$((s1 - s0))" -v b="$((b1 - b0))" -v w="$(awk "BEGIN { print $w1 - $w0 }")" \
      -v g="$(awk "BEGIN { print $g1 - $g0 }")" -v d="$(awk "BEGIN { print $d1 - $d0 }")" \
      -v c="$((c1 - c0))" -v p="$((p1 - p0))" -v pb="$(awk "BEGIN { print $pu + $ps }")" 'BEGIN {
    q = tps * secs
    printf "\nWITH (%s): %.0f q/s\n", o, tps
    printf "  direct path over the run: %d searches in %d batches (mean %.1f); queue wait %.0f us a search, GPU call %.0f us and delivery %.0f us a batch\n",
      s, b, (b > 0 ? s / b : 0), (s > 0 ? w / s : 0), (b > 0 ? g / b : 0), (b > 0 ? d / b : 0)
    printf "  host CPU a query: %.0f us in all (%.0f%% of %d cores), GPU process %.0f us, pgbench %.0f us, the rest (backends, server) %.0f us\n",
      c / hz / q * 1e6, 100 * c / hz / (secs * cores), cores, p / hz / q * 1e6, pb / q * 1e6, (c / hz - p / hz - pb) / q * 1e6
  }'
done
rm -rf "$work"
