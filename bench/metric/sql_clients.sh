#!/bin/bash
# gpu_metric index scans from many connections through SQL (a benchmark,
# not a test), on a server with gpu_ivfpq preloaded and its GPU service up
# (the GPU machine's kit: bench/gpu/device_build.sh first).
#
# Loads a word list (WORDS, default /usr/share/dict/spanish, one word a
# line) under a List of Clusters index, and 1000 queries: words of the list
# with one letter changed (seeded). Then for each of CLIENTS (default
# "1 32 64") pgbench runs for SECS seconds (default 5) range scans within
# one edit and 10-NN scans, each transaction a query at random:
#   SELECT count(*) FROM words WHERE w <% edit_range((SELECT q FROM qs WHERE qid = :q), 1)
#   SELECT id FROM words ORDER BY w <~> (SELECT q FROM qs WHERE qid = :q) LIMIT 10
# with gpu_ivfpq.device = gpu (the GPU, or an error) and = cpu (the CPU
# engine), and prints queries/s, the median latency and, for the GPU rows,
# the mean batch of the GPU's calls (the status view).
#
# usage: bench/metric/sql_clients.sh   (OUT: folder for metric-clients.txt)
set -euo pipefail
WORDS=${WORDS:-/usr/share/dict/spanish}
CLIENTS=${CLIENTS:-1 32 64}
SECS=${SECS:-5}
RES=${OUT:-/tmp}/metric-clients.txt
. "${PGENV:-/opt/pg/env.sh}"
say() { echo "$*" | tee -a "$RES"; }
: >"$RES"

if [ "$(psql -qAtc 'SHOW shared_preload_libraries')" != gpu_ivfpq ]; then
  echo "shared_preload_libraries = 'gpu_ivfpq'" >>"$PGDATA/postgresql.conf"
  echo "max_connections = 300" >>"$PGDATA/postgresql.conf"
  as_pg pg_ctl -D "$PGDATA" -l /tmp/pgkit-server.log -w restart >/dev/null
fi
for _ in $(seq 100); do
  [ "$(psql -qAtc "SELECT state LIKE 'running (GPU%' OR state LIKE '%emulated%' FROM gpu_ivfpq_status" 2>/dev/null)" = t ] && break
  psql -qc 'CREATE EXTENSION IF NOT EXISTS gpu_ivfpq' >/dev/null 2>&1 || true
  sleep 0.2
done

psql -q <<SQL
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
DROP TABLE IF EXISTS words, qs;
CREATE TABLE words (id serial PRIMARY KEY, w text);
\\copy words (w) FROM '$WORDS'
SELECT setseed(0.42) \\gset
CREATE TABLE qs AS
  SELECT row_number() OVER () AS qid,
         overlay(w PLACING chr(97 + (random() * 25)::int) FROM 1 + (random() * greatest(length(w) - 1, 0))::int FOR 1) AS q
  FROM (SELECT w FROM words WHERE length(w) > 0 ORDER BY random() LIMIT 1000) s;
CREATE UNIQUE INDEX ON qs (qid);
VACUUM ANALYZE words, qs;
SQL
t0=$(date +%s.%N)
psql -qc "CREATE INDEX words_lc ON words USING gpu_metric (w) WITH (method = lc)"
say "# gpu_metric scans by many clients: $(psql -qAtc 'SELECT count(*) FROM words') words of $(basename "$WORDS"), 1000 queries (one letter changed), List of Clusters (bucket 32)"
say "# device: $(psql -qAtc 'SELECT device FROM gpu_ivfpq_status'); $(nproc) CPU cores; $SECS s per row; $(date -u +%F' '%T) UTC"
say "# CREATE INDEX: $(awk "BEGIN { printf \"%.2f\", $(date +%s.%N) - $t0 }") s; prewarm: $(psql -qAtc "SELECT gpu_metric_prewarm('words_lc')") live words"

work=$(mktemp -d)
chmod 755 "$work"
cat >"$work/range.sql" <<'Q'
\set q random(1, 1000)
SELECT count(*) FROM words WHERE w <% edit_range((SELECT q FROM qs WHERE qid = :q), 1);
Q
cat >"$work/knn.sql" <<'Q'
\set q random(1, 1000)
SELECT id FROM words ORDER BY w <~> (SELECT q FROM qs WHERE qid = :q) LIMIT 10;
Q
chmod 644 "$work"/*.sql

# bench DEVICE CLIENTS SCRIPT: "tps p50_ms"
bench() {
  local dev=$1 clients=$2 script=$3 dir tps
  dir=$(mktemp -d)
  chmod 777 "$dir"
  (cd "$dir" && PGOPTIONS="-c gpu_ivfpq.device=$dev -c enable_seqscan=off -c enable_bitmapscan=off" \
    pgbench -n -M prepared -c "$clients" -j "$((clients < 16 ? clients : 16))" -T "$SECS" -f "$script" \
    --log --log-prefix=lat postgres >out.txt 2>&1) || { cat "$dir/out.txt" >&2; return 1; }
  tps=$(grep -oP 'tps = \K[0-9.]+(?= \(without)' "$dir/out.txt")
  cat "$dir"/lat* | awk '{print $3}' | sort -n | awk -v tps="$tps" '
    { a[NR] = $1 } END { printf "%.0f %.3f\n", tps, a[int(NR * 0.5)] / 1000 }'
  rm -rf "$dir"
}
snap() { psql -qAtc "SELECT batches || ' ' || queries_gpu FROM gpu_ivfpq_status"; }

say ""
say "| scan | device | clients | queries/s | p50 ms | mean GPU batch |"
say "|---|---|---|---|---|---|"
for scan in range knn; do
  for dev in gpu cpu; do
    for c in $CLIENTS; do
      read -r b0 q0 < <(snap)
      read -r qps p50 < <(bench "$dev" "$c" "$work/$scan.sql")
      read -r b1 q1 < <(snap)
      say "$(awk -v s="$scan" -v d="$dev" -v c="$c" -v t="$qps" -v p="$p50" -v b="$((b1 - b0))" -v q="$((q1 - q0))" 'BEGIN {
        printf "| %s | %s | %d | %d | %.3f | %s |", s, d, c, t, p, (d == "gpu" && b > 0 ? sprintf("%.1f", q / b) : "-") }')"
    done
  done
done
psql -qAtc "SELECT 'fallbacks: ' || gpu_fallbacks || ', last error: ' || coalesce(last_error, '-') FROM gpu_ivfpq_status" | tee -a "$RES"
rm -rf "$work"
