#!/usr/bin/env bash
# The one test command of gpu_ivfpq (CI runs it through .ci/run, as root).
#
#   scripts/run-tests.sh [--skip-deps] [--keep] [--only SUITES]
#
# A thin wrapper over the build's own test targets. Suites, in order (a suite
# with no tests is skipped, not failed):
#   unit     cmake -S . -B build, build, ctest: the GoogleTest binary links
#            the engine and device objects the Makefile compiles for the
#            extension (`make core`)
#   regress  builds and installs the extension in the work tree (make all
#            install) and pgvector from ../shared/third_party (for the
#            pgvector test, skipped without it), then, as the postgres OS
#            user in a staged copy, `make installcheck` (pg_regress,
#            temporary instance) and `make installcheck-service` (the same
#            suite plus service_status on an instance preloading gpu_ivfpq)
#   tap      `make prove_installcheck` (test/t/*.pl) as postgres; the tools
#            (gen_synthetic, fmnist_load, knn_bench) are built first and their
#            folder is passed as GPU_IVFPQ_TOOLS_BIN (empty if they failed),
#            and Citus from ../shared/third_party (for the Citus test,
#            skipped without it)
#   tools    builds tools/ and checks them end to end on a throwaway server
#            (gen_synthetic, fmnist_load, knn_bench; with the extension
#            installed, also a small gpu_ivfpq index through knn_bench)
#
#   versions the regress suite (plain and with the service) on each other
#            PostgreSQL major version of PG_VERSIONS (default "16 17 18"),
#            installed by scripts/install-postgres.sh, the extension and
#            pgvector built for it; on 18 also the TAP files of TAP_FILES_18
#            (those that exercise version-sensitive code, and the pg_upgrade
#            test from 15)
#
# The CI machine has 2 cores: suites that share nothing run side by side
# (the CUDA kernels build beside the unit suite; the other versions run in
# one lane beside the first version's regress, tap and tools; each regress
# suite's plain and service runs side by side; TAP_JOBS TAP files at a time,
# default 2). Each side's output is printed in one piece when it ends, with
# its times ("time: NAME N s").
#
# --skip-deps (or SKIP_DEPS=1) skips scripts/install-deps.sh; --keep keeps the
# staged copy under /tmp; --only takes a comma list of suite names. The
# first suites run on the PostgreSQL of PG_CONFIG (default Debian's 15);
# PG_VERSIONS="" runs no other version.
# GPU_IVFPQ_EXPECT_GPU=1 makes the service suites use (and require) the GPU;
# GPU_IVFPQ_CUDA_LIB links the GPU process to the CUDA kernels; TEMP_CONFIG adds
# settings to every test instance; PROVE_FLAGS is passed to prove (TAP_JOBS
# sets its -j unless it has one); TAP_FILES (names such as 011_gpu_faults.pl)
# limits the tap suite to those files;
# PGVECTOR_TARBALL and CITUS_TARBALL name other source archives of pgvector
# and Citus than those in ../shared/third_party.
# Quiet on success; on failure prints the logs and diffs. Ends with the line
# "N passed, N failed" (ctest tests + pg_regress tests + TAP files + tool
# checks; a build that fails counts as one failure) and exits non-zero when
# anything failed.
set -uo pipefail

source "$(dirname "${BASH_SOURCE[0]}")/lib/common.sh"

SKIP_DEPS=${SKIP_DEPS:-0}
KEEP=0
ONLY="unit,regress,tap,tools,versions"
while [ $# -gt 0 ]; do
  case "$1" in
    --skip-deps) SKIP_DEPS=1 ;;
    --keep) KEEP=1 ;;
    --only) ONLY=$2; shift ;;
    --only=*) ONLY=${1#--only=} ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) warn "unknown option $1"; exit 2 ;;
  esac
  shift
done
want() { [[ ",$ONLY," == *",$1,"* ]]; }

if [ "$(id -u)" -ne 0 ]; then
  warn "run-tests.sh runs as root: it installs packages and the extension, and runs"
  warn "the test servers as the postgres OS user through runuser"
  exit 2
fi

PASSED=0
FAILED=0
FAILURES=()
SKIPS=()
pass() { PASSED=$((PASSED + ${1:-1})); }
fail() { FAILED=$((FAILED + ${2:-1})); FAILURES+=("$1"); }
skip() { SKIPS+=("$1"); }

# ------------------------------------------------------------------ lanes
# The CI machine has 2 cores, and most of a suite's time goes to one server
# backend answering one client (pg_regress runs its files one by one): so
# suites that share nothing run side by side, each in a "lane", a background
# subshell whose output goes to a file and whose tallies are added to the
# run's when lane_wait collects it (which prints the lane's output then, so
# that a lane's lines stay together).
declare -A LANE_PID=()
lane_start() {  # lane_start NAME CMD...
  local name=$1
  shift
  (
    PASSED=0 FAILED=0 FAILURES=() SKIPS=() LANE_PID=()
    "$@"
    {
      printf 'lane_passed=%d\nlane_failed=%d\n' "$PASSED" "$FAILED"
      for f in "${FAILURES[@]}"; do printf 'lane_failures+=(%q)\n' "$f"; done
      for f in "${SKIPS[@]}"; do printf 'lane_skips+=(%q)\n' "$f"; done
    } >"$LOGS/lane-$name.tally"
  ) >"$LOGS/lane-$name.out" 2>&1 </dev/null &
  LANE_PID[$name]=$!
}
lane_wait() {  # lane_wait NAME
  local name=$1 lane_passed=0 lane_failed=0 lane_failures=() lane_skips=()
  [ -n "${LANE_PID[$name]:-}" ] || return 0
  wait "${LANE_PID[$name]}"
  unset "LANE_PID[$name]"
  cat "$LOGS/lane-$name.out"
  if [ -f "$LOGS/lane-$name.tally" ]; then
    source "$LOGS/lane-$name.tally"
    pass "$lane_passed"
    FAILED=$((FAILED + lane_failed))
    FAILURES+=("${lane_failures[@]}")
    SKIPS+=("${lane_skips[@]}")
  else
    fail "$name: the lane ended without its results"
  fi
}

WORK=$(mktemp -d /tmp/gpu_ivfpq-tests.XXXXXX)
LOGS=$WORK/logs
mkdir -p "$LOGS"
# The test servers run as postgres in folders under $WORK (mktemp makes it 700).
chmod 755 "$WORK"
cleanup() {
  local p
  for p in "${LANE_PID[@]}"; do kill "$p" 2>/dev/null; done
  pg_temp_stop
  if [ "$KEEP" = 1 ]; then
    say "kept $WORK"
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

# ------------------------------------------------------------------ deps
if [ "$SKIP_DEPS" != 1 ]; then
  if ! "$REPO_ROOT/scripts/install-deps.sh"; then
    fail "install-deps"
    say "$PASSED passed, $FAILED failed"
    exit 1
  fi
fi

# ------------------------------------------------------------------ unit
run_unit() {
  if [ ! -f "$REPO_ROOT/CMakeLists.txt" ] || ! compgen -G "$REPO_ROOT/test/unit/*.cpp" >/dev/null; then
    skip "unit (no CMakeLists.txt or test/unit/*.cpp)"
    return
  fi
  local build=$REPO_ROOT/build
  if ! run_quiet "$LOGS/unit-configure.log" cmake -S "$REPO_ROOT" -B "$build" \
         -DGPU_IVFPQ_PG_CONFIG="$PG_BIN/pg_config" ||
     ! run_quiet "$LOGS/unit-build.log" cmake --build "$build" -j"$JOBS"; then
    fail "unit: build"
    return
  fi
  local rc=0
  ctest --test-dir "$build" --output-on-failure --timeout "${CTEST_TIMEOUT:-900}" -j"$JOBS" \
    >"$LOGS/ctest.log" 2>&1 || rc=$?
  local line total nfail
  line=$(grep -E '[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$LOGS/ctest.log" | tail -n 1)
  if [ -n "$line" ]; then
    nfail=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
    total=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"$line")
  elif grep -q 'No tests were found' "$LOGS/ctest.log"; then
    skip "unit (ctest found no tests)"
    return
  else
    nfail=1; total=1
  fi
  if [ "$rc" -ne 0 ] || [ "$nfail" -ne 0 ]; then
    cat "$LOGS/ctest.log"
    [ "$nfail" -eq 0 ] && nfail=1 && total=$((total > 0 ? total : 1))
    fail "unit: $nfail of $total ctest tests" "$nfail"
    pass $((total - nfail))
  else
    say "unit: $line"
    pass "$total"
  fi
}

# ------------------------------------------------------------------ extension
# Built in the work tree, not in a copy: the unit tests link the same core
# objects (make core), so the objects tested are the objects installed.
EXT_STATE=none   # none (no Makefile) | ok | failed
build_ext_once() {
  [ "$EXT_STATE" != none ] && return
  if [ ! -f "$REPO_ROOT/Makefile" ]; then
    EXT_STATE=absent
    return
  fi
  if EXT_BUILD_IN_PLACE=1 build_extension "$LOGS/extension-build.log"; then
    EXT_STATE=ok
  else
    EXT_STATE=failed
    fail "extension: make install"
  fi
}

# A copy of the repository's test inputs the postgres user can read and
# write: the make test targets run there as postgres (initdb refuses root).
STAGE=""
stage_repo() {
  [ -n "$STAGE" ] && return
  STAGE=$WORK/stage
  mkdir -p "$STAGE"
  tar -C "$REPO_ROOT" --exclude=./.git --exclude=./build --exclude='./build-*' \
      --exclude='*.o' --exclude='*.a' --exclude='*.so' --exclude='*.bc' \
      --exclude=./results --exclude=./tmp_check --exclude=./log -cf - . | tar -C "$STAGE" -xf -
  mkdir -p "$PORT_DIR"
  chown postgres: "$PORT_DIR"
  chown -R postgres: "$WORK"
  chmod 755 "$WORK"
}

# The TAP clusters of every lane and version reserve their ports in one
# folder (PostgreSQL::Test::Cluster's lock files), so that no two take the
# same port (each staged copy would have a folder of its own).
PORT_DIR=$WORK/portlock

# make TARGET... in the staged copy, as postgres.
stage_make() {
  (cd "$STAGE" && runuser -u postgres -- env PATH="$PG_BIN:$PATH" \
      GPU_IVFPQ_EXPECT_GPU="${GPU_IVFPQ_EXPECT_GPU:-0}" ${TEMP_CONFIG:+TEMP_CONFIG="$TEMP_CONFIG"} \
      GPU_IVFPQ_TOOLS_BIN="${GPU_IVFPQ_TOOLS_BIN:-}" GPU_IVFPQ_UPGRADE_FROM="${GPU_IVFPQ_UPGRADE_FROM:-}" \
      PG_TEST_PORT_DIR="$PORT_DIR" \
      make --no-print-directory PG_CONFIG="$PG_BIN/pg_config" "$@")
}

make_var() {  # prints a variable of the top-level Makefile (PGXS included)
  make -s --no-print-directory -C "$REPO_ROOT" PG_CONFIG="$PG_BIN/pg_config" \
      -f Makefile -f - "print-$1" <<'EOF' 2>/dev/null
print-%: ; $(info $($*))@:
EOF
}

# ------------------------------------------------------------------ third-party
# Projects the tests run with, built from their source release archives kept
# beside the repository, in ../shared/third_party (or shared/third_party
# inside the checkout; a variable names another archive), and installed into
# the server of PG_BIN (neither has a Debian package for PostgreSQL 15).
# Without its archive a project is not built and the tests that need it are
# skipped, saying so (the Makefile and the TAP files look for what is
# installed), unless it is installed already.
declare -A THIRD_PARTY_STATE=()   # name -> ok | absent | failed

# install_third_party NAME ARCHIVE OVERRIDE_VAR CONTROL WHAT BUILD...: once per
# run, finds ARCHIVE (or the file that $OVERRIDE_VAR names), unpacks it into
# $WORK/NAME and runs BUILD there, quietly (log: $LOGS/NAME-build.log).
# CONTROL is the extension's control file name, WHAT the tests it serves.
install_third_party() {
  local name=$1 archive=$2 override=$3 control=$4 what=$5
  shift 5
  [ -n "${THIRD_PARTY_STATE[$name]:-}" ] && return
  local tarball=${!override:-} d
  if [ -z "$tarball" ]; then
    for d in "$REPO_ROOT/../shared/third_party" "$REPO_ROOT/shared/third_party"; do
      if [ -f "$d/$archive" ]; then
        tarball=$d/$archive
        break
      fi
    done
  fi
  if [ -z "$tarball" ] || [ ! -f "$tarball" ]; then
    THIRD_PARTY_STATE[$name]=absent
    if [ -f "$("$PG_BIN/pg_config" --sharedir)/extension/$control.control" ]; then
      say "$name: no $archive in ../shared/third_party: testing the $name installed already"
    else
      say "$name: no $archive in ../shared/third_party: $what is skipped"
      skip "$what (no $archive; $override names one)"
    fi
    return
  fi
  local src=$WORK/$name
  mkdir -p "$src"
  if tar -C "$src" --strip-components=1 -xzf "$tarball" &&
     (cd "$src" && run_quiet "$LOGS/${PG_LABEL:+$PG_LABEL-}$name-build.log" "$@"); then
    THIRD_PARTY_STATE[$name]=ok
  else
    THIRD_PARTY_STATE[$name]=failed
    fail "$name: build from $tarball"
  fi
}

# pgvector, for the regression test of pgvector columns (gpu_ivfpq_pgvector),
# about 20 s. OPTFLAGS= : portable code (no -march=native), as a packaged
# build.
PGVECTOR_VERSION=0.8.6
install_pgvector_once() {
  install_third_party pgvector "pgvector-$PGVECTOR_VERSION.tar.gz" PGVECTOR_TARBALL vector \
    "regress: pgvector" \
    make -j"$JOBS" PG_CONFIG="$PG_BIN/pg_config" OPTFLAGS= with_llvm=no CFLAGS="$(server_cflags)" all install
}

# The server's CFLAGS without the warning options of a newer gcc than this
# one (the PostgreSQL 18 wheel's gcc 14 added -Wmissing-variable-declarations,
# which gcc 12 refuses).
server_cflags() {
  "$PG_BIN/pg_config" --cflags | sed -E 's/(^| )-Wmissing-variable-declarations( |$)/ /'
}

# Citus, for the TAP test of distributed tables (test/t/012_citus.pl), about
# 30 s on 2 cores; its build needs install-deps.sh's liblz4-dev, libzstd-dev
# and libkrb5-dev. --without-libcurl: no usage reports; with_llvm=no: no JIT
# bitcode (Debian's PGXS would want clang, and it would triple the time).
CITUS_VERSION=12.1.10
install_citus_once() {
  install_third_party citus "citus-$CITUS_VERSION.tar.gz" CITUS_TARBALL citus \
    "tap: 012_citus.pl" \
    bash -c 'PG_CONFIG="$1" ./configure --without-libcurl && make -j"$2" with_llvm=no &&
             make with_llvm=no install' citus-build "$PG_BIN/pg_config" "$JOBS"
}

# ------------------------------------------------------------------ regress
# run_regress [service]: `make installcheck` (TAP_TESTS= leaves the TAP files
# to their own suite), or `make installcheck-service`: the same suite plus
# service_status on an instance that preloads gpu_ivfpq so the GPU service
# serves the scans (its CPU emulation of the GPU where there is none; the
# real GPU with GPU_IVFPQ_EXPECT_GPU=1).
run_regress() {
  local variant=${1:-}
  if [ ! -f "$REPO_ROOT/Makefile" ]; then
    skip "regress (no Makefile)"
    return
  fi
  install_pgvector_once
  local tests
  tests=$(make_var REGRESS | xargs)
  if [ -z "$tests" ]; then
    skip "regress (REGRESS is empty)"
    return
  fi
  [ "$variant" = service ] && tests="$tests $(make_var REGRESS_SERVICE)"
  build_ext_once
  if [ "$EXT_STATE" != ok ]; then
    fail "regress: not run, the extension did not build" "$(wc -w <<<"$tests")"
    return
  fi
  stage_repo
  local name=${PG_LABEL:+$PG_LABEL }regress${variant:+-$variant} rc=0
  local log=$LOGS/${name// /-}.log diffs=$STAGE/regression.diffs instance=$STAGE/tmp_check/regress
  if [ "$variant" = service ]; then
    diffs=$STAGE/tmp_check/service/regression.diffs
    instance=$STAGE/tmp_check/service-instance
    stage_make installcheck-service >"$log" 2>&1 || rc=$?
  else
    stage_make installcheck TAP_TESTS= >"$log" 2>&1 || rc=$?
  fi
  local ok bad
  # pg_regress 15 prints "name ... ok" and "... FAILED"; 16 and later "ok 1 - name"
  # and "not ok 2 - name" (an ignored failure ends in "# (ignored)").
  ok=$(grep -cE '\.\.\. +(ok|failed \(ignored\))|^ok +[0-9]+ |^not ok +[0-9]+ .*# \(ignored\)' "$log")
  bad=$(grep -E '\.\.\. +FAILED|^not ok +[0-9]+ ' "$log" | grep -cv '# (ignored)')
  if [ "$rc" -ne 0 ] || [ "$bad" -ne 0 ]; then
    cat "$log"
    if [ -f "$diffs" ]; then
      say "---- regression.diffs (first 400 lines)"
      head -n 400 "$diffs"
    fi
    if [ "$bad" -eq 0 ]; then
      bad=1
      compgen -G "$instance/log/*" >/dev/null && tail -n 40 "$instance"/log/* 2>/dev/null
    fi
    fail "$name: $bad failed" "$bad"
    pass "$ok"
  else
    say "$name: $ok tests passed"
    pass "$ok"
  fi
}

# run_regress_pair: run_regress and run_regress service side by side (two
# temporary instances, the plain run's output in the staged copy's results/,
# the service's in tmp_check/service/), each one core's work.
run_regress_pair() {
  local label=${PG_LABEL:+$PG_LABEL }
  if [ -f "$REPO_ROOT/Makefile" ] && [ -n "$(make_var REGRESS | xargs)" ]; then
    install_pgvector_once
    build_ext_once
    [ "$EXT_STATE" = ok ] && stage_repo
  fi
  lane_start "${label// /-}regress" timed "${label}regress" run_regress
  lane_start "${label// /-}regress-service" timed "${label}regress-service" run_regress service
  lane_wait "${label// /-}regress"
  lane_wait "${label// /-}regress-service"
}

# ------------------------------------------------------------------ tap
# TAP files run TAP_JOBS at a time (prove -j; PROVE_FLAGS with its own -j
# wins): each cluster has its own port, folder and GPU service segment, and
# much of a file's time is one backend at work or a fixed-length load.
TAP_JOBS=${TAP_JOBS:-2}
# The longest files, longest first (measured on 2 cores); the others follow
# in name order.
TAP_SLOW_FIRST=${TAP_SLOW_FIRST-003_recall.pl 015_gpu_metric_words.pl 009_sqlsmith.pl 010_function_fuzz.pl 011_gpu_faults.pl 007_range_filtered.pl 006_gpu_service.pl 004_concurrent.pl 012_citus.pl}
run_tap() {  # run_tap [FILE...]: the TAP files named (test/t/NAME.pl), else all
  local files=()
  local f
  if [ $# -gt 0 ]; then
    for f in "$@"; do
      [ -e "$REPO_ROOT/test/t/$f" ] && files+=("test/t/$f")
    done
  else
    for f in "$REPO_ROOT"/test/t/*.pl; do
      [ -e "$f" ] && files+=("test/t/$(basename "$f")")
    done
  fi
  if [ ${#files[@]} -eq 0 ]; then
    skip "tap (no test/t/*.pl)"
    return
  fi
  # prove -j runs the files in the order given as slots free up: the long
  # ones first, so that no long file starts last and runs alone.
  local ordered=() s
  for s in $TAP_SLOW_FIRST; do
    for f in "${files[@]}"; do
      [ "$f" = "test/t/$s" ] && ordered+=("$f")
    done
  done
  for f in "${files[@]}"; do
    [[ " $TAP_SLOW_FIRST " == *" $(basename "$f") "* ]] || ordered+=("$f")
  done
  files=("${ordered[@]}")
  local prove_flags=${PROVE_FLAGS:-}
  [[ " $prove_flags " == *" -j"* || " $prove_flags " == *" --jobs"* ]] || prove_flags="-j$TAP_JOBS $prove_flags"
  build_ext_once
  if [ "$EXT_STATE" != ok ]; then
    fail "tap: not run, the extension did not build" "${#files[@]}"
    return
  fi
  # Citus 12.1 (for 012_citus.pl only) supports PostgreSQL 14 to 16.
  local major
  major=$("$PG_BIN/pg_config" --version | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
  [[ " ${files[*]} " == *" test/t/012_citus.pl "* ]] && [ "$major" -le 16 ] && install_citus_once
  stage_repo
  # The tools, where they build, for tests that want them: $GPU_IVFPQ_TOOLS_BIN.
  local tools_bin=""
  if [ -f "$REPO_ROOT/tools/CMakeLists.txt" ] && build_tools_once; then
    tools_bin=$STAGE/tools-bin
    mkdir -p "$tools_bin"
    cp "$TOOLS_BUILD"/gen_synthetic "$TOOLS_BUILD"/fmnist_load "$TOOLS_BUILD"/knn_bench "$tools_bin"/
    chown -R postgres: "$tools_bin"
  fi
  local rc=0 name=${PG_LABEL:+$PG_LABEL }tap
  local log=$LOGS/${name// /-}.log
  GPU_IVFPQ_TOOLS_BIN="$tools_bin" stage_make prove_installcheck PROVE_FLAGS="$prove_flags" \
    PROVE_TESTS="${files[*]}" >"$log" 2>&1 || rc=$?
  local total=${#files[@]} nfail=0 bad
  if [ "$rc" -ne 0 ]; then
    # Failed files are listed in prove's "Test Summary Report" as
    # "test/t/x.pl (Wstat: ...)"; with none listed (a bail-out), all count.
    bad=$(grep -oE '^test/t/[^ ]+\.pl +\(Wstat' "$log" | sed -E 's/ +\(Wstat//' | sort -u)
    nfail=$(grep -c . <<<"$bad")
    [ "$nfail" -eq 0 ] && nfail=$total && bad="${files[*]}"
    cat "$log"
    for f in $bad; do
      f=$STAGE/tmp_check/log/regress_log_$(basename "$f" .pl)
      [ -e "$f" ] || continue
      say "---- $(basename "$f") (last 80 lines)"
      tail -n 80 "$f"
    done
    fail "$name: $nfail of $total test files" "$nfail"
    pass $((total - nfail))
  else
    say "$name: $(grep -E '^Files=' "$log" | tail -n 1)"
    pass "$total"
  fi
}

# ------------------------------------------------------------------ tools
TOOLS_STATE=none  # none | ok | failed
build_tools_once() {
  [ "$TOOLS_STATE" != none ] && { [ "$TOOLS_STATE" = ok ]; return; }
  if build_tools "$LOGS/tools-build.log"; then TOOLS_STATE=ok; else TOOLS_STATE=failed; fi
  [ "$TOOLS_STATE" = ok ]
}

tools_check() {  # tools_check NAME CMD... : one counted check
  local name=$1; shift
  local log
  log="$LOGS/tools-$(tr -c 'a-zA-Z0-9_\n' _ <<<"$name").log"
  if "$@" >"$log" 2>&1; then
    pass
  else
    cat "$log"
    fail "tools: $name"
  fi
}

run_tools() {
  [ -f "$REPO_ROOT/Makefile" ] && build_ext_once
  if ! build_tools_once; then
    fail "tools: build"
    return
  fi
  local T=$TOOLS_BUILD
  # Determinism: the same bytes for any thread count; queries differ from base.
  tools_check "gen_synthetic deterministic" bash -c "
    a=\$('$T/gen_synthetic' --rows 3000 --threads 1 | md5sum)
    b=\$('$T/gen_synthetic' --rows 3000 --threads 2 | md5sum)
    c=\$('$T/gen_synthetic' --what queries --queries 3000 | md5sum)
    [ \"\$a\" = \"\$b\" ] && [ \"\$a\" != \"\$c\" ]"
  # --part P/K: K loaders together write the rows of one run, each once.
  tools_check "gen_synthetic --part" bash -c "
    a=\$('$T/gen_synthetic' --rows 5000 | md5sum)
    b=\$(for p in 0 1 2; do '$T/gen_synthetic' --rows 5000 --part \$p/3; done | sort -n | md5sum)
    n=\$('$T/gen_synthetic' --rows 5000 --part 1/3 | wc -l)
    [ \"\$a\" = \"\$b\" ] && [ \"\$n\" -gt 0 ] && [ \"\$n\" -lt 5000 ] &&
      ! '$T/gen_synthetic' --rows 10 --part 3/3 >/dev/null 2>&1 &&
      ! '$T/gen_synthetic' --rows 10 --part 0/2 --format fvecs >/dev/null 2>&1"

  local srv=$WORK/tools-server
  mkdir -p "$srv"
  if ! pg_temp_start "$srv" >"$LOGS/tools-server.log" 2>&1; then
    cat "$LOGS/tools-server.log"
    fail "tools: temporary server"
    return
  fi
  local have_ext=0
  if [ "$EXT_STATE" = ok ]; then
    if psql_q -c "CREATE EXTENSION gpu_ivfpq" >"$LOGS/tools-ext.log" 2>&1; then
      have_ext=1
    else
      cat "$LOGS/tools-ext.log"
      fail "tools: CREATE EXTENSION gpu_ivfpq (installed, but does not load)"
    fi
  fi
  if [ "$have_ext" = 0 ]; then
    # Exact L2 distance as a plain SQL operator, so knn_bench has something to query.
    psql_q >"$LOGS/tools-op.log" 2>&1 <<'SQL'
CREATE FUNCTION scratch_l2(a real[], b real[]) RETURNS real LANGUAGE sql IMMUTABLE STRICT AS
$$ SELECT sqrt(sum((x - y) * (x - y)))::real FROM unnest(a, b) AS t(x, y) $$;
CREATE OPERATOR <-> (LEFTARG = real[], RIGHTARG = real[], FUNCTION = scratch_l2);
SQL
  fi

  tools_check "fmnist_load test split" bash -c "
    set -e -o pipefail
    psql_() { '$PG_BIN/psql' -X -q -v ON_ERROR_STOP=1 \"\$@\"; }
    psql_ -c 'CREATE TABLE fm_test (id bigint, label int, embedding real[])'
    '$T/fmnist_load' --set test | psql_ -c 'COPY fm_test FROM STDIN'
    r=\$(psql_ -At -c \"SELECT count(*), sum(label), min(array_length(embedding,1)), max(embedding[400]) <= 255 FROM fm_test\")
    echo \"\$r\"; [ \"\$r\" = '10000|45000|784|t' ]"

  tools_check "gen_synthetic COPY load" bash -c "
    set -e -o pipefail
    psql_() { '$PG_BIN/psql' -X -q -v ON_ERROR_STOP=1 \"\$@\"; }
    psql_ -c 'CREATE TABLE syn (id bigint, embedding real[])'
    '$T/gen_synthetic' --rows 2000 | psql_ -c 'COPY syn FROM STDIN'
    '$T/gen_synthetic' --what queries --queries 30 --format fvecs --out '$WORK/q.fvecs'
    r=\$(psql_ -At -c 'SELECT count(*), min(id), max(id), min(array_length(embedding,1)) FROM syn')
    echo \"\$r\"; [ \"\$r\" = '2000|1|2000|128' ]"

  # Exact search (no index): the recall must be 1.
  tools_check "knn_bench exact recall" "$T/knn_bench" --table syn --queries "$WORK/q.fvecs" \
    --k 10 --warmup 1 --settings "enable_indexscan=off" --min-recall 0.9999 --gt-cache "$WORK/syn.gt"

  if [ "$have_ext" = 1 ]; then
    # A small index, every list probed: recall must be high, through the index.
    tools_check "knn_bench gpu_ivfpq index" bash -c "
      set -e -o pipefail
      '$PG_BIN/psql' -X -q -v ON_ERROR_STOP=1 -c 'CREATE INDEX syn_idx ON syn USING gpu_ivfpq (embedding) WITH (lists = 8, m = 16)'
      '$T/knn_bench' --table syn --queries '$WORK/q.fvecs' --k 10 --warmup 1 \
        --settings 'probes=8,rerank=200,enable_seqscan=off' --min-recall 0.9 --gt-cache '$WORK/syn.gt' | tee /dev/stderr | grep -q 'Index Scan'"
  else
    skip "tools: index check (no working extension)"
  fi
  pg_temp_stop
}

# ------------------------------------------------------------------ versions
# The other PostgreSQL major versions: each installed by
# scripts/install-postgres.sh, the extension built for it (in a copy of the
# sources: the work tree's objects stay those of the first version) and
# installed into it, pgvector too; then the regress suite with and without the
# service, and on 18 the TAP files of TAP_FILES_18. Logs and failures are
# named after the version ("pg18 regress").
PG_VERSIONS=${PG_VERSIONS-16 17 18}
TAP_FILES_18=${TAP_FILES_18-001_wal.pl 002_crash.pl 005_service.pl 006_gpu_service.pl 008_index_check.pl 013_standby_gpu.pl 020_pg_upgrade.pl}
FIRST_PG_BIN=$PG_BIN
FIRST_MAJOR=$("$PG_BIN/pg_config" --version 2>/dev/null | sed -E 's/^PostgreSQL ([0-9]+).*/\1/')
run_version() {
  local v=$1 pgc t0=$SECONDS
  if ! pgc=$("$REPO_ROOT/scripts/install-postgres.sh" "$v" 2>"$LOGS/install-pg$v.log"); then
    cat "$LOGS/install-pg$v.log"
    fail "pg$v: scripts/install-postgres.sh $v"
    return
  fi
  PG_BIN=$("$pgc" --bindir)
  PG_LABEL=pg$v
  # Each version has its own build, third-party installs and staged copy.
  EXT_STATE=none STAGE="" THIRD_PARTY_STATE=()
  local first_stage_root=$WORK
  WORK=$first_stage_root/pg$v
  mkdir -p "$WORK"
  if [ -f "$REPO_ROOT/Makefile" ]; then
    # The CUDA kernels do not depend on PostgreSQL: the archive the first
    # build made is linked again rather than compiled once more.
    local cuda_lib=${GPU_IVFPQ_CUDA_LIB:-}
    [ -z "$cuda_lib" ] && [ -f "$REPO_ROOT/gpu/libgpu_ivfpq_gpu.a" ] && cuda_lib=$REPO_ROOT/gpu/libgpu_ivfpq_gpu.a
    if EXT_BUILD_IN_PLACE=0 GPU_IVFPQ_CUDA_LIB=$cuda_lib build_extension "$LOGS/pg$v-extension-build.log"; then
      EXT_STATE=ok
    else
      EXT_STATE=failed
      fail "pg$v: make install"
    fi
  fi
  install_pgvector_once
  say "time: pg$v install and build $((SECONDS - t0)) s"
  timed "pg$v regress (plain and service)" run_regress_pair
  if [ "$v" = 18 ] && [ -n "$TAP_FILES_18" ]; then
    # 020_pg_upgrade.pl upgrades from 16 when it was tested before (the
    # extension installed there), else it is skipped: from Debian's 15.20
    # pg_upgrade fails for every table, whatever the extension (15.20 keeps
    # a column version in attoptions, "pg_attver", that 18.6's pg_restore
    # refuses).
    local from=${UPGRADE_FROM_BIN:-}
    GPU_IVFPQ_UPGRADE_FROM=$from timed "pg$v tap" run_tap $TAP_FILES_18
  fi
  [ "$v" = 16 ] && [ "$EXT_STATE" = ok ] && UPGRADE_FROM_BIN=$PG_BIN
  WORK=$first_stage_root
  PG_BIN=$FIRST_PG_BIN PG_LABEL=""
}

# timed NAME CMD...: runs CMD, then says how long it took (CI's time budget).
timed() {
  local name=$1 t0=$SECONDS
  shift
  "$@"
  say "time: $name $((SECONDS - t0)) s"
}

# The CUDA kernels (nvcc, where the toolkit is found), built in the work tree
# as `make` would build them for the extension, once: the extension of every
# version links this archive. They depend on nothing of PostgreSQL, so they
# build while the unit tests build and run.
build_cuda() {
  [ -f "$REPO_ROOT/Makefile" ] || return 0
  [ -n "${GPU_IVFPQ_CUDA_LIB:-}" ] && return 0
  [ "$(make_var USE_CUDA)" = 1 ] || return 0
  if ! run_quiet "$LOGS/cuda-build.log" make -C "$REPO_ROOT" -j"$JOBS" PG_CONFIG="$PG_BIN/pg_config" \
         gpu/libgpu_ivfpq_gpu.a; then
    fail "extension: the CUDA kernels (make gpu/libgpu_ivfpq_gpu.a)"
  fi
}

# The versions, one after the other (18's pg_upgrade test upgrades from 16).
run_versions() {
  local v
  for v in $PG_VERSIONS; do
    [ "$v" = "$FIRST_MAJOR" ] && continue
    timed "pg$v" run_version "$v"
  done
}

# The order: the CUDA kernels in a lane beside the unit tests; then the
# other versions in a lane of their own (they link those kernels) beside the
# first version's regress (plain and service side by side), TAP (TAP_JOBS
# files at a time) and tools suites. Third-party builds and the tools come
# before the lanes that use them.
T_START=$SECONDS
{ want regress || want tap || want tools || want versions; } && lane_start cuda timed "cuda kernels" build_cuda
want unit && timed unit run_unit
want regress && [ -f "$REPO_ROOT/Makefile" ] && install_pgvector_once
if want tap && [ -f "$REPO_ROOT/Makefile" ] && compgen -G "$REPO_ROOT/test/t/012_citus.pl" >/dev/null &&
   [ "$FIRST_MAJOR" -le 16 ]; then
  install_citus_once
fi
{ want tap || want tools || want versions; } && [ -f "$REPO_ROOT/tools/CMakeLists.txt" ] && build_tools_once
lane_wait cuda
want versions && [ -n "$PG_VERSIONS" ] && lane_start versions run_versions
want regress && timed "regress (plain and service)" run_regress_pair
want tap && timed tap run_tap ${TAP_FILES:-}
want tools && timed tools run_tools
lane_wait versions
say "time: total $((SECONDS - T_START)) s"

for s in "${SKIPS[@]}"; do say "skipped: $s"; done
for f in "${FAILURES[@]}"; do say "FAILED: $f"; done
say "$PASSED passed, $FAILED failed"
[ "$FAILED" -eq 0 ]
