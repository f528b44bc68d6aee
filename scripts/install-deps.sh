#!/usr/bin/env bash
# Installs everything the build, the tests, the tools and the benchmarks need
# (Debian bookworm, as root). Idempotent: when every package is already
# installed it only checks and returns. Quiet unless something fails.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  postgresql-15 postgresql-client-15 postgresql-server-dev-15 libpq-dev libpqxx-dev
  libipc-run-perl perl sqlsmith
  googletest libgtest-dev libgmock-dev
  libopenblas-serial-dev
  zlib1g-dev
  dataset-fashion-mnist
  # Words for fuzzy string search (gpu_metric): the indexed set and other queries
  wspanish wamerican
  # Citus's build from source, for the Citus test (run-tests.sh)
  liblz4-dev libzstd-dev libkrb5-dev
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages (${missing[*]}) and not root" >&2
  exit 1
fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
echo "install-deps: installing ${missing[*]}"
if ! { apt-get update -q && \
       apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 "${missing[@]}"; } \
       >"$log" 2>&1 </dev/null; then
  tail -n 60 "$log" >&2
  echo "install-deps: apt-get failed" >&2
  exit 1
fi
