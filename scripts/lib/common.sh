# Shared shell helpers for scripts/ and bench/ (source it; bash only).
# Sets REPO_ROOT from this file's location and PG_BIN (from PG_CONFIG when set); offers:
#   build_extension      make + make install of the extension (quiet)
#   build_tools          builds tools/ into $TOOLS_BUILD (quiet)
#   pg_temp_start DIR    throwaway server as the postgres OS user in DIR
#   pg_temp_stop         stops it (safe to call twice)
#   free_port            prints a TCP port nobody listens on
#   run_quiet LOG CMD..  runs CMD with output to LOG; prints LOG's tail on failure

REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# The PostgreSQL to use: PG_CONFIG's (scripts/install-postgres.sh prints the
# one of each version), else PG_BIN, else Debian's PG_MAJOR (15).
PG_MAJOR=${PG_MAJOR:-15}
if [ -n "${PG_CONFIG:-}" ]; then
  PG_BIN=$("$PG_CONFIG" --bindir) || { printf 'PG_CONFIG=%s does not run\n' "$PG_CONFIG" >&2; exit 2; }
fi
PG_BIN=${PG_BIN:-/usr/lib/postgresql/$PG_MAJOR/bin}
TOOLS_BUILD=${TOOLS_BUILD:-$REPO_ROOT/build-tools}
export PATH="$PG_BIN:$PATH"

# Parallel jobs for builds (the CI machine has 2 cores).
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

say() { printf '%s\n' "$*"; }
warn() { printf '%s\n' "$*" >&2; }

run_quiet() {
  local log=$1; shift
  if ! "$@" >"$log" 2>&1; then
    tail -n 80 "$log" >&2
    warn "FAILED: $* (full log: $log)"
    return 1
  fi
}

# Builds and installs the extension with PGXS. LLVM bitcode is off unless
# WITH_LLVM=yes (Debian's PGXS wants clang for it, which is not installed).
# By default the build runs in a fresh copy of the sources, so that the work
# tree's objects stay as they were. EXT_BUILD_IN_PLACE=1 builds in the work
# tree (the Makefile rebuilds objects whose headers or flags changed):
# run-tests.sh does, so that the unit tests link the installed objects.
build_extension() {
  local log=${1:-$(mktemp /tmp/gpu_ivfpq-make.XXXXXX)}
  if [ ! -f "$REPO_ROOT/Makefile" ]; then
    warn "no Makefile at the repository root: the extension cannot be built"
    return 1
  fi
  local dir=$REPO_ROOT tmp="" rc=0
  if [ "${EXT_BUILD_IN_PLACE:-0}" != 1 ]; then
    tmp=$(mktemp -d /tmp/gpu_ivfpq-ext.XXXXXX)
    tar -C "$REPO_ROOT" --exclude=./.git --exclude=./build --exclude='./build-*' \
        --exclude='*.o' --exclude='*.a' --exclude='*.so' --exclude='*.bc' --exclude=./results \
        --exclude=./tmp_check -cf - . | tar -C "$tmp" -xf -
    dir=$tmp
  fi
  # GPU_IVFPQ_CUDA_LIB (an absolute path): link the CUDA kernels (GPU machine).
  run_quiet "$log" make -C "$dir" -j"$JOBS" with_llvm="${WITH_LLVM:-no}" \
      PG_CONFIG="$PG_BIN/pg_config" ${GPU_IVFPQ_CUDA_LIB:+GPU_IVFPQ_CUDA_LIB="$GPU_IVFPQ_CUDA_LIB"} \
      all install || rc=$?
  [ -n "$tmp" ] && rm -rf "$tmp"
  return "$rc"
}

build_tools() {
  local log=${1:-$(mktemp /tmp/gpu_ivfpq-tools.XXXXXX)}
  run_quiet "$log" cmake -S "$REPO_ROOT/tools" -B "$TOOLS_BUILD" -DCMAKE_BUILD_TYPE=Release &&
  run_quiet "$log.build" cmake --build "$TOOLS_BUILD" -j"$JOBS" || return 1
  for t in gen_synthetic fmnist_load knn_bench; do
    if [ ! -x "$TOOLS_BUILD/$t" ]; then
      warn "tools: $t was not built (see $log)"
      return 1
    fi
  done
}

free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$(( 20000 + RANDOM % 30000 ))
    # Nothing answers on TCP, and no socket file of another server of ours.
    if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  return 1
}

# pg_temp_start DIR [extra postgresql.conf lines...]
# DIR must exist; it becomes owned by postgres and holds the data directory,
# the socket and the log. Exports PGHOST, PGPORT, PGUSER, PGDATABASE and
# PG_TEMP_DIR. Listens on the unix socket only.
pg_temp_start() {
  PG_TEMP_DIR=$1; shift
  id postgres >/dev/null 2>&1 || { warn "no postgres OS user (install postgresql-$PG_MAJOR)"; return 1; }
  chown postgres: "$PG_TEMP_DIR"
  chmod 755 "$PG_TEMP_DIR"
  if ! runuser -u postgres -- test -w "$PG_TEMP_DIR"; then
    warn "the postgres OS user cannot reach $PG_TEMP_DIR (a parent folder is not searchable)"
    return 1
  fi
  PGPORT=${PGPORT_WANTED:-$(free_port)}
  if ! runuser -u postgres -- "$PG_BIN/initdb" -D "$PG_TEMP_DIR/data" -A trust -U postgres \
        --no-locale -E UTF8 >"$PG_TEMP_DIR/initdb.log" 2>&1; then
    cat "$PG_TEMP_DIR/initdb.log" >&2
    return 1
  fi
  {
    echo "listen_addresses = ''"
    echo "port = $PGPORT"
    echo "unix_socket_directories = '$PG_TEMP_DIR'"
    echo "fsync = off"
    echo "synchronous_commit = off"
    echo "full_page_writes = off"
    echo "jit = off"
    echo "shared_buffers = ${PG_SHARED_BUFFERS:-512MB}"
    echo "maintenance_work_mem = ${PG_MAINTENANCE_WORK_MEM:-1GB}"
    echo "work_mem = 64MB"
    echo "max_wal_size = 8GB"
    echo "checkpoint_timeout = 1h"
    echo "logging_collector = off"
    for line in "$@"; do echo "$line"; done
  } >>"$PG_TEMP_DIR/data/postgresql.conf"
  if ! runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_TEMP_DIR/data" -l "$PG_TEMP_DIR/server.log" \
        -w -t 60 start >/dev/null 2>&1; then
    tail -n 40 "$PG_TEMP_DIR/server.log" >&2
    warn "could not start the temporary server"
    return 1
  fi
  export PGHOST=$PG_TEMP_DIR PGPORT PGUSER=postgres PGDATABASE=postgres PG_TEMP_DIR
}

pg_temp_stop() {
  if [ -n "${PG_TEMP_DIR:-}" ] && [ -f "$PG_TEMP_DIR/data/postmaster.pid" ]; then
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_TEMP_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
}

# psql with the temporary server's environment, stopping at the first error.
psql_q() {
  "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$@"
}

# ---------------------------------------------------------------- data + index
# (need a server from pg_temp_start and tools from build_tools; the tools
# connect through the PGHOST/PGPORT/... environment that pg_temp_start exports)

# load_fmnist TABLE train|test [LIMIT]: table (id bigint, label int, embedding real[]),
# raw pixel values 0..255 as floats.
load_fmnist() {
  local table=$1 set=$2 limit=${3:-0}
  psql_ -c "CREATE TABLE $table (id bigint PRIMARY KEY, label int, embedding real[])" || return 1
  "$TOOLS_BUILD/fmnist_load" --set "$set" --limit "$limit" --table "$table" || return 1
  psql_ -c "VACUUM ANALYZE $table"
}

# load_synthetic TABLE ROWS [SEED]: table (id bigint, embedding real[]) from gen_synthetic.
load_synthetic() {
  local table=$1 rows=$2 seed=${3:-42}
  psql_ -c "CREATE TABLE $table (id bigint, embedding real[])" || return 1
  "$TOOLS_BUILD/gen_synthetic" --rows "$rows" --seed "$seed" --table "$table" || return 1
  psql_ -c "ALTER TABLE $table ADD PRIMARY KEY (id)" -c "VACUUM ANALYZE $table"
}

# create_index_timed TABLE LISTS M [OPCLASS]: creates <TABLE>_ivfpq and
# prints the wall-clock seconds CREATE INDEX took.
create_index_timed() {
  local table=$1 lists=$2 m=$3 opclass=${4:-}
  local t0=$EPOCHREALTIME
  psql_ -c "CREATE INDEX ${table}_ivfpq ON $table USING gpu_ivfpq (embedding $opclass) WITH (lists = $lists, m = $m)" >&2 || return 1
  local t1=$EPOCHREALTIME
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f\n", b - a }'
}

psql_() { psql_q "$@"; }

# duration_since T0: seconds (2 decimals) since an $EPOCHREALTIME value.
duration_since() {
  awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'
}
