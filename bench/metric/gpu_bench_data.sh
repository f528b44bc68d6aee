#!/usr/bin/env bash
# Data for the GPU metric benchmark (bench/device/metric_bench.cpp,
# bench/metric/gpu_bench.sh), from the Debian dictionaries installed here:
#
#   bench/metric/gpu_bench_data.sh DIR [WORDS] [QUERIES]
#
# writes to DIR, each compressed with xz (-9e):
#   spanish.txt.xz           the wspanish dictionary (scripts/metric-words.sh words)
#   spanish-queries.txt.xz   40,000 queries (metric-words.sh queries 40000 1:
#                            half dictionary words with 1-3 seeded edits,
#                            half words of another dictionary)
#   merged.txt.xz            WORDS (default 1,000,000) distinct words: the
#                            dictionaries wspanish, wamerican, wbritish,
#                            wngerman and wfrench (those present; lines with
#                            an apostrophe left out), topped up with seeded
#                            1-3 edits of those words, sorted (LC_ALL=C)
#   merged-queries.txt.xz    QUERIES (default 10,000) seeded 1-3 edits of the
#                            merged dictionaries' words (seed 2)
# One word a line, UTF-8. Every random choice comes from metric-words.sh's
# seeded generator, so every machine writes the same files.
#
# Missing dictionaries: apt-get install -y wspanish wamerican wbritish
# wngerman wfrench (only wspanish is required).
set -euo pipefail

dir=${1:?usage: gpu_bench_data.sh DIR [WORDS] [QUERIES]}
total=${2:-1000000}
nmerged_queries=${3:-10000}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
gen=$here/../../scripts/metric-words.sh
mkdir -p "$dir"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The Spanish set and its queries (the kind column dropped).
"$gen" words > "$tmp/spanish.txt"
"$gen" queries 40000 1 | cut -f2 > "$tmp/spanish-queries.txt"

# The merged dictionaries.
dicts=()
for d in spanish american-english british-english ngerman french; do
  [ -r "/usr/share/dict/$d" ] && dicts+=("/usr/share/dict/$d")
done
cat "${dicts[@]}" | grep -v "'" | grep -v '^$' | LC_ALL=C sort -u > "$tmp/dicts.txt"
have=$(wc -l < "$tmp/dicts.txt")
echo "gpu_bench_data: ${#dicts[@]} dictionaries (${dicts[*]}): $have distinct words" >&2

# Topped up with seeded edits of those words (an empty "other" dictionary,
# /dev/null, makes every generated query an edited word). Edits that repeat
# a word or each other are dropped (the first ones kept, in the generator's
# order), so ask for more and cut.
cp "$tmp/dicts.txt" "$tmp/merged.txt"
seed=100
while [ "$(wc -l < "$tmp/merged.txt")" -lt "$total" ]; do
  need=$(( total - $(wc -l < "$tmp/merged.txt") ))
  "$gen" queries $(( need + need / 10 + 100 )) "$seed" "$tmp/dicts.txt" /dev/null | cut -f2 |
    LC_ALL=C awk -v n="$need" 'NR == FNR { have[$0]; next }
      $0 != "" && !($0 in have) && !seen[$0]++ && ++k <= n' "$tmp/merged.txt" - > "$tmp/new.txt"
  LC_ALL=C sort -u -o "$tmp/merged.txt" "$tmp/merged.txt" "$tmp/new.txt"
  seed=$(( seed + 1 ))
done

"$gen" queries "$nmerged_queries" 2 "$tmp/dicts.txt" /dev/null | cut -f2 > "$tmp/merged-queries.txt"

for f in spanish spanish-queries merged merged-queries; do
  xz -9e -T1 -c "$tmp/$f.txt" > "$dir/$f.txt.xz"
  printf '%-24s %9d words %9d bytes xz\n' "$f.txt" "$(wc -l < "$tmp/$f.txt")" "$(stat -c %s "$dir/$f.txt.xz")" >&2
done
