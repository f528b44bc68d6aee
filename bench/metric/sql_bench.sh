#!/usr/bin/env bash
# Fuzzy string search through SQL on the CPU (a benchmark, not a test).
#
#   bench/metric/cpu_bench.sh
#
# Loads the words of wspanish (86,016) and seeded queries (scripts/
# metric-words.sh: dictionary words with 1 to 3 edits, English words) into a
# throwaway server and, for radius 1, 2 and 3, and for the 10 nearest,
# prints per method the distance evaluations per query as a share of brute
# force's, the queries per second, and the answers found against the exact
# ones:
#   seq <~>        sequential scan, WHERE word <~> q <= r (ORDER BY ... LIMIT)
#   seq levensh.   sequential scan with levenshtein() (fuzzystrmatch)
#   trgm+<~>       pg_trgm's GIN index as a prefilter (word % q), <~> on what
#                  it keeps: % keeps words of similar trigrams, not those
#                  within r edits, so it misses answers (see "found")
#   lc, sss        gpu_metric index scans (one query a statement)
#   lc/sss batch   gpu_metric_range_batch / gpu_metric_knn_batch, every
#                  query in one call, on BATCH_THREADS engine threads
# Single-query methods run on one core (max_parallel_workers_per_gather = 0).
# The gpu_metric rows take their evaluation counts from the index's own
# count (its DEBUG1 line); sequential scans compute every distance; the
# trigram prefilter computes one per word it keeps.
#
# Environment (defaults): QUERIES=300 SEED=1 BATCH_THREADS=2 BUILD=0
# (BUILD=1 builds and installs the extension first, as root) SKIP_DEPS=1
# (0: scripts/install-deps.sh first) OUT=<stdout only>. Runs as root (the
# server runs as the postgres OS user) or as the postgres user.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/common.sh"

QUERIES=${QUERIES:-300}
SEED=${SEED:-1}
BATCH_THREADS=${BATCH_THREADS:-2}
OUT=${OUT:-}

main() {
  [ "${SKIP_DEPS:-1}" = 1 ] || "$REPO_ROOT/scripts/install-deps.sh"
  if [ ! -r /usr/share/dict/spanish ]; then
    warn "no /usr/share/dict/spanish: install the Debian package wspanish"
    exit 1
  fi
  TMP=$(mktemp -d /tmp/gpu_metric-bench.XXXXXX)
  chmod 755 "$TMP"
  trap 'pg_temp_stop; rm -rf "$TMP"' EXIT
  [ "${BUILD:-0}" = 1 ] && build_extension "$TMP/make.log"
  pg_temp_start "$TMP" "max_parallel_workers_per_gather = 0" "max_parallel_maintenance_workers = 1"
  psql_q -c "CREATE EXTENSION gpu_ivfpq"
  local have_fuzzy have_trgm
  have_fuzzy=$(psql_q -At -c "SELECT count(*) FROM pg_available_extensions WHERE name = 'fuzzystrmatch'")
  have_trgm=$(psql_q -At -c "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_trgm'")
  [ "$have_fuzzy" = 1 ] && psql_q -c "CREATE EXTENSION fuzzystrmatch"
  [ "$have_trgm" = 1 ] && psql_q -c "CREATE EXTENSION pg_trgm"
  METRIC_QUERIES=$QUERIES METRIC_SEED=$SEED "$REPO_ROOT/scripts/metric-words.sh" load

  say "== fuzzy string search: $(psql_q -At -c 'SELECT count(*) FROM metric_words') words of wspanish, $QUERIES queries (seed $SEED: $(psql_q -At -c "SELECT string_agg(kind || ' ' || n, ', ' ORDER BY kind) FROM (SELECT kind, count(*) n FROM metric_queries GROUP BY kind) k"))"
  say "machine: $(nproc) cores ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)), $(free -g | awk '/^Mem:/ { print $2 }') GB, no GPU; $("$PG_BIN/postgres" --version)"

  # One table per method, so that each query has one plan to take.
  local t0
  psql_q <<'SQL'
CREATE TABLE bench_seq AS SELECT id, word FROM metric_words;
CREATE TABLE bench_lc AS SELECT id, word FROM metric_words;
CREATE TABLE bench_sss AS SELECT id, word FROM metric_words;
VACUUM ANALYZE bench_seq, bench_lc, bench_sss;
SQL
  t0=$EPOCHREALTIME
  psql_q -c "CREATE INDEX bench_lc_idx ON bench_lc USING gpu_metric (word) WITH (method = lc, bucket = 32)"
  say "CREATE INDEX lc (bucket 32): $(duration_since "$t0") s, $(psql_q -At -c "SELECT pg_size_pretty(pg_relation_size('bench_lc_idx'))")"
  t0=$EPOCHREALTIME
  psql_q -c "CREATE INDEX bench_sss_idx ON bench_sss USING gpu_metric (word) WITH (method = sss, alpha = 0.5)"
  say "CREATE INDEX sss (alpha 0.5): $(duration_since "$t0") s, $(psql_q -At -c "SELECT pg_size_pretty(pg_relation_size('bench_sss_idx'))")"
  if [ "$have_trgm" = 1 ]; then
    psql_q -c "CREATE TABLE bench_trgm AS SELECT id, word FROM metric_words"
    t0=$EPOCHREALTIME
    psql_q -c "CREATE INDEX bench_trgm_idx ON bench_trgm USING gin (word gin_trgm_ops)" -c "VACUUM ANALYZE bench_trgm"
    say "CREATE INDEX gin_trgm_ops: $(duration_since "$t0") s"
  fi

  # run(SQL with $1 = query, $2 = radius or k): seconds for every query, one statement each.
  psql_q <<'SQL'
CREATE FUNCTION bench_run(sql text, param int, OUT seconds float8, OUT answers bigint) LANGUAGE plpgsql AS $$
DECLARE
	q record;
	n bigint;
	t timestamptz := clock_timestamp();
BEGIN
	answers := 0;
	-- Once before the clock: the backend restores a gpu_metric index on first use.
	EXECUTE sql INTO n USING (SELECT query FROM metric_queries ORDER BY id LIMIT 1), param;
	t := clock_timestamp();
	FOR q IN SELECT query FROM metric_queries ORDER BY id LOOP
		EXECUTE sql INTO n USING q.query, param;
		answers := answers + n;
	END LOOP;
	seconds := extract(epoch FROM clock_timestamp() - t);
END
$$;
-- once(SQL): seconds for one run of a statement, after one untimed run.
CREATE FUNCTION bench_once(sql text, OUT seconds float8, OUT answers bigint) LANGUAGE plpgsql AS $$
DECLARE
	t timestamptz;
BEGIN
	EXECUTE sql INTO answers;
	t := clock_timestamp();
	EXECUTE sql INTO answers;
	seconds := extract(epoch FROM clock_timestamp() - t);
END
$$;
-- The exact answers, for the prefilter's "found".
CREATE TABLE exact AS
SELECT q.id AS qid, w.id, w.d FROM metric_queries q,
	LATERAL (SELECT w.id, w.word <~> q.query AS d FROM bench_seq w OFFSET 0) w WHERE w.d <= 3;
SQL

  local n
  n=$(psql_q -At -c "SELECT count(*) FROM metric_words")
  say ""
  say "$(printf '%-8s %-14s %12s %10s %12s' "search" "method" "evaluations" "queries/s" "found")"
  local r
  for r in 1 2 3; do
    local exact
    exact=$(psql_q -At -c "SELECT count(*) FROM exact WHERE d <= $r")
    row "r=$r" "seq <~>" 1 "SELECT count(*) FROM bench_seq WHERE word <~> \$1 <= \$2" "$r" "$exact"
    [ "$have_fuzzy" = 1 ] &&
      row "r=$r" "seq levensh." 1 "SELECT count(*) FROM bench_seq WHERE levenshtein(word, \$1) <= \$2" "$r" "$exact"
    if [ "$have_trgm" = 1 ]; then
      local kept
      kept=$(psql_q -At -c "SELECT sum((SELECT count(*) FROM bench_trgm WHERE word % q.query))::float8 / (count(*) * $n) FROM metric_queries q")
      row "r=$r" "trgm+<~>" "$kept" "SELECT count(*) FROM bench_trgm WHERE word % \$1 AND word <~> \$1 <= \$2" "$r" "$exact"
    fi
    indexed "r=$r" lc "$r" "$exact"
    indexed "r=$r" sss "$r" "$exact"
  done
  knn_rows
  say ""
  say "evaluations: distances computed per query, as a share of brute force's ($n per query);"
  say "found: answers returned / exact answers (range), or queries whose 10 nearest equal the exact ones (k=10)."
  say "Single-query methods on one core; batches on $BATCH_THREADS engine threads."
  if [ -n "$OUT" ]; then
    mkdir -p "$(dirname "$OUT")"
    cp "$TMP/log" "$OUT"
    say "written to $OUT"
  fi
}

# Everything said also goes to the log that OUT keeps.
say() { printf '%s\n' "$*" | tee -a "$TMP/log"; }

psql_q() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

duration_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

# row LABEL METHOD EVALUATION_SHARE SQL PARAM EXACT: one method, every
# query (an index, where the table has one: sequential scans off).
row() {
  local label=$1 method=$2 share=$3 sql=$4 param=$5 exact=$6 out secs answers
  out=$(psql_q -At -F ' ' -c "SET enable_seqscan = off" -c "SELECT * FROM bench_run(\$q\$$sql\$q\$, $param)")
  secs=${out% *}
  answers=${out#* }
  say "$(printf '%-8s %-14s %11.2f%% %10.1f %12s' "$label" "$method" \
    "$(awk -v s="$share" 'BEGIN { print 100 * s }')" \
    "$(awk -v s="$secs" -v n="$QUERIES" 'BEGIN { print n / s }')" "$answers/$exact")"
}

# The evaluation share the batch function reports at DEBUG1 (its search is the scan's).
batch_share() {
  psql_q -c "SET client_min_messages = debug1" -c "SET max_parallel_workers_per_gather = $((BATCH_THREADS - 1))" \
    -c "$1" 2>&1 >/dev/null |
    sed -n 's/.*live objects each (\([0-9.]*\)% of brute force).*/\1/p' | tail -n 1
}

# indexed LABEL METHOD RADIUS EXACT: index scans, then the batch function.
indexed() {
  local label=$1 m=$2 r=$3 exact=$4 share out secs answers
  local batch="SELECT count(*) FROM gpu_metric_range_batch('bench_${m}_idx', (SELECT array_agg(query ORDER BY id) FROM metric_queries), $r)"
  share=$(batch_share "$batch")
  row "$label" "$m" "$(awk -v s="$share" 'BEGIN { print s / 100 }')" \
    "SELECT count(*) FROM bench_$m WHERE word <% edit_range(\$1, \$2)" "$r" "$exact"
  out=$(psql_q -At -F ' ' -c "SET max_parallel_workers_per_gather = $((BATCH_THREADS - 1))" \
    -c "SELECT * FROM bench_once(\$q\$$batch\$q\$)")
  secs=${out% *}
  answers=${out#* }
  say "$(printf '%-8s %-14s %11.2f%% %10.1f %12s' "$label" "$m batch" "$share" \
    "$(awk -v s="$secs" -v n="$QUERIES" 'BEGIN { print n / s }')" "$answers/$exact")"
}

# The 10 nearest (ORDER BY ... LIMIT 10), every method.
knn_rows() {
  local n ok share secs
  n=$(psql_q -At -c "SELECT count(*) FROM metric_words")
  # The exact 10 nearest by (distance, id): a sequential scan per query.
  psql_q <<'SQL'
CREATE TABLE exact_knn AS
SELECT q.id AS qid, ARRAY(SELECT w.id FROM bench_seq w ORDER BY w.word <~> q.query, w.id LIMIT 10) AS ids
FROM metric_queries q;
-- Queries whose 10 nearest by a method equal the exact ones (ties may
-- differ by id where a method orders them otherwise; all are exact).
CREATE FUNCTION knn_found(sql text) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
	q record;
	ids bigint[];
	n bigint := 0;
BEGIN
	FOR q IN SELECT m.id, m.query, e.ids FROM metric_queries m JOIN exact_knn e ON e.qid = m.id LOOP
		EXECUTE sql INTO ids USING q.query;
		IF (SELECT array_agg(w.word <~> q.query ORDER BY o) FROM unnest(ids) WITH ORDINALITY u(id, o) JOIN bench_seq w ON w.id = u.id)
		   = (SELECT array_agg(w.word <~> q.query ORDER BY o) FROM unnest(q.ids) WITH ORDINALITY u(id, o) JOIN bench_seq w ON w.id = u.id) THEN
			n := n + 1;
		END IF;
	END LOOP;
	RETURN n;
END
$$;
SQL
  knn_row "seq <~>" 1 "SELECT count(*) FROM (SELECT id FROM bench_seq ORDER BY word <~> \$1 LIMIT 10) x" \
    "SELECT ARRAY(SELECT id FROM bench_seq ORDER BY word <~> \$1 LIMIT 10)"
  [ "$(psql_q -At -c "SELECT count(*) FROM pg_extension WHERE extname = 'fuzzystrmatch'")" = 1 ] &&
    knn_row "seq levensh." 1 "SELECT count(*) FROM (SELECT id FROM bench_seq ORDER BY levenshtein(word, \$1) LIMIT 10) x" \
      "SELECT ARRAY(SELECT id FROM bench_seq ORDER BY levenshtein(word, \$1) LIMIT 10)"
  local m
  for m in lc sss; do
    local batch="SELECT count(*) FROM gpu_metric_knn_batch('bench_${m}_idx', (SELECT array_agg(query ORDER BY id) FROM metric_queries), 10)"
    share=$(batch_share "$batch")
    knn_row "$m" "$(awk -v s="$share" 'BEGIN { print s / 100 }')" \
      "SELECT count(*) FROM (SELECT id FROM bench_$m ORDER BY word <~> \$1 LIMIT 10) x" \
      "SELECT ARRAY(SELECT id FROM bench_$m ORDER BY word <~> \$1 LIMIT 10)"
    secs=$(psql_q -At -c "SET max_parallel_workers_per_gather = $((BATCH_THREADS - 1))" \
      -c "SELECT seconds FROM bench_once(\$q\$$batch\$q\$)")
    ok=$(psql_q -At -c "SET max_parallel_workers_per_gather = $((BATCH_THREADS - 1))" -c "
      SELECT count(*) FROM (
        SELECT b.query, array_agg(b.distance ORDER BY b.rank) AS d
        FROM gpu_metric_knn_batch('bench_${m}_idx', (SELECT array_agg(query ORDER BY id) FROM metric_queries), 10) b
        GROUP BY b.query) x
      JOIN exact_knn e ON e.qid = x.query
      WHERE x.d = (SELECT array_agg(w.word <~> q.query ORDER BY o) FROM metric_queries q, unnest(e.ids) WITH ORDINALITY u(id, o)
                   JOIN bench_seq w ON w.id = u.id WHERE q.id = e.qid)")
    say "$(printf '%-8s %-14s %11.2f%% %10.1f %12s' "k=10" "$m batch" "$share" \
      "$(awk -v s="$secs" -v n="$QUERIES" 'BEGIN { print n / s }')" "$ok/$QUERIES")"
  done
}

# knn_row METHOD SHARE TIMED_SQL IDS_SQL: the 10 nearest by one method.
knn_row() {
  local method=$1 share=$2 sql=$3 ids=$4 out secs ok
  out=$(psql_q -At -F ' ' -c "SET enable_seqscan = off" -c "SELECT * FROM bench_run(\$q\$$sql\$q\$, 10)")
  secs=${out% *}
  ok=$(psql_q -At -c "SELECT knn_found(\$q\$$ids\$q\$)")
  say "$(printf '%-8s %-14s %11.2f%% %10.1f %12s' "k=10" "$method" \
    "$(awk -v s="$share" 'BEGIN { print 100 * s }')" \
    "$(awk -v s="$secs" -v n="$QUERIES" 'BEGIN { print n / s }')" "$ok/$QUERIES")"
}

main "$@"
