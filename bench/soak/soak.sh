#!/bin/bash
# Soak: k-NN readers, writers, VACUUM, REINDEX CONCURRENTLY and a GPU
# process killed every few minutes, all at once, for a long time; then the
# figures that say whether anything went wrong.
#
#   readers   pgbench, REPEATABLE READ transactions of one k-NN query each
#             (SELECT ... ORDER BY v <-> q LIMIT 10 through the index). Every
#             returned row is checked inside the transaction: visible (found
#             again through the primary key, in the same snapshot, with the
#             same distance), not returned twice, and in distance order. One
#             query in SOAK_SAMPLE is also answered by a sequential scan
#             (the distance function, which no index serves) for recall@10.
#   writers   pgbench: inserts, updates of the vector, deletes (READ COMMITTED)
#   upkeep    VACUUM every SOAK_VACUUM_EVERY s, REINDEX INDEX CONCURRENTLY
#             every SOAK_REINDEX_EVERY s
#   faults    the GPU process killed every SOAK_KILL_EVERY s, SIGKILL and
#             SIGSEGV in turn (the service must restart it; the CPU engine
#             answers meanwhile)
#
# Figures: queries, wrong rows (must be 0), failed transactions (must be 0),
# GPU restarts, recall@10 of the sampled queries, the GPU's share.
#
# Needs: a running server that preloads gpu_ivfpq (PGHOST/PGPORT/PGUSER as
# for psql; a superuser), psql and pgbench on PATH, and the right to signal
# the server's processes (run as the server's OS user or root).
#
#   SOAK_SECONDS=1800 bash bench/soak/soak.sh
#
# Settings (environment): SOAK_SECONDS (1800), SOAK_READERS (64),
# SOAK_WRITERS (4), SOAK_ROWS (100000), SOAK_DIM (32), SOAK_LISTS (128),
# SOAK_M (8), SOAK_PROBES (16), SOAK_SAMPLE (20), SOAK_KILL_EVERY (180),
# SOAK_VACUUM_EVERY (60), SOAK_REINDEX_EVERY (300), SOAK_DB (soak),
# SOAK_OUT (folder for the report, soak-results).
set -uo pipefail

SECONDS_TOTAL=${SOAK_SECONDS:-1800}
READERS=${SOAK_READERS:-64}
WRITERS=${SOAK_WRITERS:-4}
ROWS=${SOAK_ROWS:-100000}
DIM=${SOAK_DIM:-32}
LISTS=${SOAK_LISTS:-128}
M=${SOAK_M:-8}
PROBES=${SOAK_PROBES:-16}
SAMPLE=${SOAK_SAMPLE:-20}
KILL_EVERY=${SOAK_KILL_EVERY:-180}
VACUUM_EVERY=${SOAK_VACUUM_EVERY:-60}
REINDEX_EVERY=${SOAK_REINDEX_EVERY:-300}
DB=${SOAK_DB:-soak}
OUT=${SOAK_OUT:-soak-results}
mkdir -p "$OUT"
WORK=$(mktemp -d)
chmod 755 "$WORK"
trap 'rm -rf "$WORK"' EXIT

psql_db() { psql -X -q -v ON_ERROR_STOP=1 -At -d "$DB" "$@"; }
log() { echo "[soak $(date -u +%H:%M:%S)] $*" | tee -a "$OUT/soak.log"; }
: >"$OUT/soak.log"

# ---------------------------------------------------------------- set-up
log "set-up: $ROWS rows of $DIM dimensions, lists $LISTS, m $M"
psql -X -q -d postgres -c "DROP DATABASE IF EXISTS $DB" -c "CREATE DATABASE $DB" || exit 1
psql_db <<SQL || exit 1
CREATE EXTENSION gpu_ivfpq;
-- Deterministic vectors around 64 centres (the seed picks the centre), so
-- that the lists hold clusters as real embeddings do. Writers draw new
-- seeds at run time, so the generator lives in SQL.
CREATE FUNCTION soak_vec(seed bigint) RETURNS real[] LANGUAGE sql IMMUTABLE AS \$\$
  SELECT array_agg((sin((seed % 64) * (i * 1.618 + 0.5)) + 0.35 * sin(seed * (i * 0.731 + 0.29)))::real
                   ORDER BY i)
  FROM generate_series(1, $DIM) i
\$\$;
CREATE TABLE soak_items (id bigint PRIMARY KEY, v real[] NOT NULL);
INSERT INTO soak_items SELECT g, soak_vec(g) FROM generate_series(1, $ROWS) g;
CREATE INDEX soak_v ON soak_items USING gpu_ivfpq (v) WITH (lists = $LISTS, m = $M);
CREATE TABLE soak_wrong (at timestamptz DEFAULT clock_timestamp(), kind text, seed bigint, id bigint);
CREATE TABLE soak_recall (seed bigint, hits int, k int);
ALTER DATABASE $DB SET gpu_ivfpq.probes = $PROBES;

-- One reader query and its checks (see the top of this file). Runs in the
-- caller's REPEATABLE READ snapshot, so the checks see what the scan saw.
CREATE FUNCTION soak_read(seed bigint, k int, sampled bool) RETURNS int LANGUAGE plpgsql AS \$\$
DECLARE
  q real[] := soak_vec(seed);
  r record;
  prev float8 := '-infinity';
  seen bigint[] := '{}';
  kth float8;
  bad int := 0;
BEGIN
  FOR r IN SELECT id, v <-> q AS d FROM soak_items ORDER BY v <-> q LIMIT k LOOP
    IF r.d < prev THEN
      INSERT INTO soak_wrong (kind, seed, id) VALUES ('out of order', seed, r.id); bad := bad + 1;
    END IF;
    IF r.id = ANY (seen) THEN
      INSERT INTO soak_wrong (kind, seed, id) VALUES ('returned twice', seed, r.id); bad := bad + 1;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM soak_items WHERE id = r.id AND gpu_ivfpq_l2_distance(v, q) = r.d) THEN
      INSERT INTO soak_wrong (kind, seed, id) VALUES ('not visible', seed, r.id); bad := bad + 1;
    END IF;
    prev := r.d;
    seen := seen || r.id;
  END LOOP;
  IF sampled THEN
    SELECT max(d) INTO kth FROM
      (SELECT gpu_ivfpq_l2_distance(v, q) AS d FROM soak_items ORDER BY 1 LIMIT k) s;
    INSERT INTO soak_recall
      SELECT seed, count(*), k FROM soak_items
      WHERE id = ANY (seen) AND gpu_ivfpq_l2_distance(v, q) <= kth;
  END IF;
  RETURN bad;
END
\$\$;
SQL
psql_db -c "VACUUM ANALYZE soak_items"
# Index scans for the readers on any table size.
psql -X -q -d postgres -c "ALTER DATABASE $DB SET enable_seqscan = off"
psql_db -c "SELECT gpu_ivfpq_prewarm('soak_v')" >/dev/null 2>&1 ||
  log "prewarm failed (no GPU service?): scans start on the CPU"

cat >"$WORK/read.sql" <<SQL
\set s random(1, 2000000000)
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT soak_read(:s, 10, :s % $SAMPLE = 0);
END;
SQL
# Writers draw ids from 1..2 x rows: inserts (upserts) and deletes at the
# same rate keep the table near its starting size however long it runs.
cat >"$WORK/insert.sql" <<SQL
\set s random(1, 2000000000)
\set id random(1, $((ROWS * 2)))
INSERT INTO soak_items VALUES (:id, soak_vec(:s)) ON CONFLICT (id) DO UPDATE SET v = excluded.v;
SQL
cat >"$WORK/update.sql" <<SQL
\set s random(1, 2000000000)
\set id random(1, $((ROWS * 2)))
UPDATE soak_items SET v = soak_vec(:s) WHERE id = :id;
SQL
cat >"$WORK/delete.sql" <<SQL
\set id random(1, $((ROWS * 2)))
DELETE FROM soak_items WHERE id = :id;
SQL
chmod 644 "$WORK"/*.sql

status() { psql_db -c "SELECT $1 FROM gpu_ivfpq_status"; }
before_restarts=$(status gpu_restarts)
before_gpu=$(status queries_gpu)
before_cpu=$(status queries_cpu)
log "service: $(status "state || ' on ' || device")"

# ---------------------------------------------------------------- run
log "run: $SECONDS_TOTAL s, $READERS readers, $WRITERS writers, a kill every $KILL_EVERY s"
pgbench -n -d "$DB" -c "$READERS" -j "$(nproc)" -T "$SECONDS_TOTAL" -P 60 -f "$WORK/read.sql" \
  >"$OUT/readers.txt" 2>&1 &
readers_pid=$!
pgbench -n -d "$DB" -c "$WRITERS" -j 1 -T "$SECONDS_TOTAL" -P 60 -f "$WORK/insert.sql@1" \
  -f "$WORK/update.sql@1" -f "$WORK/delete.sql@1" >"$OUT/writers.txt" 2>&1 &
writers_pid=$!

start=$(date +%s)
next_kill=$((start + KILL_EVERY))
next_vacuum=$((start + VACUUM_EVERY))
next_reindex=$((start + REINDEX_EVERY))
kills=0 vacuums=0 reindexes=0 upkeep_failures=0
signals=(KILL SEGV)
while kill -0 "$readers_pid" 2>/dev/null; do
  now=$(date +%s)
  if [ "$now" -ge "$next_kill" ] && [ "$now" -lt $((start + SECONDS_TOTAL - 30)) ]; then
    pid=$(status gpu_process_pid)
    sig=${signals[$((kills % 2))]}
    if [ -n "$pid" ] && kill -s "$sig" "$pid"; then
      kills=$((kills + 1))
      log "sent SIG$sig to the GPU process $pid"
    else
      log "no GPU process to kill (state: $(status state))"
    fi
    next_kill=$((now + KILL_EVERY))
  fi
  if [ "$now" -ge "$next_vacuum" ]; then
    if psql_db -c "VACUUM soak_items" 2>>"$OUT/soak.log"; then vacuums=$((vacuums + 1)); else upkeep_failures=$((upkeep_failures + 1)); fi
    next_vacuum=$((now + VACUUM_EVERY))
  fi
  if [ "$now" -ge "$next_reindex" ]; then
    if psql_db -c "REINDEX INDEX CONCURRENTLY soak_v" 2>>"$OUT/soak.log"; then
      reindexes=$((reindexes + 1))
      log "REINDEX CONCURRENTLY done"
    else
      upkeep_failures=$((upkeep_failures + 1))
    fi
    next_reindex=$((now + REINDEX_EVERY))
  fi
  sleep 1
done
wait "$readers_pid"
readers_rc=$?
wait "$writers_pid"
writers_rc=$?

# ---------------------------------------------------------------- figures
field() { sed -n "s/^$1: \([0-9.]*\).*/\1/p" "$2" | head -1; }
queries=$(field "number of transactions actually processed" "$OUT/readers.txt")
read_failed=$(field "number of failed transactions" "$OUT/readers.txt")
writes=$(field "number of transactions actually processed" "$OUT/writers.txt")
write_failed=$(field "number of failed transactions" "$OUT/writers.txt")
read_tps=$(sed -n 's/^tps = \([0-9.]*\).*/\1/p' "$OUT/readers.txt" | head -1)
aborted=$(grep -c "aborted" "$OUT/readers.txt" "$OUT/writers.txt" | awk -F: '{s += $2} END {print s}')
wrong=$(psql_db -c "SELECT count(*) FROM soak_wrong")
wrong_kinds=$(psql_db -c "SELECT coalesce(string_agg(kind || ' ' || n, ', '), 'none') FROM (SELECT kind, count(*) n FROM soak_wrong GROUP BY kind) s")
recall=$(psql_db -c "SELECT count(*) || ' sampled queries, recall@10 ' || coalesce(round(sum(hits)::numeric / nullif(sum(k), 0), 4)::text, 'n/a') FROM soak_recall")
restarts=$(($(status gpu_restarts) - before_restarts))
gpu_q=$(($(status queries_gpu) - before_gpu))
cpu_q=$(($(status queries_cpu) - before_cpu))
rows_now=$(psql_db -c "SELECT count(*) FROM soak_items")
check=$(psql_db -c "SELECT gpu_ivfpq_check('soak_v', true)" 2>&1) && check="sound"

{
  echo "gpu_ivfpq soak, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "server:         $(psql -X -At -d "$DB" -c 'SHOW server_version')"
  echo "service:        $(status "state || ' on ' || device")"
  echo "machine:        $(nproc) CPUs"
  echo "duration:       $SECONDS_TOTAL s; $READERS readers, $WRITERS writers"
  echo "data:           $ROWS rows at start ($rows_now at end), $DIM dimensions, lists $LISTS, m $M, probes $PROBES"
  echo "queries:        $queries (${read_tps} per second), every row checked"
  echo "wrong rows:     $wrong ($wrong_kinds)"
  echo "failed transactions: readers $read_failed, writers $write_failed; clients aborted: $aborted; pgbench exit codes $readers_rc, $writers_rc"
  echo "writes:         $writes transactions (upsert 1 : update 1 : delete 1)"
  echo "GPU process:    $kills kills sent, $restarts restarts counted; last exit: $(status "coalesce(last_gpu_exit, 'none')")"
  echo "served:         $gpu_q scan rounds on the GPU, $cpu_q on the CPU"
  echo "upkeep:         $vacuums VACUUMs, $reindexes REINDEX CONCURRENTLY, $upkeep_failures failed"
  echo "sampled:        $recall (against a sequential scan in the same snapshot)"
  echo "index check:    $check (gpu_ivfpq_check with heapallindexed)"
  echo "service starts: $(status service_starts) (1 = the service never restarted)"
} | tee "$OUT/soak.txt"
