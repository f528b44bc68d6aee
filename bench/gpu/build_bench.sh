#!/bin/bash
# CREATE INDEX on the GPU machine, phase by phase: tools/gen_synthetic's
# set (seed 42), N x 128 rows (lists LISTS, m 32) and, unless WIDE_N=0,
# WIDE_N x 768 rows of the same generator (lists WIDE_LISTS, m 96). Each
# index is built REPEAT times (the first build also starts the GPU process's
# device work); every build prints its wall time, the build's own phase log
# (client_min_messages = debug1: sampling, training, encoding, the covering
# radii and quantization errors, writing the lists), the WAL it wrote and
# the index's size, then recall@10 (probes 32) over the first 1000 queries
# of the 128-d set, so that a faster build is seen to build the same index.
# The builds read the table over parallel workers (the server's
# max_parallel_maintenance_workers, and as many as the table's size allows);
# SERIAL=1 (the default) adds one build of the base index read by the
# leader alone, for comparison, and RABITQ_BITS=B one of a RaBitQ index of
# each table (RABITQ_CPU=1: and the same on the CPU engine).
#
# Runs after bash .device/pg-up.sh and an install of the extension linked
# with the kernels. usage: bench/gpu/build_bench.sh
# (N=1000000 LISTS=4096 WIDE_N=200000 WIDE_LISTS=1024 REPEAT=2 DEVICE=gpu
#  SERIAL=1 RABITQ_BITS= RABITQ_CPU=0 NO_WAL_BUILD=1)
set -euo pipefail
N=${N:-1000000}
LISTS=${LISTS:-4096}
WIDE_N=${WIDE_N:-200000}
WIDE_LISTS=${WIDE_LISTS:-1024}
REPEAT=${REPEAT:-2}
DEVICE=${DEVICE:-gpu}
DATA=${DATA:-/tmp/gpu_ivfpq-synthetic-$N}
RES=${OUT:-/tmp}/build-bench.txt
. "${PGENV:-/opt/pg/env.sh}"
say() { echo "$*" | tee -a "$RES"; }
: >"$RES"

. bench/gpu/lib.sh
bench_setup "" "wide"
say "# gpu_ivfpq CREATE INDEX: $N x 128 (lists $LISTS, m 32)$([ "$WIDE_N" != 0 ] && echo " and $WIDE_N x 768 (lists $WIDE_LISTS, m 96)") synthetic (tools/gen_synthetic, seed 42), gpu_ivfpq.device = $DEVICE"
say "# device: $(psql -qAtc 'SELECT device FROM gpu_ivfpq_status'); $(nproc) CPU cores; $(psql -qAtc "SELECT string_agg(name || '=' || setting, ' ') FROM pg_settings WHERE name IN ('maintenance_work_mem', 'max_parallel_maintenance_workers', 'shared_buffers', 'wal_level', 'fsync', 'wal_buffers')")"
say "# $(date -u +%F' '%T) UTC"

if [ "$WIDE_N" != 0 ]; then
  wide=$DATA/wide-$WIDE_N.txt
  [ -s "$wide" ] || "$GEN" --rows "$WIDE_N" --dim 768 --threads "$(nproc)" --out "$wide"
  chmod a+r "$wide"
  psql -qc "CREATE TABLE wide (id int4, v real[])" -c "COPY wide FROM '$wide'" -c "VACUUM ANALYZE wide"
fi

# build TABLE LISTS M [OPTIONS [REPEATS]]: builds of TABLE's index, each with
# its phases (M "-": no m option); BUILD_SET: SQL run before each build.
build() {
  local table=$1 lists=$2 m=$3 opts=${4:-} i t0 wal0 log with
  with="lists = $lists"
  [ "$m" = - ] || with="$with, m = $m"
  with="$with$opts"
  for i in $(seq "${5:-$REPEAT}"); do
    psql -qc "DROP INDEX IF EXISTS ${table}_idx" -c "CHECKPOINT"
    wal0=$(psql -qAtc "SELECT pg_current_wal_insert_lsn()")
    t0=$(date +%s.%N)
    log=$(psql -qX 2>&1 <<SQL
SET client_min_messages = debug1;
SET gpu_ivfpq.device = $DEVICE;
${BUILD_SET:-}
CREATE INDEX ${table}_idx ON $table USING gpu_ivfpq (v) WITH ($with);
SQL
)
    say "$table build $i${opts:+ ($opts)}${BUILD_SET:+ [$BUILD_SET]}: $(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $t0 }") s, WAL $(psql -qAtc "SELECT pg_size_pretty(pg_current_wal_insert_lsn() - '$wal0')"), index $(psql -qAtc "SELECT pg_size_pretty(pg_relation_size('${table}_idx'))")"
    echo "$log" | grep "gpu_ivfpq build" | sed 's/^DEBUG:  /    /' | tee -a "$RES"
  done
}

build base "$LISTS" 32
r=$(recall_at_10 "$DEVICE" 32)
say "base recall@10 (probes 32): $r"
psql -qAtc "SELECT gpu_ivfpq_check('base_idx', true)" >/dev/null 2>&1 && say "base_idx: gpu_ivfpq_check(heapallindexed) passed" ||
  say "base_idx: gpu_ivfpq_check FAILED: $(psql -qAtc "SELECT gpu_ivfpq_check('base_idx', true)" 2>&1 | tail -2)"
# The same build with the table read by the leader alone.
[ "${SERIAL:-1}" = 1 ] && BUILD_SET="SET max_parallel_maintenance_workers = 0;" build base "$LISTS" 32 "" 1
[ "$WIDE_N" != 0 ] && build wide "$WIDE_LISTS" 96
if [ -n "${RABITQ_BITS:-}" ]; then
  build base "$LISTS" - ", codes = rabitq, bits = $RABITQ_BITS" 1
  say "base rabitq recall@10 (probes 32): $(recall_at_10 "$DEVICE" 32)"
  psql -qAtc "SELECT gpu_ivfpq_check('base_idx', true)" >/dev/null 2>&1 && say "base_idx (rabitq): gpu_ivfpq_check(heapallindexed) passed" ||
    say "base_idx (rabitq): gpu_ivfpq_check FAILED: $(psql -qAtc "SELECT gpu_ivfpq_check('base_idx', true)" 2>&1 | tail -2)"
  [ "$WIDE_N" != 0 ] && build wide "$WIDE_LISTS" - ", codes = rabitq, bits = $RABITQ_BITS" 1
  # RABITQ_CPU=1: the same builds on the CPU engine (its encoding beside the GPU's).
  if [ "${RABITQ_CPU:-0}" = 1 ]; then
    BUILD_SET="SET gpu_ivfpq.device = cpu;" build base "$LISTS" - ", codes = rabitq, bits = $RABITQ_BITS" 1
    [ "$WIDE_N" != 0 ] && BUILD_SET="SET gpu_ivfpq.device = cpu;" build wide "$WIDE_LISTS" - ", codes = rabitq, bits = $RABITQ_BITS" 1
  fi
fi
# What the vector copies cost: the index without them (re-ranks read the table).
build base "$LISTS" 32 ", store_vectors = off" 1
# What the WAL costs: wal_level = minimal logs no page of an index built
# in its own transaction (a server with no standby, no archive).
if [ "${NO_WAL_BUILD:-1}" = 1 ]; then
  printf '%s\n' "wal_level = minimal" "max_wal_senders = 0" >>"$PGDATA/postgresql.conf"
  as_pg pg_ctl -D "$PGDATA" -l /tmp/pgkit-server.log -w restart >/dev/null
  for _ in $(seq 50); do psql -qAtc "SELECT 1" >/dev/null 2>&1 && break; sleep 0.2; done
  say "# restarted with wal_level = minimal"
  build base "$LISTS" 32 "" 1
  [ "$WIDE_N" != 0 ] && build wide "$WIDE_LISTS" 96 "" 1
fi
exit 0
