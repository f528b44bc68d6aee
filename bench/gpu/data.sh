# The synthetic data of the benchmarks on the GPU machine: tools/gen_synthetic
# with seed 42, the set bench/cpu/run.sh loads, so CPU and GPU figures are
# taken on the same vectors. Source it from the repository root; it needs
# cmake and a C++ compiler only (no PostgreSQL, no network).
#
# make_data DIR ROWS: writes DIR/base.fvecs (ROWS x DIM, DIM 128 unless set) and
# DIR/queries.fvecs (10000 x DIM, fresh draws of the same distribution: gpu_bench takes them
# all, the SQL benchmarks the first 1000, which are the CPU benchmark's
# queries), keeping files already there. GEN is the gen_synthetic binary.
# DATASET=fashion-mnist: Fashion-MNIST instead (60k x 784 train rows as the
# base, the 10k test images as the queries; ROWS and DIM are ignored),
# through tools/fmnist_load (FMNIST), from /usr/share/datasets/fashion-mnist.
GEN_BUILD=${GEN_BUILD:-/tmp/gpu_ivfpq-build-tools}
GEN=$GEN_BUILD/gen_synthetic

FMNIST=$GEN_BUILD/fmnist_load

build_gen_synthetic() {
  [ -x "$GEN" ] && [ "${DATASET:-}" != fashion-mnist -o -x "$FMNIST" ] && return
  # Without libpqxx (not on the GPU machine) the tools' CMake builds the
  # loaders for files only and warns: that is all the benchmarks need here.
  if ! { cmake -S tools -B "$GEN_BUILD" -DCMAKE_BUILD_TYPE=Release &&
         cmake --build "$GEN_BUILD" --target gen_synthetic $([ "${DATASET:-}" = fashion-mnist ] && echo fmnist_load) -j"$(nproc)"; } >/tmp/gen_synthetic-build.log 2>&1; then
    cat /tmp/gen_synthetic-build.log >&2
    return 1
  fi
}

make_data() {
  local dir=$1 rows=$2
  build_gen_synthetic || return 1
  mkdir -p "$dir"
  if [ "${DATASET:-}" = fashion-mnist ]; then
    [ -s "$dir/base.fvecs" ] || "$FMNIST" --set train --format fvecs --out "$dir/base.fvecs" || return 1
    [ -s "$dir/queries.fvecs" ] || "$FMNIST" --set test --format fvecs --out "$dir/queries.fvecs" || return 1
    return
  fi
  [ -s "$dir/base.fvecs" ] ||
    "$GEN" --rows "$rows" --dim "${DIM:-128}" --format fvecs --threads "$(nproc)" --out "$dir/base.fvecs" || return 1
  [ -s "$dir/queries.fvecs" ] ||
    "$GEN" --what queries --queries 10000 --dim "${DIM:-128}" --format fvecs --out "$dir/queries.fvecs" || return 1
}
