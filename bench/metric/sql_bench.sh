#!/usr/bin/env bash
# Fuzzy string search through SQL (a benchmark, not a test): on the CPU,
# and with SERVICE=1 also through the GPU service.
#
#   bench/metric/sql_bench.sh
#   SERVICE=1 CLIENTS=32 PG_BIN=$(pg_config --bindir) bench/metric/sql_bench.sh
#
# Loads the words of wspanish (86,016) and seeded queries (scripts/
# metric-words.sh: dictionary words with 1 to 3 edits, English words), or
# the words and queries of files (WORDS_FILE, QUERIES_FILE), into a
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
#   lc/sss Ncl     CLIENTS concurrent sessions (pgbench) of index scans, each
#                  transaction one query picked at random (radius rows only)
# With SERVICE=1 every gpu_metric row runs twice: "cpu" with
# gpu_ivfpq.device = cpu (the CPU engine) and "gpu" with gpu_ivfpq.device =
# gpu (the GPU service, or an error: a gpu row is never a CPU row).
# Single-query methods run on one core (max_parallel_workers_per_gather = 0).
# The gpu_metric rows take their evaluation counts from the index's own
# count (its DEBUG1 line), per device; sequential scans compute every
# distance; the trigram prefilter computes one per word it keeps.
#
# Environment (defaults):
#   QUERIES=300       queries (at most the lines of QUERIES_FILE)
#   SEED=1            seed of the generated queries
#   SEQ_QUERIES=QUERIES  the sequential methods (seq <~>, seq levensh.,
#                     trgm+<~>) run only the first SEQ_QUERIES queries
#   BATCH_THREADS=2   engine threads of the batch functions
#   BUILD_THREADS=<cores>  engine threads of the index builds
#   SERVICE=0         1: preload the library (the GPU service) and add the
#                     gpu rows; they need the service running on a GPU
#   EMULATE_GPU=0     1 (implies SERVICE=1): the service emulates its GPU on
#                     the CPU. A test aid for the script: the gpu rows'
#                     figures mean nothing
#   CLIENTS=0         concurrent clients of the Ncl rows (0: no such rows)
#   SECS=5            seconds of each Ncl row
#   WORDS_FILE=       the indexed words, one a line (UTF-8; .xz read with
#                     xz -dc); default wspanish
#   QUERIES_FILE=     the queries, one a line (the first QUERIES; .xz too);
#                     default generated from the words (metric-words.sh)
#   BUILD=0           1: build and install the extension first, as root
#   SKIP_DEPS=1       0: scripts/install-deps.sh first
#   OUT=              also write the output to this file
#   PG_BIN=           PostgreSQL's programs (default the Debian layout)
# Runs as root (the server runs as the postgres OS user) or as the postgres
# user.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib/common.sh"

QUERIES=${QUERIES:-300}
SEED=${SEED:-1}
SEQ_QUERIES=${SEQ_QUERIES:-}
BATCH_THREADS=${BATCH_THREADS:-2}
BUILD_THREADS=${BUILD_THREADS:-$(nproc)}
SERVICE=${SERVICE:-0}
EMULATE_GPU=${EMULATE_GPU:-0}
CLIENTS=${CLIENTS:-0}
SECS=${SECS:-5}
WORDS_FILE=${WORDS_FILE:-}
QUERIES_FILE=${QUERIES_FILE:-}
OUT=${OUT:-}

main() {
  check_settings
  [ "${SKIP_DEPS:-1}" = 1 ] || "$REPO_ROOT/scripts/install-deps.sh"
  if [ -z "$WORDS_FILE" ] && [ ! -r /usr/share/dict/spanish ]; then
    warn "no /usr/share/dict/spanish: install the Debian package wspanish (or give WORDS_FILE)"
    exit 1
  fi
  TMP=$(mktemp -d /tmp/gpu_metric-bench.XXXXXX)
  chmod 755 "$TMP"
  trap 'pg_temp_stop; rm -rf "$TMP"' EXIT
  [ "${BUILD:-0}" = 1 ] && build_extension "$TMP/make.log"

  local conf=("max_parallel_workers_per_gather = 0"
    "max_parallel_maintenance_workers = $((BUILD_THREADS - 1))"
    # Room for the parallel workers of the exact answers.
    "max_worker_processes = $(($(nproc) + 8))" "max_parallel_workers = $(nproc)")
  [ "$CLIENTS" -gt 100 ] && conf+=("max_connections = $((CLIENTS + 20))")
  if [ "$SERVICE" = 1 ]; then
    conf+=("shared_preload_libraries = 'gpu_ivfpq'")
    [ "$EMULATE_GPU" = 1 ] && conf+=("gpu_ivfpq.service_emulate_gpu = on")
  fi
  pg_temp_start "$TMP" "${conf[@]}"
  psql_q -c "CREATE EXTENSION gpu_ivfpq"
  # The gpu rows need the service on a GPU: known before anything is loaded.
  local service_state=""
  if [ "$SERVICE" = 1 ]; then
    service_state=$(wait_for_gpu_service) || exit 1
  fi
  local have_fuzzy have_trgm
  have_fuzzy=$(psql_q -At -c "SELECT count(*) FROM pg_available_extensions WHERE name = 'fuzzystrmatch'")
  have_trgm=$(psql_q -At -c "SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_trgm'")
  [ "$have_fuzzy" = 1 ] && psql_q -c "CREATE EXTENSION fuzzystrmatch"
  [ "$have_trgm" = 1 ] && psql_q -c "CREATE EXTENSION pg_trgm"
  local words_name queries_name
  load_data

  # The queries loaded (fewer where QUERIES_FILE has fewer lines).
  QUERIES=$(psql_q -At -c "SELECT count(*) FROM metric_queries")
  if [ -z "$SEQ_QUERIES" ] || [ "$SEQ_QUERIES" -gt "$QUERIES" ]; then
    SEQ_QUERIES=$QUERIES
  fi
  local kinds seq_note=""
  kinds=$(psql_q -At -c "SELECT string_agg(kind || ' ' || n, ', ' ORDER BY kind) FROM (SELECT kind, count(*) n FROM metric_queries GROUP BY kind) k")
  [ "$SEQ_QUERIES" -lt "$QUERIES" ] && seq_note="; sequential methods on the first $SEQ_QUERIES"
  say "== fuzzy string search: $(psql_q -At -c 'SELECT count(*) FROM metric_words') words of $words_name, $QUERIES queries ($queries_name: $kinds)$seq_note"
  say "machine: $(nproc) cores ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)), $(free -g | awk '/^Mem:/ { print $2 }') GB, $(gpu_description); $("$PG_BIN/postgres" --version)"
  [ "$SERVICE" = 1 ] && say "GPU service: $service_state"

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
  if [ "$SERVICE" = 1 ]; then
    # Both indexes in GPU memory before the first timed search.
    psql_q -At -c "SELECT gpu_metric_prewarm('bench_lc_idx')" -c "SELECT gpu_metric_prewarm('bench_sss_idx')" >/dev/null
  fi

  # bench_run(SQL with $1 = query, $2 = radius or k, the first nq queries):
  # seconds for those queries, one statement each.
  psql_q <<'SQL'
CREATE FUNCTION bench_run(sql text, param int, nq bigint, OUT seconds float8, OUT answers bigint) LANGUAGE plpgsql AS $$
DECLARE
	q record;
	n bigint;
	t timestamptz := clock_timestamp();
BEGIN
	answers := 0;
	-- Once before the clock: the backend restores a gpu_metric index on first use.
	EXECUTE sql INTO n USING (SELECT query FROM metric_queries ORDER BY id LIMIT 1), param;
	t := clock_timestamp();
	FOR q IN SELECT query FROM metric_queries ORDER BY id LIMIT nq LOOP
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
SQL
  exact_tables

  local n
  n=$(psql_q -At -c "SELECT count(*) FROM metric_words")
  DEVICES=("")
  [ "$SERVICE" = 1 ] && DEVICES=(cpu gpu)
  say ""
  say "$(printf '%-8s %-14s %12s %10s %12s' "search" "method" "evaluations" "queries/s" "found")"
  local kept=""
  if [ "$have_trgm" = 1 ]; then
    kept=$(psql_q -At -c "SELECT sum((SELECT count(*) FROM bench_trgm WHERE word % q.query))::float8 / (count(*) * $n)
      FROM (SELECT query FROM metric_queries ORDER BY id LIMIT $SEQ_QUERIES) q")
  fi
  local r
  for r in 1 2 3; do
    local exact seq_exact
    exact=$(psql_q -At -c "SELECT count(*) FROM exact WHERE d <= $r")
    seq_exact=$(psql_q -At -c "SELECT count(*) FROM exact WHERE d <= $r AND qid IN (SELECT id FROM metric_queries ORDER BY id LIMIT $SEQ_QUERIES)")
    row "r=$r" "seq <~>" 1 "SELECT count(*) FROM bench_seq WHERE word <~> \$1 <= \$2" "$r" "$seq_exact" "$SEQ_QUERIES"
    [ "$have_fuzzy" = 1 ] &&
      row "r=$r" "seq levensh." 1 "SELECT count(*) FROM bench_seq WHERE levenshtein(word, \$1) <= \$2" "$r" "$seq_exact" "$SEQ_QUERIES"
    [ "$have_trgm" = 1 ] &&
      row "r=$r" "trgm+<~>" "$kept" "SELECT count(*) FROM bench_trgm WHERE word % \$1 AND word <~> \$1 <= \$2" "$r" "$seq_exact" "$SEQ_QUERIES"
    local m dev
    for m in lc sss; do
      for dev in "${DEVICES[@]}"; do
        indexed "r=$r" "$m" "$dev" "$r" "$exact"
      done
    done
  done
  knn_rows
  say ""
  say "evaluations: distances computed per query, as a share of brute force's ($n per query);"
  say "found: answers returned / exact answers (range), or queries whose 10 nearest equal the exact ones (k=10)."
  say "Single-query methods on one core; batches on $BATCH_THREADS engine threads."
  [ "$SEQ_QUERIES" -lt "$QUERIES" ] &&
    say "seq <~>, seq levensh. and trgm+<~> ran the first $SEQ_QUERIES queries (queries/s and found over those)."
  if [ "$SERVICE" = 1 ]; then
    say "cpu, gpu: the session's gpu_ivfpq.device (gpu: the GPU service, or an error); evaluations as the index reports them on that device."
    say "GPU service: $(psql_q -At -c "SELECT queries_gpu || ' searches on the GPU, ' || gpu_fallbacks || ' fell back to the CPU' FROM gpu_ivfpq_status")."
  fi
  [ "$CLIENTS" -gt 0 ] &&
    say "${CLIENTS}cl: $CLIENTS concurrent sessions for $SECS s (pgbench), each query one of the $QUERIES at random; queries/s: pgbench's tps; evaluations: the single-query row's."
  if [ -n "$OUT" ]; then
    mkdir -p "$(dirname "$OUT")"
    cp "$TMP/log" "$OUT"
    say "written to $OUT"
  fi
}

# Everything said also goes to the log that OUT keeps.
say() { printf '%s\n' "$*" | tee -a "$TMP/log"; }

# Settings that must be whole numbers, and the ones that imply others.
check_settings() {
  local v
  for v in QUERIES SEED BATCH_THREADS BUILD_THREADS CLIENTS SECS; do
    case ${!v} in
      '' | *[!0-9]*) warn "$v must be a whole number (it is '${!v}')"; exit 1 ;;
    esac
  done
  case $SEQ_QUERIES in
    *[!0-9]* | 0) warn "SEQ_QUERIES must be a whole number of at least 1 (it is '$SEQ_QUERIES')"; exit 1 ;;
  esac
  if [ "$QUERIES" -lt 1 ] || [ "$BATCH_THREADS" -lt 1 ] || [ "$BUILD_THREADS" -lt 1 ] || [ "$SECS" -lt 1 ]; then
    warn "QUERIES, BATCH_THREADS, BUILD_THREADS and SECS must be at least 1"
    exit 1
  fi
  [ "$EMULATE_GPU" = 1 ] && SERVICE=1
  local f
  for f in "$WORDS_FILE" "$QUERIES_FILE"; do
    if [ -n "$f" ] && [ ! -r "$f" ]; then
      warn "cannot read $f"
      exit 1
    fi
  done
}

# read_file FILE: its lines (xz -dc where the name ends in .xz), without
# blank lines and carriage returns.
read_file() {
  case $1 in
    *.xz) xz -dc -- "$1" ;;
    *) cat -- "$1" ;;
  esac | tr -d '\r' | awk 'length'
}

# COPY's text format gives \ and the tab a meaning: escape them.
copy_escape() { sed -e 's/\\/\\\\/g' -e 's/\t/\\t/g'; }

# Fills metric_words (id, word) and metric_queries (id, kind, query): ids
# from 1 in the files' order. Sets words_name and queries_name (header).
load_data() {
  if [ -z "$WORDS_FILE" ] && [ -z "$QUERIES_FILE" ]; then
    METRIC_QUERIES=$QUERIES METRIC_SEED=$SEED "$REPO_ROOT/scripts/metric-words.sh" load
    words_name=wspanish
    queries_name="seed $SEED"
    return
  fi
  psql_q <<'SQL'
SET client_min_messages = warning;
DROP TABLE IF EXISTS metric_words, metric_queries;
CREATE TABLE metric_words (id bigserial PRIMARY KEY, word text NOT NULL);
CREATE TABLE metric_queries (id bigserial PRIMARY KEY, kind text NOT NULL, query text NOT NULL);
SQL
  if [ -n "$WORDS_FILE" ]; then
    read_file "$WORDS_FILE" >"$TMP/words.txt"
    words_name=$(basename "$WORDS_FILE")
  else
    read_file /usr/share/dict/spanish >"$TMP/words.txt"
    words_name=wspanish
  fi
  copy_escape <"$TMP/words.txt" | psql_q -c 'COPY metric_words (word) FROM STDIN'
  if [ -n "$QUERIES_FILE" ]; then
    # awk reads to the end: a reader that stops early would fail the pipe.
    read_file "$QUERIES_FILE" | awk -v n="$QUERIES" 'NR <= n' | copy_escape | sed -e 's/^/file\t/' |
      psql_q -c 'COPY metric_queries (kind, query) FROM STDIN'
    queries_name=$(basename "$QUERIES_FILE")
  else
    # Seeded edits of the words loaded (lines "kind<TAB>query").
    "$REPO_ROOT/scripts/metric-words.sh" queries "$QUERIES" "$SEED" "$TMP/words.txt" | sed -e 's/\\/\\\\/g' |
      psql_q -c 'COPY metric_queries (kind, query) FROM STDIN'
    queries_name="seed $SEED"
  fi
  rm -f "$TMP/words.txt"
  psql_q -c 'ANALYZE metric_words, metric_queries'
}

# The GPUs nvidia-smi lists ("2 x NVIDIA H100 80GB HBM3"), or "no GPU".
gpu_description() {
  local gpus=""
  if command -v nvidia-smi >/dev/null 2>&1; then
    gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | sort | uniq -c |
      awk '{ n = $1; sub(/^[[:space:]]*[0-9]+[[:space:]]+/, ""); printf "%s%d x %s", sep, n, $0; sep = ", " }') || gpus=""
  fi
  local d=${gpus:-no GPU}
  if [ "$SERVICE" != 1 ] && [ -n "$gpus" ]; then
    d="$d (unused: SERVICE=0)"
  fi
  if [ "$EMULATE_GPU" = 1 ]; then
    d="$d; the service's GPU emulated on the CPU (a test aid: the gpu rows' figures mean nothing)"
  fi
  printf '%s\n' "$d"
}

# Waits (up to 20 s) for the GPU service to serve on a GPU (or, with
# EMULATE_GPU=1, on its emulation) and prints its state and device; exits
# with the state otherwise.
wait_for_gpu_service() {
  local state=""
  for _ in $(seq 1 40); do
    state=$(psql_q -At -c "SELECT state FROM gpu_ivfpq_status")
    case $state in
      "running (GPU)") break ;;
      "running (GPU emulated"*) [ "$EMULATE_GPU" = 1 ] && break ;;
      "running (no GPU"*) break ;; # for good: no device
    esac
    sleep 0.5
  done
  case $state in
    "running (GPU)") ;;
    "running (GPU emulated"*) [ "$EMULATE_GPU" = 1 ] || state_error "$state" ;;
    *) state_error "$state" ;;
  esac
  printf '%s; its device: %s\n' "$state" "$(psql_q -At -c "SELECT coalesce(device, '-') FROM gpu_ivfpq_status")"
}

state_error() {
  warn "sql_bench: the GPU service is '$1', not 'running (GPU)': the gpu rows (SERVICE=1) need it on a GPU"
  warn "  its device: $(psql_q -At -c "SELECT coalesce(device, '-') || '; last error: ' || coalesce(last_error, '-') FROM gpu_ivfpq_status")"
  if command -v nvidia-smi >/dev/null 2>&1; then
    warn "  nvidia-smi: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | paste -sd ';' || true)"
  else
    warn "  nvidia-smi: not found"
  fi
  warn "  SERVICE=0 gives the CPU rows only; EMULATE_GPU=1 tests the script on a machine without a GPU."
  exit 1
}

# The exact answers of every query: within radius 3 (exact: qid, id, d) and
# the 10 nearest by (distance, id) (exact_knn: qid, ids, ds), by sequential
# scans. A function per query does each scan so that parallel workers can
# share the queries (PostgreSQL 15 runs no correlated subquery in a
# worker), over a copy of the queries spread across pages (the workers take
# pages). Workers only where <~>'s function is parallel safe: otherwise
# its callers may not be, and the scans run serially.
exact_tables() {
  local parallel workers=0
  parallel=$(psql_q -At -c "SELECT p.proparallel FROM pg_operator o JOIN pg_proc p ON p.oid = o.oprcode
    WHERE o.oprname = '<~>' AND o.oprleft = 'text'::regtype AND o.oprright = 'text'::regtype")
  [ "$parallel" = s ] && workers=$(($(nproc) - 1))
  local safety
  case $parallel in s) safety=SAFE ;; r) safety=RESTRICTED ;; *) safety=UNSAFE ;; esac
  psql_q <<SQL
CREATE TABLE exact_queries WITH (fillfactor = 10, parallel_workers = $((workers > 0 ? workers : 1))) AS
	SELECT id, query FROM metric_queries;
VACUUM ANALYZE exact_queries;
CREATE FUNCTION exact_within(q text, r int, OUT ids bigint[], OUT ds int[])
	LANGUAGE plpgsql STABLE PARALLEL $safety COST 1000000 AS \$\$
BEGIN
	SELECT array_agg(w.id ORDER BY w.id), array_agg(w.d ORDER BY w.id) INTO ids, ds
	FROM (SELECT b.id, b.word <~> q AS d FROM bench_seq b OFFSET 0) w WHERE w.d <= r;
END
\$\$;
CREATE FUNCTION exact_nearest(q text, k int, OUT ids bigint[], OUT ds int[])
	LANGUAGE plpgsql STABLE PARALLEL $safety COST 1000000 AS \$\$
BEGIN
	SELECT array_agg(n.id ORDER BY n.d, n.id), array_agg(n.d ORDER BY n.d, n.id) INTO ids, ds
	FROM (SELECT b.id, b.word <~> q AS d FROM bench_seq b ORDER BY 2, 1 LIMIT k) n;
END
\$\$;
SET max_parallel_workers_per_gather = $workers;
CREATE TABLE exact AS
SELECT s.qid, u.id, u.d
FROM (SELECT q.id AS qid, exact_within(q.query, 3) AS a FROM exact_queries q OFFSET 0) s,
	unnest((s.a).ids, (s.a).ds) AS u(id, d);
CREATE TABLE exact_knn AS
SELECT s.qid, (s.a).ids, (s.a).ds
FROM (SELECT q.id AS qid, exact_nearest(q.query, 10) AS a FROM exact_queries q OFFSET 0) s;
RESET max_parallel_workers_per_gather;
CREATE INDEX ON exact (qid);
CREATE UNIQUE INDEX ON exact_knn (qid);
ANALYZE exact, exact_knn;
SQL
}

# The psql options that set the session's device ("": none).
device_options() {
  [ -n "$1" ] && printf '%s\n' -c "SET gpu_ivfpq.device = $1"
  return 0
}

# share_pct SHARE: a share (0..1) as a percentage.
share_pct() { awk -v s="$1" 'BEGIN { print 100 * s }'; }

# rate N SECONDS: queries per second.
rate() { awk -v s="$2" -v n="$1" 'BEGIN { print n / s }'; }

# row LABEL METHOD EVALUATION_SHARE SQL PARAM EXACT NQ [DEVICE]: one
# method, the first NQ queries (an index, where the table has one:
# sequential scans off).
row() {
  local label=$1 method=$2 share=$3 sql=$4 param=$5 exact=$6 nq=$7 dev=${8:-} out secs answers
  local devopts=()
  mapfile -t devopts < <(device_options "$dev")
  out=$(psql_q -At -F ' ' "${devopts[@]}" -c "SET enable_seqscan = off" -c "SELECT * FROM bench_run(\$q\$$sql\$q\$, $param, $nq)")
  secs=${out% *}
  answers=${out#* }
  say "$(printf '%-8s %-14s %11.2f%% %10.1f %12s' "$label" "$method" "$(share_pct "$share")" \
    "$(rate "$nq" "$secs")" "$answers/$exact")"
}

# The evaluation share the batch function reports at DEBUG1 (its search is
# the scan's), on DEVICE: batch_share SQL [DEVICE].
batch_share() {
  local devopts=()
  mapfile -t devopts < <(device_options "${2:-}")
  psql_q "${devopts[@]}" -c "SET client_min_messages = debug1" -c "SET max_parallel_workers_per_gather = $((BATCH_THREADS - 1))" \
    -c "$1" 2>&1 >/dev/null |
    sed -n 's/.*live objects each (\([0-9.]*\)% of brute force).*/\1/p' | tail -n 1
}

# indexed LABEL METHOD DEVICE RADIUS EXACT: index scans, the batch
# function, and the concurrent clients (CLIENTS > 0).
indexed() {
  local label=$1 m=$2 dev=$3 r=$4 exact=$5 share out secs answers suffix=""
  [ -n "$dev" ] && suffix=" $dev"
  local batch="SELECT count(*) FROM gpu_metric_range_batch('bench_${m}_idx', (SELECT array_agg(query ORDER BY id) FROM metric_queries), $r)"
  share=$(batch_share "$batch" "$dev")
  [ -n "$share" ] || { warn "no evaluation count in the DEBUG1 output of the $m batch${suffix}"; exit 1; }
  row "$label" "$m$suffix" "$(awk -v s="$share" 'BEGIN { print s / 100 }')" \
    "SELECT count(*) FROM bench_$m WHERE word <% edit_range(\$1, \$2)" "$r" "$exact" "$QUERIES" "$dev"
  local devopts=()
  mapfile -t devopts < <(device_options "$dev")
  out=$(psql_q -At -F ' ' "${devopts[@]}" -c "SET max_parallel_workers_per_gather = $((BATCH_THREADS - 1))" \
    -c "SELECT * FROM bench_once(\$q\$$batch\$q\$)")
  secs=${out% *}
  answers=${out#* }
  say "$(printf '%-8s %-14s %11.2f%% %10.1f %12s' "$label" "$m batch$suffix" "$share" \
    "$(rate "$QUERIES" "$secs")" "$answers/$exact")"
  [ "$CLIENTS" -gt 0 ] && clients_row "$label" "$m" "$dev" "$r" "$share"
  return 0
}

# clients_row LABEL METHOD DEVICE RADIUS SHARE_PCT: CLIENTS sessions of
# index scans for SECS seconds (pgbench), each transaction a random query.
clients_row() {
  local label=$1 m=$2 dev=$3 r=$4 share=$5 script out tps suffix="" opts="-c enable_seqscan=off"
  [ -n "$dev" ] && { suffix=" $dev"; opts="$opts -c gpu_ivfpq.device=$dev"; }
  script=$TMP/clients-$m-$r.sql
  {
    printf '\\set q random(1, %d)\n' "$QUERIES"
    printf 'SELECT count(*) FROM bench_%s WHERE word <%% edit_range((SELECT query FROM metric_queries WHERE id = :q), %d);\n' "$m" "$r"
  } >"$script"
  if ! out=$(PGOPTIONS=$opts "$PG_BIN/pgbench" -n -c "$CLIENTS" -j "$CLIENTS" -T "$SECS" -f "$script" 2>&1); then
    printf '%s\n' "$out" | tail -n 20 >&2
    warn "sql_bench: pgbench failed ($m$suffix, radius $r, $CLIENTS clients)"
    exit 1
  fi
  tps=$(printf '%s\n' "$out" | sed -n 's/^tps = \([0-9.]*\) .*/\1/p' | tail -n 1)
  [ -n "$tps" ] || { printf '%s\n' "$out" >&2; warn "sql_bench: no tps in pgbench's output"; exit 1; }
  say "$(printf '%-8s %-14s %11.2f%% %10.1f %12s' "$label" "$m$suffix ${CLIENTS}cl" "$share" "$tps" "-")"
}

# The 10 nearest (ORDER BY ... LIMIT 10), every method.
knn_rows() {
  local ok share secs
  # Queries (the first nq) whose 10 nearest by a method are at the exact
  # distances (ties may differ by id where a method orders them otherwise;
  # all are exact). metric_words has the ids' index.
  psql_q <<'SQL'
CREATE FUNCTION knn_found(sql text, nq bigint) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
	q record;
	ids bigint[];
	n bigint := 0;
BEGIN
	FOR q IN SELECT m.id, m.query, e.ds FROM metric_queries m JOIN exact_knn e ON e.qid = m.id ORDER BY m.id LIMIT nq LOOP
		EXECUTE sql INTO ids USING q.query;
		IF (SELECT array_agg(w.word <~> q.query ORDER BY o) FROM unnest(ids) WITH ORDINALITY u(id, o) JOIN metric_words w ON w.id = u.id)
		   = q.ds THEN
			n := n + 1;
		END IF;
	END LOOP;
	RETURN n;
END
$$;
SQL
  knn_row "seq <~>" 1 "SELECT count(*) FROM (SELECT id FROM bench_seq ORDER BY word <~> \$1 LIMIT 10) x" \
    "SELECT ARRAY(SELECT id FROM bench_seq ORDER BY word <~> \$1 LIMIT 10)" "$SEQ_QUERIES"
  [ "$(psql_q -At -c "SELECT count(*) FROM pg_extension WHERE extname = 'fuzzystrmatch'")" = 1 ] &&
    knn_row "seq levensh." 1 "SELECT count(*) FROM (SELECT id FROM bench_seq ORDER BY levenshtein(word, \$1) LIMIT 10) x" \
      "SELECT ARRAY(SELECT id FROM bench_seq ORDER BY levenshtein(word, \$1) LIMIT 10)" "$SEQ_QUERIES"
  local m dev
  for m in lc sss; do
    for dev in "${DEVICES[@]}"; do
      local suffix="" devopts=()
      [ -n "$dev" ] && suffix=" $dev"
      mapfile -t devopts < <(device_options "$dev")
      local batch="SELECT count(*) FROM gpu_metric_knn_batch('bench_${m}_idx', (SELECT array_agg(query ORDER BY id) FROM metric_queries), 10)"
      share=$(batch_share "$batch" "$dev")
      [ -n "$share" ] || { warn "no evaluation count in the DEBUG1 output of the $m k-NN batch${suffix}"; exit 1; }
      knn_row "$m$suffix" "$(awk -v s="$share" 'BEGIN { print s / 100 }')" \
        "SELECT count(*) FROM (SELECT id FROM bench_$m ORDER BY word <~> \$1 LIMIT 10) x" \
        "SELECT ARRAY(SELECT id FROM bench_$m ORDER BY word <~> \$1 LIMIT 10)" "$QUERIES" "$dev"
      secs=$(psql_q -At "${devopts[@]}" -c "SET max_parallel_workers_per_gather = $((BATCH_THREADS - 1))" \
        -c "SELECT seconds FROM bench_once(\$q\$$batch\$q\$)")
      # The batch's query numbers are the array's ordinals: the ids (from 1).
      ok=$(psql_q -At "${devopts[@]}" -c "SET max_parallel_workers_per_gather = $((BATCH_THREADS - 1))" -c "
        SELECT count(*) FROM (
          SELECT b.query, array_agg(b.distance ORDER BY b.rank) AS d
          FROM gpu_metric_knn_batch('bench_${m}_idx', (SELECT array_agg(query ORDER BY id) FROM metric_queries), 10) b
          GROUP BY b.query) x
        JOIN exact_knn e ON e.qid = x.query
        WHERE x.d = e.ds")
      say "$(printf '%-8s %-14s %11.2f%% %10.1f %12s' "k=10" "$m batch$suffix" "$share" \
        "$(rate "$QUERIES" "$secs")" "$ok/$QUERIES")"
    done
  done
}

# knn_row METHOD SHARE TIMED_SQL IDS_SQL NQ [DEVICE]: the 10 nearest by one
# method, the first NQ queries.
knn_row() {
  local method=$1 share=$2 sql=$3 ids=$4 nq=$5 dev=${6:-} out secs ok devopts=()
  mapfile -t devopts < <(device_options "$dev")
  out=$(psql_q -At -F ' ' "${devopts[@]}" -c "SET enable_seqscan = off" -c "SELECT * FROM bench_run(\$q\$$sql\$q\$, 10, $nq)")
  secs=${out% *}
  ok=$(psql_q -At "${devopts[@]}" -c "SET enable_seqscan = off" -c "SELECT knn_found(\$q\$$ids\$q\$, $nq)")
  say "$(printf '%-8s %-14s %11.2f%% %10.1f %12s' "k=10" "$method" "$(share_pct "$share")" \
    "$(rate "$nq" "$secs")" "$ok/$nq")"
}

main "$@"
