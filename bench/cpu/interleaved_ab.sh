#!/usr/bin/env bash
# Interleaved pgbench rounds of two builds of the extension and pgvector's
# HNSW on a running server (not a test): on a shared machine, load drifts
# between separate runs of engine_vs_hnsw.sh; alternating short runs keeps
# the builds and HNSW under the same load.
#
#   bench/cpu/interleaved_ab.sh OLD.so NEW.so
#
# Needs a server (PGHOST, PGPORT, PGUSER, PGDATABASE) whose database holds
# what engine_vs_hnsw.sh makes (base_ivf with a gpu_ivfpq index, base_hnsw
# with an HNSW index, qa with NQ queries; keep them with KEEP=1 there, or
# load them alike). Each round installs OLD.so, then NEW.so, as the
# server's gpu_ivfpq.so (renamed into place, so that running backends keep
# theirs; every pgbench connection is new and loads the installed one) and
# runs pgbench for each, then for HNSW: 1 client (q/s, p50) and CLIENTS
# clients (q/s). The installed gpu_ivfpq.so is NEW.so at the end.
#
# Environment (defaults): PG_BIN=/usr/lib/postgresql/15/bin PROBES=8
# RERANK=100 EF_SEARCH=40 NQ=1000 CLIENTS=2 DURATION=10 ROUNDS=3
set -euo pipefail
OLD=$1 NEW=$2
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PROBES=${PROBES:-8} RERANK=${RERANK:-100} EF_SEARCH=${EF_SEARCH:-40}
NQ=${NQ:-1000} CLIENTS=${CLIENTS:-2} DURATION=${DURATION:-10} ROUNDS=${ROUNDS:-3}
LIB=$("$PG_BIN/pg_config" --pkglibdir)
TMP=$(mktemp -d /tmp/gpu_ivfpq-ab.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
for t in ivf hnsw; do
  printf '\\set q random(1, %s)\nSELECT id FROM base_%s ORDER BY v <-> (SELECT v FROM qa WHERE qid = :q) LIMIT 10;\n' \
    "$NQ" "$t" >"$TMP/$t.sql"
done
db=$("$PG_BIN/psql" -X -At -c "SELECT current_database()")
"$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -c "ALTER DATABASE \"$db\" SET gpu_ivfpq.device = 'cpu'" \
  -c "ALTER DATABASE \"$db\" SET gpu_ivfpq.probes = $PROBES" \
  -c "ALTER DATABASE \"$db\" SET gpu_ivfpq.rerank = $RERANK" \
  -c "ALTER DATABASE \"$db\" SET hnsw.ef_search = $EF_SEARCH"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores; gpu_ivfpq probes=$PROBES rerank=$RERANK, hnsw ef_search=$EF_SEARCH; $DURATION s per run"
printf '%-6s %-28s %10s %10s %8s %6s\n' round what "q/s c=1" "q/s c=$CLIENTS" "p50 ms" load
for r in $(seq 1 "$ROUNDS"); do
  for what in old new hnsw; do
    case $what in
      old) cp "$OLD" "$LIB/gpu_ivfpq.so.ab" && mv "$LIB/gpu_ivfpq.so.ab" "$LIB/gpu_ivfpq.so"; f=$TMP/ivf.sql; name="gpu_ivfpq $(basename "$OLD")" ;;
      new) cp "$NEW" "$LIB/gpu_ivfpq.so.ab" && mv "$LIB/gpu_ivfpq.so.ab" "$LIB/gpu_ivfpq.so"; f=$TMP/ivf.sql; name="gpu_ivfpq $(basename "$NEW")" ;;
      hnsw) f=$TMP/hnsw.sql; name="hnsw" ;;
    esac
    "$PG_BIN/pgbench" -n -M prepared -f "$f" -c 1 -T 2 >/dev/null 2>&1
    rm -rf "$TMP/log"; mkdir "$TMP/log"
    t1=$(cd "$TMP/log" && "$PG_BIN/pgbench" -n -M prepared -f "$f" -c 1 -j 1 -T "$DURATION" -l 2>&1 |
           sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    p50=$(cat "$TMP"/log/pgbench_log.* | awk '{print $3}' | sort -n |
            awk '{a[NR]=$1} END {printf "%.3f", a[int((NR+1)/2)] / 1000.0}')
    tn=$("$PG_BIN/pgbench" -n -M prepared -f "$f" -c "$CLIENTS" -j "$CLIENTS" -T "$DURATION" 2>&1 |
           sed -n 's/^tps = \([0-9.]*\).*/\1/p')
    printf '%-6s %-28s %10.1f %10.1f %8s %6s\n' "$r" "$name" "$t1" "$tn" "$p50" "$(cut -d' ' -f1 /proc/loadavg)"
  done
done
