# Shared by the SQL benchmarks of bench/gpu: server settings and the data,
# tools/gen_synthetic's set (seed 42, as bench/cpu/run.sh), loaded as tables
# base (id, v) and queries (qid, v, gt: the exact top-100 ids).
# Needs PGDATA, as_pg (the device kit's env.sh), N and DATA.
. bench/gpu/data.sh

# bench_setup EXTRA_CONF DROP_TABLES: preloads gpu_ivfpq with large buffers
# (plus EXTRA_CONF lines), restarts, makes the data if missing, and loads it
# after dropping DROP_TABLES (besides base and queries); DATASET (data.sh)
# chooses the data. STORAGE (plain,
# main, external, extended): the base table's vector column's storage.
bench_setup() {
  local extra=$1 drop=$2
  {
    echo "shared_preload_libraries = 'gpu_ivfpq'"
    echo "shared_buffers = '8GB'"
    echo "maintenance_work_mem = '4GB'"
    echo "max_parallel_maintenance_workers = 15"
    echo "dynamic_shared_memory_type = mmap"
    printf '%s\n' "$extra"
  } >>"$PGDATA/postgresql.conf"
  as_pg pg_ctl -D "$PGDATA" -l /tmp/pgkit-server.log -w restart >/dev/null
  for _ in $(seq 50); do
    psql -qAtc "SELECT 1" >/dev/null 2>&1 && break
    sleep 0.2
  done
  make_data "$DATA" "$N" || return 1
  [ -s "$DATA/queries.txt" ] || python3 bench/gpu/ground_truth.py "$DATA" 1000 || return 1
  chmod -R a+rX "$DATA"
  psql -q <<SQL
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
DROP TABLE IF EXISTS base, queries${drop:+, $drop};
CREATE TABLE base (id int4, v real[]);
${STORAGE:+ALTER TABLE base ALTER COLUMN v SET STORAGE $STORAGE;}
CREATE TABLE queries (qid int PRIMARY KEY, v real[], gt int[]);
COPY queries FROM '$DATA/queries.txt';
SQL
  # The base rows straight from the generator, as COPY text; a large set
  # through several COPYs side by side (one server process parses each).
  if [ "${DATASET:-}" = fashion-mnist ]; then
    "$FMNIST" --set train --no-label | psql -qc "COPY base (id, v) FROM STDIN" || return 1
    psql -qc "VACUUM ANALYZE base"
    return
  fi
  local parts=$(( N >= 2000000 ? ($(nproc) / 2 > 8 ? 8 : ($(nproc) / 2 < 1 ? 1 : $(nproc) / 2)) : 1 )) p pids=()
  for p in $(seq 0 $((parts - 1))); do
    "$GEN" --rows "$N" --dim "${DIM:-128}" --threads "$(( parts > 1 ? 2 : $(nproc) ))" --part "$p/$parts" | psql -qc "COPY base (id, v) FROM STDIN" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || return 1; done
  psql -qc "VACUUM ANALYZE base"
}

# recall_at_10 DEVICE PROBES [more -c settings]: recall@10 of base's index
# scans for the 1000 queries against their exact top 10.
recall_at_10() {
  PGOPTIONS="-c gpu_ivfpq.device=$1 -c gpu_ivfpq.probes=$2 -c enable_seqscan=off ${3:-}" psql -qAt <<'SQL'
SELECT round(avg(hit) / 10, 4) FROM queries q, LATERAL (
  SELECT count(*) AS hit FROM (SELECT id FROM base ORDER BY v <-> q.v LIMIT 10) r
  WHERE r.id = ANY (q.gt[1:10])) h;
SQL
}

# restart_with "[VAR=VALUE ...]": the server restarted with those variables
# in its environment (none: as started), its GPU process up and the index
# mirrored again.
restart_with() {
  # shellcheck disable=SC2086
  as_pg env $1 pg_ctl -D "$PGDATA" -l /tmp/pgkit-server.log -w restart >/dev/null
  for _ in $(seq 300); do
    [ "$(psql -qAtc "SELECT state = 'running (GPU)' FROM gpu_ivfpq_status" 2>/dev/null)" = t ] && break
    sleep 0.2
  done
  psql -qAtc "SELECT gpu_ivfpq_prewarm('base_idx')" >/dev/null
}

# set_reload NAME [VALUE]: ALTER SYSTEM SET NAME = VALUE (RESET without a
# value) and a reload, then a moment for the service to pass it on.
set_reload() {
  if [ $# -ge 2 ]; then
    psql -qc "ALTER SYSTEM SET $1 = $2" -c "SELECT pg_reload_conf()" >/dev/null
  else
    psql -qc "ALTER SYSTEM RESET $1" -c "SELECT pg_reload_conf()" >/dev/null
  fi
  sleep 0.5
}

# pg_rate CLIENTS SCRIPT SECS [PGOPTIONS]: "tps p50_ms p99_ms" of pgbench -M
# prepared running SCRIPT (latencies from the per-transaction log).
pg_rate() {
  local dir tps
  dir=$(mktemp -d)
  chmod 777 "$dir"
  (cd "$dir" && PGOPTIONS="${4:-}" pgbench -n -M prepared -c "$1" -j "$(($1 < 16 ? $1 : 16))" \
    -T "$3" -f "$2" --log --log-prefix=lat postgres >out.txt 2>&1) || { cat "$dir/out.txt" >&2; return 1; }
  tps=$(grep -oP 'tps = \K[0-9.]+(?= \(without)' "$dir/out.txt")
  cat "$dir"/lat* | awk '{print $3}' | sort -n | awk -v tps="$tps" '
    { a[NR] = $1 } END { printf "%.0f %.3f %.3f\n", tps, a[int(NR * 0.5)] / 1000, a[int(NR * 0.99)] / 1000 }'
  rm -rf "$dir"
}
