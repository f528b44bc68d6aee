# Fuzzy string search on the words of wspanish (86,016 Spanish words):
# gpu_metric indexes, a List of Clusters and an SSS, answer exactly what
# levenshtein() of fuzzystrmatch does (<~> row by row where fuzzystrmatch is
# missing) for 300 seeded queries (dictionary words with 1 to 3 edits, words
# of another dictionary) at radii 1, 2 and 3, through index scans and the
# batch functions, and in k-NN order; they stay exact through inserts,
# deletes, updates and VACUUM, also concurrent ones beside readers; after a
# crash (immediate shutdown) WAL replay brings back the same answers; a streaming standby answers like the
# primary; the same answers from the GPU service (emulated without a GPU).
# Also: databases in LATIN1 and SQL_ASCII, pg_trgm's operators
# beside ours, and the planner's choices on real data. Skipped without the
# dictionary (Debian package wspanish).
use strict;
use warnings;

use File::Basename;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $dict = '/usr/share/dict/spanish';
plan skip_all => "$dict is not installed (Debian package wspanish)" unless -r $dict;

# The words and the queries, as scripts/metric-words.sh makes them (the
# same seed, the same queries everywhere).
my $script = dirname(__FILE__) . '/../../scripts/metric-words.sh';
my $tmp = PostgreSQL::Test::Utils::tempdir;
IPC::Run::run([ 'bash', $script, 'words' ], '>', "$tmp/words.txt")
  or die "metric-words.sh words failed";
IPC::Run::run([ 'bash', $script, 'queries', '300', '1' ], '>', "$tmp/queries.txt")
  or die "metric-words.sh queries failed";

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf(
	'postgresql.conf', q{
maintenance_work_mem = '256MB'
max_parallel_maintenance_workers = 1
autovacuum = off
});
$primary->start;

my $have_fuzzy = $primary->safe_psql('postgres',
	"SELECT count(*) FROM pg_available_extensions WHERE name = 'fuzzystrmatch'");
$primary->safe_psql('postgres', 'CREATE EXTENSION gpu_ivfpq');
$primary->safe_psql('postgres', 'CREATE EXTENSION fuzzystrmatch') if $have_fuzzy;
note($have_fuzzy
	? 'reference: levenshtein() of fuzzystrmatch'
	: 'reference: <~> row by row (fuzzystrmatch is not installed)');

$primary->safe_psql(
	'postgres', qq{
	CREATE TABLE words (id bigserial PRIMARY KEY, word text);
	COPY words (word) FROM '$tmp/words.txt';
	CREATE TABLE queries (id bigserial PRIMARY KEY, kind text, query text);
	COPY queries (kind, query) FROM '$tmp/queries.txt';
	ANALYZE words, queries;
});
is($primary->safe_psql('postgres', 'SELECT count(*) FROM words'), '86016', 'wspanish loaded');
is( $primary->safe_psql(
		'postgres',
		q{SELECT string_agg(kind || ' ' || n, ', ' ORDER BY kind) FROM (SELECT kind, count(*) n FROM queries GROUP BY kind) k}
	),
	'edit1 50, edit2 50, edit3 50, other 150',
	'300 queries: dictionary words with 1 to 3 edits, and words of another dictionary');

$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->start;

# The reference: every (query, word) pair within 3 edits, row by row. The
# subquery is evaluated per query, so that <~> (without fuzzystrmatch)
# keeps one query's pattern for all the words.
sub make_reference
{
	my $dist = $have_fuzzy
	  ? 'levenshtein_less_equal(w.word, q.query, 3)'
	  : '(w.word <~> q.query)';
	$primary->safe_psql(
		'postgres', qq{
		DROP TABLE IF EXISTS ref;
		CREATE TABLE ref AS
		SELECT q.id AS qid, w.id, w.tid, w.d
		FROM queries q,
			 LATERAL (SELECT w.id, w.ctid AS tid, $dist AS d FROM words w WHERE w.word IS NOT NULL OFFSET 0) w
		WHERE w.d <= 3;
		ANALYZE ref;
	});
}

# Range answers of index scans (the planner's only choice: sequential and
# bitmap scans off) against the reference, per radius: "radius:answers:
# missing:extra". $prefix runs first in the same transaction (DROP INDEX of
# the other index, so that this one serves).
sub scan_check
{
	my ($node, $prefix) = @_;
	return $node->safe_psql(
		'postgres', qq{
		BEGIN;
		$prefix
		SET LOCAL enable_seqscan = off;
		SET LOCAL enable_bitmapscan = off;
		WITH got AS (SELECT q.id AS qid, r.radius, w.id
					 FROM queries q CROSS JOIN generate_series(1, 3) r(radius),
						  LATERAL (SELECT id FROM words w WHERE w.word <% edit_range(q.query, r.radius)) w),
			 want AS (SELECT qid, r.radius, id FROM ref CROSS JOIN generate_series(1, 3) r(radius)
					  WHERE d <= r.radius)
		SELECT string_agg(x, ' ' ORDER BY x) FROM (
			SELECT r.radius || ':' || (SELECT count(*) FROM want WHERE want.radius = r.radius) || ':' ||
				   (SELECT count(*) FROM (SELECT * FROM want WHERE want.radius = r.radius
										  EXCEPT SELECT * FROM got WHERE got.radius = r.radius) m) || ':' ||
				   (SELECT count(*) FROM (SELECT * FROM got WHERE got.radius = r.radius
										  EXCEPT SELECT * FROM want WHERE want.radius = r.radius) e) AS x
			FROM generate_series(1, 3) r(radius)) s;
		ROLLBACK;
	});
}

# The same through gpu_metric_range_batch on $index, by (query, tid, distance);
# $prefix runs first in the same transaction.
sub batch_check
{
	my ($node, $index, $prefix) = @_;
	$prefix //= '';
	return $node->safe_psql(
		'postgres', qq{
		BEGIN;
		$prefix
		WITH got AS (SELECT b.query AS qid, r.radius, b.tid, b.distance AS d
					 FROM generate_series(1, 3) r(radius),
						  LATERAL gpu_metric_range_batch('$index', (SELECT array_agg(query ORDER BY id) FROM queries),
														 r.radius) b),
			 want AS (SELECT qid, r.radius, tid, d FROM ref CROSS JOIN generate_series(1, 3) r(radius)
					  WHERE d <= r.radius)
		SELECT string_agg(x, ' ' ORDER BY x) FROM (
			SELECT r.radius || ':' || (SELECT count(*) FROM want WHERE want.radius = r.radius) || ':' ||
				   (SELECT count(*) FROM (SELECT * FROM want WHERE want.radius = r.radius
										  EXCEPT SELECT * FROM got WHERE got.radius = r.radius) m) || ':' ||
				   (SELECT count(*) FROM (SELECT * FROM got WHERE got.radius = r.radius
										  EXCEPT SELECT * FROM want WHERE want.radius = r.radius) e) AS x
			FROM generate_series(1, 3) r(radius)) s;
		COMMIT;
	});
}

# Checks that a "radius:answers:missing:extra ..." string has nothing
# missing or extra at any radius.
sub exact_ok
{
	my ($result, $what) = @_;
	my @parts = split / /, $result;
	my $ok = @parts == 3;
	for (@parts)
	{
		my ($r, $answers, $missing, $extra) = split /:/;
		$ok &&= defined $extra && $missing == 0 && $extra == 0;
	}
	ok($ok, $what) or diag("radius:answers:missing:extra = $result");
	note("$what: $result");
}

# Queries (of the first $n) whose 10 nearest by the index (ORDER BY <~>
# LIMIT 10) are not the reference's 10 first by (distance, heap TID): the
# index returns equal distances in TID order.
sub knn_mismatches
{
	my ($node, $prefix, $n) = @_;
	my $dist = $have_fuzzy ? 'levenshtein(w.word, q.query)' : '(w.word <~> q.query)';
	return $node->safe_psql(
		'postgres', qq{
		BEGIN;
		$prefix
		SET LOCAL enable_seqscan = off;
		CREATE TEMP TABLE by_index AS
			SELECT q.id, ARRAY(SELECT w.id FROM words w ORDER BY w.word <~> q.query LIMIT 10) AS ids
			FROM queries q WHERE q.id <= $n;
		SET LOCAL enable_seqscan = on;
		SET LOCAL enable_indexscan = off;
		SET LOCAL enable_bitmapscan = off;
		SELECT count(*) FROM by_index b JOIN queries q ON q.id = b.id
		WHERE b.ids IS DISTINCT FROM
			  ARRAY(SELECT w.id FROM words w WHERE w.word IS NOT NULL ORDER BY $dist, w.ctid LIMIT 10);
		ROLLBACK;
	});
}

# A digest of everything the batch functions answer on both indexes: the
# same on a standby as on its primary, before and after a crash.
sub answers_digest
{
	my ($node) = @_;
	return $node->safe_psql(
		'postgres', q{
		SELECT md5(string_agg(x, ',' ORDER BY x)) FROM (
			SELECT i || r || ':' || b.query || ':' || b.tid || ':' || b.word || ':' || b.distance AS x
			FROM unnest(ARRAY['words_lc', 'words_sss']) i, generate_series(1, 3) r,
				 LATERAL gpu_metric_range_batch(i::regclass, (SELECT array_agg(query ORDER BY id) FROM queries), r) b
			UNION ALL
			SELECT i || 'knn:' || b.query || ':' || b.rank || ':' || b.tid || ':' || b.distance
			FROM unnest(ARRAY['words_lc', 'words_sss']) i,
				 LATERAL gpu_metric_knn_batch(i::regclass, (SELECT array_agg(query ORDER BY id) FROM queries), 5) b) a;
	});
}

make_reference();
note('reference pairs within 3 edits: ' . $primary->safe_psql('postgres', 'SELECT count(*) FROM ref'));

# ---------------------------------------------------------------- builds
$primary->safe_psql('postgres',
	'CREATE INDEX words_lc ON words USING gpu_metric (word) WITH (method = lc, bucket = 32)');
exact_ok(scan_check($primary, ''), 'List of Clusters: index scans equal the reference at radii 1-3');
exact_ok(batch_check($primary, 'words_lc'), 'List of Clusters: gpu_metric_range_batch equals the reference');
is(knn_mismatches($primary, '', 100), '0', 'List of Clusters: k-NN (LIMIT 10) equals the reference for 100 queries');

$primary->safe_psql('postgres',
	'CREATE INDEX words_sss ON words USING gpu_metric (word) WITH (method = sss, alpha = 0.5)');
my $only_sss = 'DROP INDEX words_lc;';
my $only_lc = 'DROP INDEX words_sss;';
exact_ok(scan_check($primary, $only_sss), 'SSS: index scans equal the reference at radii 1-3');
exact_ok(batch_check($primary, 'words_sss'), 'SSS: gpu_metric_range_batch equals the reference');
is(knn_mismatches($primary, $only_sss, 100), '0', 'SSS: k-NN (LIMIT 10) equals the reference for 100 queries');

# The planner picks an index for these queries on its own.
like(
	$primary->safe_psql('postgres',
		"EXPLAIN (COSTS OFF) SELECT id FROM words WHERE word <% edit_range('casamentarr', 2)"),
	qr/Index Scan using words_(lc|sss)|Bitmap Index Scan on words_(lc|sss)/,
	'the planner uses a gpu_metric index for a range of radius 2');
like(
	$primary->safe_psql('postgres',
		"EXPLAIN (COSTS OFF) SELECT id FROM words ORDER BY word <~> 'casamentarr' LIMIT 10"),
	qr/Index Scan using words_(lc|sss)/,
	'the planner uses a gpu_metric index for ORDER BY <~> LIMIT 10');
like(
	$primary->safe_psql('postgres', "EXPLAIN (COSTS OFF) SELECT id FROM words ORDER BY word <~> 'casamentarr'"),
	qr/Seq Scan/, 'but not to order every row');

# ---------------------------------------------------------------- DML and VACUUM
$primary->safe_psql(
	'postgres', q{
	INSERT INTO words (word) SELECT query FROM queries;
	INSERT INTO words (word) SELECT word || 's' FROM words WHERE id % 40 = 0;
	DELETE FROM words WHERE id % 31 = 0;
	UPDATE words SET word = word || 'a' WHERE id % 97 = 0;
	VACUUM words;
	INSERT INTO words (word) SELECT 'des' || word FROM words WHERE id % 53 = 0;
	INSERT INTO words (word) VALUES (NULL), (''), ('ñandú');
});
make_reference();
exact_ok(scan_check($primary, $only_lc), 'List of Clusters after inserts, deletes, updates and VACUUM: index scans');
exact_ok(scan_check($primary, $only_sss), 'SSS after inserts, deletes, updates and VACUUM: index scans');
exact_ok(batch_check($primary, 'words_lc'), 'List of Clusters after DML: gpu_metric_range_batch');
exact_ok(batch_check($primary, 'words_sss'), 'SSS after DML: gpu_metric_range_batch');
is(knn_mismatches($primary, $only_lc, 40), '0', 'List of Clusters after DML: k-NN');
is(knn_mismatches($primary, $only_sss, 40), '0', 'SSS after DML: k-NN');

# The standby, caught up, answers like the primary.
$primary->wait_for_catchup($standby);
my $digest = answers_digest($primary);
is(answers_digest($standby), $digest, 'the standby answers like the primary (batch functions, both indexes)');
exact_ok(scan_check($standby, ''), 'the standby: index scans equal the reference');

# ---------------------------------------------------------------- concurrency
# Writers insert, delete and VACUUM while readers check, each in one
# statement (one snapshot), that index scans return what a sequential scan
# computes: a mismatch divides by zero and aborts the client. Readers keep
# their restored copies current through other backends' inserts (reading
# only the records appended) and VACUUMs (restoring in full).
my $dir = PostgreSQL::Test::Utils::tempdir;
PostgreSQL::Test::Utils::append_to_file(
	"$dir/insert.sql", q{
\set q random(1, 300)
INSERT INTO words (word) SELECT query || chr(97 + :q % 26) FROM queries WHERE id = :q;
});
PostgreSQL::Test::Utils::append_to_file(
	"$dir/delete.sql", q{
\set d random(1, 90000)
DELETE FROM words WHERE id = :d;
});
PostgreSQL::Test::Utils::append_to_file("$dir/vacuum.sql", "VACUUM words;\n");
PostgreSQL::Test::Utils::append_to_file(
	"$dir/range.sql", q{
\set q random(1, 300)
SET enable_seqscan = off;
SELECT 1 / ((SELECT count(*) FROM words WHERE word <% edit_range(q.query, 2)) =
			(SELECT count(*) FROM words WHERE word <~> q.query <= 2))::int
FROM queries q WHERE q.id = :q;
});
PostgreSQL::Test::Utils::append_to_file(
	"$dir/knn.sql", q{
\set q random(1, 300)
SET enable_seqscan = off;
SELECT 1 / (ARRAY(SELECT word <~> q.query FROM words ORDER BY word <~> q.query LIMIT 5) =
			ARRAY(SELECT word <~> q.query FROM words ORDER BY (word <~> q.query) + 0 LIMIT 5))::int
FROM queries q WHERE q.id = :q;
});
my ($pgb_out, $pgb_err) = ('', '');
my $pgb_ok = IPC::Run::run(
	[
		'pgbench', '-n', '-c', '4', '-j', '2', '-T', '20',
		'-f', "$dir/insert.sql\@10", '-f', "$dir/delete.sql\@4", '-f', "$dir/vacuum.sql\@1",
		'-f', "$dir/range.sql\@6", '-f', "$dir/knn.sql\@2",
		'-h', $primary->host, '-p', $primary->port, 'postgres'
	],
	'<', \undef, '>', \$pgb_out, '2>', \$pgb_err);
ok($pgb_ok && $pgb_out =~ /number of failed transactions: 0 / && $pgb_err !~ /aborted|ERROR/,
	'concurrent inserts, deletes and VACUUM: every index scan equals a sequential scan')
  or diag("pgbench:\n$pgb_out\n$pgb_err");
note(join("\n", grep { /transactions actually processed|tps =/ } split /\n/, $pgb_out));
make_reference();
exact_ok(scan_check($primary, $only_lc), 'after the concurrent load: List of Clusters index scans');
exact_ok(scan_check($primary, $only_sss), 'after the concurrent load: SSS index scans');

# ---------------------------------------------------------------- crash recovery
# Changes after a checkpoint live only in the WAL when the server dies.
$primary->safe_psql('postgres', 'CHECKPOINT');
$primary->safe_psql(
	'postgres', q{
	INSERT INTO words (word) SELECT 're' || word FROM words WHERE id % 29 = 0;
	DELETE FROM words WHERE id % 43 = 0;
	VACUUM words;
	INSERT INTO words (word) SELECT query || 'n' FROM queries WHERE id % 2 = 0;
});
$digest = answers_digest($primary);
$primary->stop('immediate');
$primary->start;
is(answers_digest($primary), $digest, 'after a crash, WAL replay brings back the same answers');
make_reference();
exact_ok(scan_check($primary, $only_lc), 'after the crash: List of Clusters index scans equal the reference');
exact_ok(scan_check($primary, $only_sss), 'after the crash: SSS index scans equal the reference');
$primary->safe_psql('postgres', "INSERT INTO words (word) VALUES ('zzqxñ'), ('zzqxn')");
is( $primary->safe_psql(
		'postgres', q{
		SET enable_seqscan = off;
		SELECT string_agg(word, ',' ORDER BY word) FROM words WHERE word <% edit_range('zzqxñ', 1)}),
	'zzqxn,zzqxñ', 'the index takes inserts after the crash');
$primary->wait_for_catchup($standby);
is(answers_digest($standby), answers_digest($primary), 'the standby follows the primary through its crash');

# ---------------------------------------------------------------- on the GPU
# The same checks answered by the GPU service (gpu_ivfpq.device = gpu: a
# search the GPU does not answer is an error): on the GPU machine
# (GPU_IVFPQ_EXPECT_GPU=1) by its GPU, elsewhere by the service's CPU
# emulation of one.
# The standby preloads the library first: a primary that preloads it logs
# the service's WAL records (a standby without the library cannot replay
# them).
my $expect_gpu = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 1 : 0;
my $service_conf = "shared_preload_libraries = 'gpu_ivfpq'\n" . ($expect_gpu ? '' : "gpu_ivfpq.service_emulate_gpu = on\n");
$standby->append_conf('postgresql.conf', $service_conf);
$standby->restart;
$primary->append_conf('postgresql.conf', $service_conf);
$primary->restart;
$primary->poll_query_until('postgres',
	$expect_gpu
	? q{SELECT state = 'running (GPU)' FROM gpu_ivfpq_status}
	: q{SELECT state LIKE '%emulated%' FROM gpu_ivfpq_status})
  or die 'the GPU service did not start';
make_reference();
my $on_gpu = 'SET LOCAL gpu_ivfpq.device = gpu;';
exact_ok(scan_check($primary, "$only_lc $on_gpu"), 'on the GPU: List of Clusters index scans equal the reference');
exact_ok(scan_check($primary, "$only_sss $on_gpu"), 'on the GPU: SSS index scans equal the reference');
exact_ok(batch_check($primary, 'words_lc', $on_gpu), 'on the GPU: List of Clusters gpu_metric_range_batch');
exact_ok(batch_check($primary, 'words_sss', $on_gpu), 'on the GPU: SSS gpu_metric_range_batch');
is(knn_mismatches($primary, "$only_lc $on_gpu", 40), '0', 'on the GPU: List of Clusters k-NN');
is(knn_mismatches($primary, "$only_sss $on_gpu", 40), '0', 'on the GPU: SSS k-NN');
# (A DROP INDEX frees the index's mirror even when it rolls back, as the
# checks above did: both are searched once more first.)
is( $primary->safe_psql(
		'postgres', q{
		SET gpu_ivfpq.device = gpu;
		SELECT count(*) >= 0 FROM gpu_metric_range_batch('words_lc', ARRAY['casa'], 1);
		SELECT count(*) >= 0 FROM gpu_metric_range_batch('words_sss', ARRAY['casa'], 1);
		SELECT count(*) FROM gpu_ivfpq_mirrors WHERE kind = 'gpu_metric' AND index IN ('words_lc', 'words_sss')}),
	"t\nt\n2", 'both indexes are mirrored');

# ---------------------------------------------------------------- encodings
# Code points whatever the database's encoding: LATIN1 text is converted.
$primary->safe_psql('postgres',
	"CREATE DATABASE latin1 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
is( $primary->safe_psql(
		'latin1', q{
		SET client_encoding = 'UTF8';
		CREATE EXTENSION gpu_ivfpq;
		CREATE TABLE w (word text);
		INSERT INTO w VALUES ('cañón'), ('canon'), ('camión'), ('pingüino'), ('año'), ('caña');
		CREATE INDEX w_lc ON w USING gpu_metric (word) WITH (bucket = 2);
		SET enable_seqscan = off;
		SELECT 'cañón' <~> 'canon';
		SELECT string_agg(word || '=' || (word <~> 'cañon'), ',' ORDER BY word <~> 'cañon', word)
		FROM w WHERE word <% edit_range('cañon', 2);
		SELECT string_agg(word, ',' ORDER BY rank) FROM gpu_metric_knn_batch('w_lc', ARRAY['pingüinos'], 2);
	}),
	"2\ncanon=1,cañón=1,año=2,caña=2\npingüino,canon",
	'a LATIN1 database: distances on code points, index and batch answers in its encoding');
# SQL_ASCII: bytes are read as UTF-8; others are refused.
$primary->safe_psql('postgres',
	"CREATE DATABASE ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0");
$primary->safe_psql('ascii', 'CREATE EXTENSION gpu_ivfpq');
is($primary->safe_psql('ascii', q{SELECT 'cañón' <~> 'canon'}),
	'2', 'a SQL_ASCII database: UTF-8 text is measured on code points');
my ($rc, $out, $err) = $primary->psql('ascii', q{SELECT E'ca\\xf1on' <~> 'canon'});
like($err, qr/invalid byte sequence for encoding "UTF8"/,
	'a SQL_ASCII database: text that is not UTF-8 is an error');

# ---------------------------------------------------------------- pg_trgm beside
SKIP:
{
	skip 'pg_trgm is not installed', 2
	  unless $primary->safe_psql('postgres',
		"SELECT count(*) FROM pg_available_extensions WHERE name = 'pg_trgm'");
	$primary->safe_psql('postgres',
		'CREATE EXTENSION pg_trgm; CREATE INDEX words_trgm ON words USING gin (word gin_trgm_ops)');
	is( $primary->safe_psql(
			'postgres', q{
			SELECT 'cassa' <~> 'casa', ('cassa' <-> 'casa') BETWEEN 0 AND 1,
				   'casa' <% 'cassa', 'casa' <% edit_range('cassa', 1), 'casa' % 'cassa'}),
		'1|t|t|t|t',
		'pg_trgm in the same schema: its <->, <% and % beside <~> and <% edit_range');
	like(
		$primary->safe_psql('postgres',
			"EXPLAIN (COSTS OFF) SELECT id FROM words WHERE word <% edit_range('casamentarr', 1)"),
		qr/words_(lc|sss)/,
		'with a trigram index beside, ranges still use a gpu_metric index');
}

$standby->stop;
$primary->stop;
done_testing();
