# gpu_metric searches of several connections at once on the GPU (emulated):
# the GPU process merges the range and k-NN searches of one mirror and kind
# queued on the direct path in one pass into one GPU call and splits the
# hits back. Each of 8 pgbench clients runs range and
# k-NN index scans and small batch calls on a word table built here and
# checks every answer against a sequential scan's (<~> row by row), raising
# an error on a difference; the status view then shows GPU batches of more
# than one query on average.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('metric_concurrency');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_preload_libraries = 'gpu_ivfpq'
gpu_ivfpq.service_emulate_gpu = on
gpu_ivfpq.batch_wait = 5000
max_connections = 30
autovacuum = off
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gpu_ivfpq');
$node->poll_query_until('postgres', q{SELECT state LIKE '%emulated%' FROM gpu_ivfpq_status})
  or die 'the service did not start its emulated GPU';

# 800 words of syllables, some words in several copies (ties), and 16 queries.
$node->safe_psql(
	'postgres', q{
	CREATE TABLE words (id serial PRIMARY KEY, word text);
	INSERT INTO words (word)
	SELECT a || b || c
	FROM unnest(ARRAY['ca', 'sa', 'pe', 'ño', 'lá', 'ti', 'mo', 'rú', 'ce', 'za']) x(a),
	     unnest(ARRAY['ca', 'sa', 'pe', 'ño', 'lá', 'ti', 'mo', 'rú', 'ce', 'za']) y(b),
	     unnest(ARRAY['', 's', 'ca', 'sa', 'pe', 'ño', 'lá', 'ti']) z(c);
	INSERT INTO words (word) VALUES ('cassa'), ('casa'), ('caza'), ('cañón'), (''), ('casa');
	CREATE TABLE queries (qid int PRIMARY KEY, q text);
	INSERT INTO queries VALUES (1, 'casa'), (2, 'cañon'), (3, 'pesati'), (4, ''), (5, 'zamorú'), (6, 'x'),
		(7, 'cepeño'), (8, 'tilá'), (9, 'morúsa'), (10, 'zaza'), (11, 'ñoñoti'), (12, 'lácaca'),
		(13, 'sapeño'), (14, 'rúmo'), (15, 'cecé'), (16, 'tisati');
	-- The reference: every (query, word) distance, row by row.
	CREATE TABLE ref AS SELECT q.qid, w.id, w.word <~> q.q AS d FROM queries q, words w;
	CREATE INDEX ON ref (qid, d);
	CREATE INDEX words_idx ON words USING gpu_metric (word) WITH (method = lc, bucket = 8);
	ANALYZE words, queries, ref;
});
ok($node->safe_psql('postgres', q{SELECT gpu_metric_prewarm('words_idx')}) > 0, 'the index is mirrored');

# One check: a query at a radius (range: index scan and a one-query batch
# call) and its k nearest (distances: ties may order differently); every GPU
# answer required (gpu_ivfpq.device = gpu).
$node->safe_psql(
	'postgres', q{
	CREATE FUNCTION check_query(p_qid int, rad int, k int) RETURNS int LANGUAGE plpgsql AS $$
	DECLARE
		qq text;
		got text;
		want text;
	BEGIN
		PERFORM set_config('gpu_ivfpq.device', 'gpu', true);
		PERFORM set_config('enable_seqscan', 'off', true);
		PERFORM set_config('enable_bitmapscan', 'off', true);
		SELECT q INTO qq FROM queries WHERE qid = p_qid;
		SELECT string_agg(id::text, ',' ORDER BY id) INTO want FROM ref WHERE qid = p_qid AND d <= rad;
		SELECT string_agg(id::text, ',' ORDER BY id) INTO got FROM words w WHERE w.word <% edit_range(qq, rad);
		IF got IS DISTINCT FROM want THEN
			RAISE EXCEPTION 'range scan of query % at %: got %, want %', p_qid, rad, got, want;
		END IF;
		SELECT string_agg(w.id::text, ',' ORDER BY w.id) INTO got
		FROM gpu_metric_range_batch('words_idx', ARRAY[qq], rad) b JOIN words w ON w.ctid = b.tid;
		IF got IS DISTINCT FROM want THEN
			RAISE EXCEPTION 'range batch of query % at %: got %, want %', p_qid, rad, got, want;
		END IF;
		SELECT string_agg(d::text, ',' ORDER BY d) INTO want
		FROM (SELECT d FROM ref WHERE qid = p_qid ORDER BY d LIMIT k) r;
		SELECT string_agg(d::text, ',' ORDER BY rn) INTO got
		FROM (SELECT w.word <~> qq AS d, row_number() OVER () AS rn
			  FROM (SELECT word FROM words w WHERE w.word IS NOT NULL ORDER BY w.word <~> qq LIMIT k) w) x;
		IF got IS DISTINCT FROM want THEN
			RAISE EXCEPTION 'k-NN scan of query % (k %): got %, want %', p_qid, k, got, want;
		END IF;
		SELECT string_agg(distance::text, ',' ORDER BY rank) INTO got
		FROM gpu_metric_knn_batch('words_idx', ARRAY[qq], k);
		IF got IS DISTINCT FROM want THEN
			RAISE EXCEPTION 'k-NN batch of query % (k %): got %, want %', p_qid, k, got, want;
		END IF;
		RETURN 1;
	END $$;
});
is($node->safe_psql('postgres', 'SELECT sum(check_query(qid, 2, 5)) FROM queries'), '16', 'one connection: every answer right');

my $before = $node->safe_psql('postgres', 'SELECT batches || \' \' || queries_gpu FROM gpu_ivfpq_status');

# 8 clients at once, each a random query, radius (0 to 3) and k (1, 3, 7).
my $tmp = PostgreSQL::Test::Utils::tempdir;
open(my $fh, '>', "$tmp/check.sql") or die;
print $fh "\\set q random(1, 16)\n\\set r random(0, 3)\n\\set k random(1, 3)\n"
  . "SELECT check_query(:q, :r, CASE :k WHEN 1 THEN 1 WHEN 2 THEN 3 ELSE 7 END);\n";
close $fh;
my ($out, $err) = ('', '');
my $ok = IPC::Run::run(
	[ 'pgbench', '-n', '-c', '8', '-j', '8', '-t', '60', '-f', "$tmp/check.sql", '-h', $node->host,
	  '-p', $node->port, 'postgres' ],
	'>', \$out, '2>', \$err);
ok($ok, '8 clients at once: every answer equals the sequential scan\'s') or diag("$out\n$err");
like($out, qr/number of transactions actually processed: 480\/480/, 'all 480 checks ran');

my ($batches, $queries) = split / /,
  $node->safe_psql('postgres', q{SELECT batches || ' ' || queries_gpu FROM gpu_ivfpq_status});
my ($b0, $q0) = split / /, $before;
my $mean = ($queries - $q0) / (($batches - $b0) || 1);
note(sprintf('concurrent GPU batches: %d for %d queries, mean %.2f', $batches - $b0, $queries - $q0, $mean));
cmp_ok($queries - $q0, '>=', 4 * 480, 'the GPU answered every search');
cmp_ok($mean, '>', 1, 'merged: GPU batches of more than one query on average');
is($node->safe_psql('postgres', q{SELECT mean_batch > 1 FROM gpu_ivfpq_status}), 't',
	'the status view\'s mean batch is above 1');
is($node->safe_psql('postgres', q{SELECT coalesce(last_error, '') FROM gpu_ivfpq_status}), '', 'no service error');

$node->stop;
done_testing();
