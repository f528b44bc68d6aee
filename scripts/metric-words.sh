#!/usr/bin/env bash
# Words for fuzzy string search tests and benchmarks: the dictionary of the
# Debian package wspanish as the indexed set, and deterministic queries.
#
#   scripts/metric-words.sh words [DICT]
#       the dictionary's words (default /usr/share/dict/spanish), one a
#       line, ready for COPY (text format)
#   scripts/metric-words.sh queries [N] [SEED] [DICT] [OTHER]
#       N queries (default 300, seed 1): half are dictionary words with 1 to
#       3 random edits (inserts, deletes, substitutions of Spanish letters:
#       the edit count cycles 1, 2, 3), half are words of another
#       dictionary (default the first of wamerican, wbritish, wngerman
#       found; without one, all are edited words). Lines "kind<TAB>query",
#       kind being edit1, edit2, edit3 or other. The same seed gives the
#       same queries on every machine (Perl's drand48).
#   scripts/metric-words.sh load [psql options...]
#       creates metric_words (id, word) and metric_queries (id, kind, query)
#       through psql (dropping them first) and loads both with COPY; ids
#       follow the dictionary's order. METRIC_QUERIES and METRIC_SEED set
#       the queries' count and seed.
#
# Nothing is downloaded: the dictionaries are Debian packages (wspanish,
# wamerican; scripts/install-deps.sh installs them).
set -euo pipefail

SPANISH=/usr/share/dict/spanish

# The first other dictionary found, if any.
other_dict() {
  local d
  for d in /usr/share/dict/american-english /usr/share/dict/british-english /usr/share/dict/ngerman; do
    if [ -r "$d" ]; then
      printf '%s\n' "$d"
      return
    fi
  done
}

words() {
  local dict=${1:-$SPANISH}
  if [ ! -r "$dict" ]; then
    echo "metric-words: no dictionary at $dict (Debian package wspanish)" >&2
    exit 1
  fi
  # COPY's text format gives \ a meaning; dictionaries hold none, but be safe.
  grep -v '^$' "$dict" | sed -e 's/\\/\\\\/g'
}

queries() {
  local n=${1:-300} seed=${2:-1} dict=${3:-$SPANISH} other=${4:-$(other_dict)}
  if [ ! -r "$dict" ]; then
    echo "metric-words: no dictionary at $dict (Debian package wspanish)" >&2
    exit 1
  fi
  perl -CSD -e '
    use utf8;
    use strict;
    use warnings;
    my ($n, $seed, $dict, $other) = @ARGV;
    srand($seed);
    my @letters = split //, "abcdefghijklmnñopqrstuvwxyzáéíóúü";
    open(my $fh, "<:encoding(UTF-8)", $dict) or die "$dict: $!";
    my @words = grep { length } map { chomp; $_ } <$fh>;
    close $fh;
    my @others;
    if ($other ne "" && open(my $oh, "<:encoding(UTF-8)", $other)) {
        # Words as a dictionary lists them, without possessive forms.
        @others = grep { length && !/\x27/ } map { chomp; $_ } <$oh>;
        close $oh;
    }
    my $edited = @others ? int(($n + 1) / 2) : $n;
    for my $i (0 .. $edited - 1) {
        my $edits = 1 + $i % 3;
        my @w = split //, $words[int(rand(@words))];
        for (1 .. $edits) {
            my $op = @w ? int(rand(3)) : 0;
            my $c = $letters[int(rand(@letters))];
            if ($op == 0) { splice(@w, int(rand(@w + 1)), 0, $c) }
            elsif ($op == 1) { splice(@w, int(rand(@w)), 1) }
            else { $w[int(rand(@w))] = $c }
        }
        print "edit$edits\t", join("", @w), "\n";
    }
    for (1 .. $n - $edited) {
        print "other\t", $others[int(rand(@others))], "\n";
    }
  ' "$n" "$seed" "$dict" "$other"
}

load() {
  local here
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  psql -X -q -v ON_ERROR_STOP=1 "$@" <<'SQL'
SET client_min_messages = warning;
DROP TABLE IF EXISTS metric_words, metric_queries;
CREATE TABLE metric_words (id bigserial PRIMARY KEY, word text NOT NULL);
CREATE TABLE metric_queries (id bigserial PRIMARY KEY, kind text NOT NULL, query text NOT NULL);
SQL
  "$here/metric-words.sh" words | psql -X -q -v ON_ERROR_STOP=1 "$@" -c 'COPY metric_words (word) FROM STDIN'
  "$here/metric-words.sh" queries "${METRIC_QUERIES:-300}" "${METRIC_SEED:-1}" |
    psql -X -q -v ON_ERROR_STOP=1 "$@" -c 'COPY metric_queries (kind, query) FROM STDIN'
  psql -X -q -v ON_ERROR_STOP=1 "$@" -c 'ANALYZE metric_words, metric_queries'
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  words) words "$@" ;;
  queries) queries "$@" ;;
  load) load "$@" ;;
  *) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2 ;;
esac
