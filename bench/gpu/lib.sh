# Shared by the SQL benchmarks of bench/gpu: server settings and the data,
# tools/gen_synthetic's set (seed 42, as bench/cpu/run.sh), loaded as tables
# base (id, v) and queries (qid, v, gt: the exact top-100 ids).
# Needs PGDATA, as_pg (the device kit's env.sh), N and DATA.
. bench/gpu/data.sh

# bench_setup EXTRA_CONF DROP_TABLES: preloads gpu_ivfpq with large buffers
# (plus EXTRA_CONF lines), restarts, makes the data if missing, and loads it
# after dropping DROP_TABLES (besides base and queries).
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
CREATE TABLE queries (qid int PRIMARY KEY, v real[], gt int[]);
COPY queries FROM '$DATA/queries.txt';
SQL
  # The base rows straight from the generator, as COPY text.
  "$GEN" --rows "$N" --threads "$(nproc)" | psql -qc "COPY base (id, v) FROM STDIN" || return 1
  psql -qc "VACUUM ANALYZE base"
}
