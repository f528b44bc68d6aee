# Shared by the SQL benchmarks of bench/gpu: server settings and the
# deterministic SIFT-like data, loaded as tables base and queries.
# Needs PGDATA, as_pg (the device kit's env.sh), N and DATA.

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
  [ -f "$DATA/base.copy" ] || python3 bench/gpu/make_sift_like.py "$DATA" "$N" 1000 128
  chmod -R a+rX "$DATA"
  psql -q <<SQL
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
DROP TABLE IF EXISTS base, queries${drop:+, $drop};
CREATE TABLE base (id int4, v real[]);
COPY base FROM '$DATA/base.copy' WITH (FORMAT binary);
CREATE TABLE queries (qid int PRIMARY KEY, v real[], gt int[]);
COPY queries FROM '$DATA/queries.txt';
VACUUM ANALYZE base;
SQL
}
