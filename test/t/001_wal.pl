# WAL replay of gpu_ivfpq indexes: a streaming standby follows a primary
# through builds, inserts, deletes, VACUUM, REINDEX and an index built on an
# empty table, and after each step returns the same k-NN results (with
# approximate and with exact settings) and holds byte-identical index pages.
# Finally the standby is promoted and the index takes inserts there.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', "maintenance_work_mem = '64MB'");
$primary->start;
$primary->safe_psql('postgres',
	'CREATE EXTENSION gpu_ivfpq; CREATE EXTENSION pageinspect;');

$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
$standby->start;

# Rows: id, and 16 pseudo-random dimensions derived from (seed, id), so that
# every batch of rows is deterministic.
sub insert_rows
{
	my ($table, $from, $to, $seed) = @_;
	$primary->safe_psql(
		'postgres', qq{
		SELECT setseed($seed);
		INSERT INTO $table
		SELECT i, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, 16) WHERE i > 0)
		FROM generate_series($from, $to) i;
	});
}

# The ids of the k nearest rows of each of 5 fixed query vectors, as text,
# computed on $node with the given probes and rerank (read-only: it runs on
# the standby too).
sub knn_results
{
	my ($node, $table, $op, $probes, $rerank, $k) = @_;
	return $node->safe_psql(
		'postgres', qq{
		SET enable_seqscan = off;
		SET gpu_ivfpq.probes = $probes;
		SET gpu_ivfpq.rerank = $rerank;
		SELECT setseed(0.5);
		WITH queries AS MATERIALIZED (
			SELECT q, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, 16) WHERE q > 0) AS qv
			FROM generate_series(1, 5) q)
		SELECT q, ARRAY(SELECT id FROM $table ORDER BY v $op queries.qv LIMIT $k)
		FROM queries ORDER BY q;
	});
}

# The same with a sequential scan.
sub seqscan_results
{
	my ($node, $table, $op, $k) = @_;
	return $node->safe_psql(
		'postgres', qq{
		SET enable_indexscan = off;
		SELECT setseed(0.5);
		WITH queries AS MATERIALIZED (
			SELECT q, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, 16) WHERE q > 0) AS qv
			FROM generate_series(1, 5) q)
		SELECT q, ARRAY(SELECT id FROM $table ORDER BY v $op queries.qv LIMIT $k)
		FROM queries ORDER BY q;
	});
}

# md5 of every page of the index, without its checksum field (bytes 9 and
# 10): where data checksums are on (initdb's default from PostgreSQL 18) a
# page written by the build carries one in shared buffers, its replayed copy
# on the standby not.
sub index_pages
{
	my ($node, $index) = @_;
	return $node->safe_psql(
		'postgres', qq{
		SELECT string_agg(b || ':' || md5(overlay(get_raw_page('$index', b) placing '\\x0000'::bytea from 9 for 2)),
						  ' ' ORDER BY b)
		FROM generate_series(0, (pg_relation_size('$index') / current_setting('block_size')::int)::int - 1) b;
	});
}

# Checks that the standby, once caught up, agrees with the primary.
sub check_standby
{
	my ($step, $table, $index, $op) = @_;
	$primary->wait_for_catchup($standby);

	my $pages = index_pages($primary, $index);
	like($pages, qr/^0:[0-9a-f]{32} 1:[0-9a-f]{32}/, "$step: index pages read");
	is(index_pages($standby, $index), $pages,
		"$step: standby has the same index pages");
	# Approximate settings: the answers depend on the index contents.
	my $approx = knn_results($primary, $table, $op, 2, 20, 10);
	is(knn_results($standby, $table, $op, 2, 20, 10),
		$approx, "$step: standby returns the same approximate k-NN");
	# Exact settings: equal to a sequential scan as well.
	my $exact = knn_results($primary, $table, $op, 65536, 1000000, 10);
	is(knn_results($standby, $table, $op, 65536, 1000000, 10),
		$exact, "$step: standby returns the same exact k-NN");
	is($exact, seqscan_results($standby, $table, $op, 10),
		"$step: exact k-NN on the standby equals a sequential scan");
}

# A trained index, then rounds of inserts, deletes and VACUUM.
$primary->safe_psql('postgres',
	'CREATE TABLE items (id int, v real[]) WITH (autovacuum_enabled = off)');
insert_rows('items', 1, 3000, 0.1);
$primary->safe_psql('postgres',
	'CREATE INDEX items_idx ON items USING gpu_ivfpq (v) WITH (lists = 16, m = 4)');
check_standby('build', 'items', 'items_idx', '<->');

for my $round (1 .. 3)
{
	my $base = 3000 * $round;
	insert_rows('items', $base + 1, $base + 1000, 0.1 + $round / 10);
	$primary->safe_psql('postgres',
		"DELETE FROM items WHERE id % 7 = $round OR id BETWEEN $base + 1 AND $base + 200"
	);
	check_standby("round $round, after delete", 'items', 'items_idx', '<->');
	$primary->safe_psql('postgres', 'VACUUM items');
	check_standby("round $round, after vacuum", 'items', 'items_idx', '<->');
	insert_rows('items', $base + 1001, $base + 1500, 0.15 + $round / 10);
	$primary->safe_psql('postgres',
		"UPDATE items SET v = ARRAY(SELECT -x FROM unnest(v) x) WHERE id % 11 = $round");
	check_standby("round $round, after insert and update",
		'items', 'items_idx', '<->');
}

$primary->safe_psql('postgres', 'REINDEX INDEX items_idx');
check_standby('reindex', 'items', 'items_idx', '<->');
$primary->safe_psql('postgres', 'REINDEX INDEX CONCURRENTLY items_idx');
check_standby('reindex concurrently', 'items', 'items_idx', '<->');

# Inner product and cosine indexes.
$primary->safe_psql('postgres',
	'CREATE INDEX items_ip ON items USING gpu_ivfpq (v real_ip_ops) WITH (lists = 8)');
check_standby('inner product build', 'items', 'items_ip', '<#>');
$primary->safe_psql('postgres', 'DROP INDEX items_ip');
$primary->safe_psql('postgres',
	'CREATE INDEX items_cos ON items USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 8)');
check_standby('cosine build', 'items', 'items_cos', '<=>');
$primary->safe_psql('postgres', 'DROP INDEX items_cos');

# An index built on an empty table (untrained; its first insert records the
# dimension in the metapage), then TRUNCATE and REINDEX.
$primary->safe_psql('postgres',
	'CREATE TABLE later (id int, v real[]) WITH (autovacuum_enabled = off)');
$primary->safe_psql('postgres',
	'CREATE INDEX later_idx ON later USING gpu_ivfpq (v) WITH (lists = 8)');
insert_rows('later', 1, 1500, 0.9);
check_standby('untrained', 'later', 'later_idx', '<->');
$primary->safe_psql('postgres', 'DELETE FROM later WHERE id % 3 = 0; VACUUM later');
insert_rows('later', 2001, 2300, 0.8);
check_standby('untrained, after vacuum', 'later', 'later_idx', '<->');
$primary->safe_psql('postgres', 'REINDEX INDEX later_idx');
check_standby('untrained, after reindex', 'later', 'later_idx', '<->');
$primary->safe_psql('postgres', 'TRUNCATE later');
insert_rows('later', 1, 100, 0.7);
check_standby('after truncate', 'later', 'later_idx', '<->');

# An unlogged table's index and rows are not on the standby: the functions
# say so as a query does, not "could not open file".
$primary->safe_psql(
	'postgres', q{
	CREATE UNLOGGED TABLE ul (id int, v real[]);
	INSERT INTO ul SELECT i, ARRAY[i, 1, 2, 3]::real[] FROM generate_series(1, 300) i;
	CREATE INDEX ul_idx ON ul USING gpu_ivfpq (v) WITH (lists = 2, m = 2);
});
$primary->wait_for_catchup($standby);
for my $call ("gpu_ivfpq_knn_batch('ul_idx', '{1,1,2,3}'::real[], 3)",
	"gpu_ivfpq_exact_knn('ul', 'v', '{1,1,2,3}'::real[], 3)",
	"gpu_ivfpq_prewarm('ul_idx')")
{
	my ($rc, $out, $err) = $standby->psql('postgres', "SELECT count(*) FROM $call");
	like($err, qr/cannot access temporary or unlogged relations during recovery/,
		"on the standby, $call: unlogged relations are refused as a query's are");
}
is($primary->safe_psql('postgres', q{SELECT count(*) FROM gpu_ivfpq_knn_batch('ul_idx', '{1,1,2,3}'::real[], 3)}),
	'3', 'the primary serves the unlogged index');

# Promote the standby: its index takes inserts and still answers exactly.
$primary->wait_for_catchup($standby);
$standby->promote;
$standby->safe_psql(
	'postgres', q{
	SELECT setseed(0.3);
	INSERT INTO items
	SELECT 100000 + i, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, 16) WHERE i > 0)
	FROM generate_series(1, 500) i;
	DELETE FROM items WHERE id % 5 = 0;
	VACUUM items;
});
is( knn_results($standby, 'items', '<->', 65536, 1000000, 10),
	seqscan_results($standby, 'items', '<->', 10),
	'promoted standby: exact k-NN equals a sequential scan after inserts');
is( $standby->safe_psql(
		'postgres', q{
		SET enable_seqscan = off; SET gpu_ivfpq.probes = 65536; SET gpu_ivfpq.rerank = 1000000;
		SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> array_fill(0::real, ARRAY[16])) x;
	}),
	$standby->safe_psql('postgres', 'SELECT count(*) FROM items'),
	'promoted standby: the index returns every row');

$standby->stop;
$primary->stop;
done_testing();
