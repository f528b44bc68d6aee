#!/usr/bin/env bash
# The CPU engine's index scans beside pgvector's HNSW, through SQL (not a test).
#
#   bench/cpu/engine_vs_hnsw.sh
#
# Loads ROWS x DIM synthetic vectors (gen_synthetic, clustered and
# overlapping) as a pgvector vector column twice, into base_ivf and
# base_hnsw, and NQ fresh queries into qa; computes the exact 10 nearest of
# each query by sequential scan; builds a gpu_ivfpq index (lists LISTS, m M,
# with vector copies, gpu_ivfpq.device = cpu) on one and an HNSW index
# (m HNSW_M, ef_construction HNSW_EFC) on the other. For each setting it
# prints recall@10 over the NQ queries, then runs pgbench for DURATION
# seconds per client count with
#   \set q random(1, NQ)
#   SELECT id FROM <table> ORDER BY v <-> (SELECT v FROM qa WHERE qid = :q) LIMIT 10
# (prepared) and prints q/s for each count of CLIENTS and the median
# latency at 1 client (pgbench's per-transaction log).
# Output goes to stdout and to OUT.
#
# Environment (defaults):
#   PG_BIN=/usr/lib/postgresql/15/bin   a PostgreSQL with pgvector and gpu_ivfpq installed
#   PGPORT_WANTED=(a free port)  ROWS=200000 DIM=128 NQ=1000 SEED=42
#   OVERLAP=3.0   gen_synthetic's cluster overlap (smaller: an easier set)
#   LISTS=1000 M=32  IVF_SETTINGS="probes=16,rerank=100;probes=32,rerank=100"
#   HNSW_M=16 HNSW_EFC=64  EF_SEARCH="40 80"
#   CLIENTS="1 2" DURATION=20 METHODS="ivf hnsw"   (ivf-nocopies: the gpu_ivfpq
#             index built again with store_vectors = off, scans re-ranking from the table)
#   NOTE=""   a line for the header (e.g. which build of the extension is installed)
#   KEEP=0    1: leave the server running with the data (for interleaved_ab.sh)
#   OUT=bench/cpu/results/engine_vs_hnsw-<date>-<time>.txt
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/common.sh"

ROWS=${ROWS:-200000}
DIM=${DIM:-128}
NQ=${NQ:-1000}
SEED=${SEED:-42}
OVERLAP=${OVERLAP:-3.0}
LISTS=${LISTS:-1000}
M=${M:-32}
IVF_SETTINGS=${IVF_SETTINGS:-"probes=16,rerank=100;probes=32,rerank=100"}
HNSW_M=${HNSW_M:-16}
HNSW_EFC=${HNSW_EFC:-64}
EF_SEARCH=${EF_SEARCH:-"40 80"}
CLIENTS=${CLIENTS:-"1 2"}
DURATION=${DURATION:-20}
METHODS=${METHODS:-"ivf hnsw"}
export PG_SHARED_BUFFERS=${PG_SHARED_BUFFERS:-1GB}
export PG_MAINTENANCE_WORK_MEM=${PG_MAINTENANCE_WORK_MEM:-2GB}
mkdir -p "$REPO_ROOT/bench/cpu/results"
OUT=${OUT:-$REPO_ROOT/bench/cpu/results/engine_vs_hnsw-$(date +%Y%m%d-%H%M%S).txt}

psql_() { psql_q -d bench "$@"; }

# recall@10 of table $1's index scan (the database's settings) against gt.
recall() {
  psql_ -At -c "
    SELECT round(avg(hits) / 10.0, 4) FROM (
      SELECT (SELECT count(*) FROM unnest(g.ids) AS t(id)
              WHERE t.id IN (SELECT b.id FROM $1 b ORDER BY b.v <-> a.v LIMIT 10)) AS hits
      FROM qa a JOIN gt g USING (qid)) s" | tail -1
}

# One row of the table: name, table, settings (SET statements).
measure() {
  local name=$1 table=$2 sets=$3 r line p50 c tps dir
  psql_ -c "ALTER DATABASE bench RESET ALL" >/dev/null
  for s in ${sets//;/ }; do
    psql_ -c "ALTER DATABASE bench SET ${s%%=*} = '${s#*=}'" >/dev/null
  done
  r=$(recall "$table")
  printf '\\set q random(1, %s)\nSELECT id FROM %s ORDER BY v <-> (SELECT v FROM qa WHERE qid = :q) LIMIT 10;\n' \
    "$NQ" "$table" >"$TMP/q.sql"
  line=$(printf '%-38s | %9s' "$name" "$r")
  for c in $CLIENTS; do
    dir=$TMP/log-$c
    rm -rf "$dir"; mkdir -p "$dir"; chmod 777 "$dir"
    # warm-up, then the measured run
    "$PG_BIN/pgbench" -n -M prepared -f "$TMP/q.sql" -c "$c" -j "$c" -T 3 bench >/dev/null 2>&1
    tps=$(cd "$dir" && "$PG_BIN/pgbench" -n -M prepared -f "$TMP/q.sql" -c "$c" -j "$c" \
            -T "$DURATION" -l bench 2>&1 | sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    if [ "$c" = 1 ]; then
      p50=$(cat "$dir"/pgbench_log.* | awk '{print $3}' | sort -n |
              awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)] / 1000.0}')
    fi
    line="$line | $(printf '%10.1f' "$tps")"
  done
  printf '%s | %8s\n' "$line" "${p50:-}"
}

main() {
  TMP=$(mktemp -d /tmp/gpu_ivfpq-hnsw.XXXXXX)
  chmod 755 "$TMP"
  if [ "${KEEP:-0}" = 1 ]; then
    trap 'say "# server kept: PGHOST=$PGHOST PGPORT=$PGPORT PGUSER=postgres PGDATABASE=bench; stop it with: runuser -u postgres -- $PG_BIN/pg_ctl -D $TMP/pg/data stop"' EXIT
  else
    trap 'pg_temp_stop; rm -rf "$TMP"' EXIT
  fi
  cmake -S "$REPO_ROOT/tools" -B "$TOOLS_BUILD" -DCMAKE_BUILD_TYPE=Release >"$TMP/tools.log" 2>&1
  cmake --build "$TOOLS_BUILD" -j"$JOBS" --target gen_synthetic >>"$TMP/tools.log" 2>&1
  mkdir "$TMP/pg"
  pg_temp_start "$TMP/pg" "max_parallel_workers_per_gather = 0"
  psql_q -c "CREATE DATABASE bench"
  psql_ -c "CREATE EXTENSION vector" -c "CREATE EXTENSION gpu_ivfpq" \
    -c "CREATE EXTENSION gpu_ivfpq_pgvector"

  local commit
  commit=$(git -C "$REPO_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
  git -C "$REPO_ROOT" diff --quiet HEAD 2>/dev/null || commit="$commit+dirty"
  say "# gpu_ivfpq CPU engine vs pgvector HNSW, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $commit"
  say "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
  say "# $(psql_ -At -c 'SELECT version()' | cut -d, -f1); pgvector $(psql_ -At -c "SELECT extversion FROM pg_extension WHERE extname = 'vector'"); shared_buffers=$PG_SHARED_BUFFERS"
  say "# load average at start: $(cut -d' ' -f1-3 /proc/loadavg) (other work on the machine skews q/s and latency)"
  say "# data: gen_synthetic $ROWS x $DIM (seed $SEED, overlap $OVERLAP), $NQ fresh queries; recall@10 against exact sequential-scan answers"
  [ -z "${NOTE:-}" ] || say "# $NOTE"
  say "# pgbench -M prepared, $DURATION s per client count; p50 = median latency at 1 client"

  "$TOOLS_BUILD/gen_synthetic" --rows "$ROWS" --dim "$DIM" --seed "$SEED" --overlap "$OVERLAP" |
    psql_ -c "CREATE TABLE syn (id bigint, embedding real[])" -c "COPY syn (id, embedding) FROM STDIN"
  "$TOOLS_BUILD/gen_synthetic" --what queries --queries "$NQ" --dim "$DIM" --seed "$SEED" --overlap "$OVERLAP" |
    psql_ -c "CREATE TABLE synq (id bigint, embedding real[])" -c "COPY synq (id, embedding) FROM STDIN"
  psql_ -c "CREATE TABLE base_ivf AS SELECT id, embedding::vector($DIM) AS v FROM syn" \
    -c "CREATE TABLE base_hnsw AS SELECT * FROM base_ivf" \
    -c "CREATE TABLE qa AS SELECT id::int AS qid, embedding::vector($DIM) AS v FROM synq" \
    -c "ALTER TABLE base_ivf ADD PRIMARY KEY (id)" -c "ALTER TABLE base_hnsw ADD PRIMARY KEY (id)" \
    -c "ALTER TABLE qa ADD PRIMARY KEY (qid)" -c "DROP TABLE syn, synq" \
    -c "VACUUM ANALYZE base_ivf" -c "VACUUM ANALYZE base_hnsw" -c "VACUUM ANALYZE qa"
  local t0=$EPOCHREALTIME
  psql_ -c "CREATE TABLE gt AS SELECT a.qid, ARRAY(SELECT b.id FROM base_ivf b ORDER BY b.v <-> a.v LIMIT 10) AS ids FROM qa a"
  say "# exact answers (sequential scans): $(duration_since "$t0") s"
  say ""

  say "$(printf '%-38s | %9s' setting recall@10)$(for c in $CLIENTS; do printf ' | %10s' "q/s c=$c"; done) | p50 ms"
  for method in $METHODS; do
    case "$method" in
      ivf|ivf-nocopies)
        local with="lists = $LISTS, m = $M" tag=""
        if [ "$method" = ivf-nocopies ]; then
          with="$with, store_vectors = off"; tag=" no copies"
        fi
        psql_ -c "SET client_min_messages = warning" -c "DROP INDEX IF EXISTS base_ivf_idx"
        t0=$EPOCHREALTIME
        psql_ -c "CREATE INDEX base_ivf_idx ON base_ivf USING gpu_ivfpq (v vector_l2_ops) WITH ($with)"
        say "# gpu_ivfpq $with: CREATE INDEX $(duration_since "$t0") s, $(psql_ -At -c "SELECT pg_size_pretty(pg_relation_size('base_ivf_idx'))")"
        local s
        IFS=';' read -ra settings <<<"$IVF_SETTINGS"
        for s in "${settings[@]}"; do
          local p=${s#probes=}; p=${p%%,*}; local rr=${s#*rerank=}
          measure "gpu_ivfpq cpu$tag $s" base_ivf \
            "gpu_ivfpq.device=cpu;gpu_ivfpq.probes=$p;gpu_ivfpq.rerank=$rr"
        done
        ;;
      hnsw)
        t0=$EPOCHREALTIME
        psql_ -c "CREATE INDEX base_hnsw_idx ON base_hnsw USING hnsw (v vector_l2_ops) WITH (m = $HNSW_M, ef_construction = $HNSW_EFC)"
        say "# hnsw m=$HNSW_M ef_construction=$HNSW_EFC: CREATE INDEX $(duration_since "$t0") s, $(psql_ -At -c "SELECT pg_size_pretty(pg_relation_size('base_hnsw_idx'))")"
        local ef
        for ef in $EF_SEARCH; do
          measure "hnsw ef_search=$ef" base_hnsw "hnsw.ef_search=$ef"
        done
        ;;
      *) warn "unknown method $method"; return 2 ;;
    esac
  done
}

main 2>&1 | tee "$OUT"
say "results written to ${OUT#"$REPO_ROOT"/}"
