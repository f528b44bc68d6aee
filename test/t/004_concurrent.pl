# Concurrency: pgbench clients insert, update, delete, VACUUM and run k-NN
# scans at the same time, without errors; CREATE INDEX CONCURRENTLY and
# REINDEX CONCURRENTLY run under that load. Afterwards every row is found
# through each index exactly once and exact settings give the results of a
# sequential scan.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('main');
$node->init;
$node->append_conf('postgresql.conf', "maintenance_work_mem = '64MB'");
$node->start;

# A random vector per row of generate_series(...) g, and one per query.
my $vector = 'ARRAY(SELECT random()::real FROM generate_series(1, 16) WHERE g > 0)';
my $query = 'ARRAY(SELECT random()::real FROM generate_series(1, 16))';
$node->safe_psql(
	'postgres', qq{
	CREATE EXTENSION gpu_ivfpq;
	CREATE TABLE items (id bigserial, v real[]);
	SELECT setseed(0.2);
	INSERT INTO items (v) SELECT $vector FROM generate_series(1, 4000) g;
	CREATE INDEX items_l2 ON items USING gpu_ivfpq (v) WITH (lists = 16, m = 4);
	-- The scans of the load use the index.
	ALTER DATABASE postgres SET enable_seqscan = off;
	ALTER DATABASE postgres SET gpu_ivfpq.probes = 4;
	ALTER DATABASE postgres SET gpu_ivfpq.rerank = 50;
});

my $dir = PostgreSQL::Test::Utils::tempdir;
PostgreSQL::Test::Utils::append_to_file(
	"$dir/insert.sql", qq{
INSERT INTO items (v) SELECT $vector FROM generate_series(1, 5) g;
});
PostgreSQL::Test::Utils::append_to_file(
	"$dir/change.sql", qq{
\\set d random(1, 20000)
UPDATE items SET v = $vector FROM generate_series(1, 1) g WHERE id = :d;
\\set d random(1, 20000)
DELETE FROM items WHERE id = :d;
});
PostgreSQL::Test::Utils::append_to_file(
	"$dir/scan.sql", qq{
SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> $query LIMIT 10) x;
SELECT count(*) FROM (SELECT id FROM items WHERE id % 7 = 0 ORDER BY v <-> $query LIMIT 10) x;
});
PostgreSQL::Test::Utils::append_to_file("$dir/vacuum.sql", "VACUUM items;\n");

# Runs pgbench for $seconds in the background; returns a handle and its
# output.
sub start_load
{
	my ($seconds) = @_;
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			'pgbench', '-n', '-c', '4', '-j', '2', '-T', $seconds,
			'-f', "$dir/insert.sql\@10",
			'-f', "$dir/change.sql\@3",
			'-f', "$dir/scan.sql\@6",
			'-f', "$dir/vacuum.sql\@1",
			'-h', $node->host, '-p', $node->port, 'postgres'
		],
		'<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout(300));
	return ($h, \$out, \$err);
}

sub finish_load
{
	my ($step, $h, $out, $err) = @_;
	my $ok = $h->finish;
	ok($ok, "$step: pgbench ran without errors") or diag("$$out\n$$err");
	like($$out, qr/number of transactions actually processed: [1-9]/,
		"$step: pgbench processed transactions");
	note("$step: $1") if $$out =~ /(number of transactions actually processed: \d+)/;
}

# Every row is found through $index exactly once; exact settings match a
# sequential scan.
sub check_index
{
	my ($step, $index, $op) = @_;
	my $exact =
	  'SET enable_seqscan = off; SET gpu_ivfpq.probes = 65536; '
	  . 'SET gpu_ivfpq.rerank = 1000000; SET gpu_ivfpq.max_scan_tuples = 100000000;';
	my $q = 'array_fill(0.5::real, ARRAY[16])';

	like(
		$node->safe_psql('postgres',
			"$exact EXPLAIN (COSTS OFF) SELECT id FROM items ORDER BY v $op $q"),
		qr/Index Scan using $index/,
		"$step: $index is used");
	is( $node->safe_psql('postgres',
			"$exact SELECT count(*), string_agg(id::text, ',' ORDER BY id) FROM (SELECT id FROM items ORDER BY v $op $q) x"
		),
		$node->safe_psql('postgres',
			"SET enable_seqscan = on; SET enable_indexscan = off; SELECT count(*), string_agg(id::text, ',' ORDER BY id) FROM items"
		),
		"$step: $index returns every row once");
	is( $node->safe_psql('postgres',
			"$exact SELECT array_agg(id) FROM (SELECT id FROM items ORDER BY v $op $q LIMIT 20) x"),
		$node->safe_psql('postgres',
			"SET enable_seqscan = on; SET enable_indexscan = off; SELECT array_agg(id) FROM (SELECT id FROM items ORDER BY v $op $q LIMIT 20) x"
		),
		"$step: $index with exact settings equals a sequential scan");
}

# Load alone: inserts, updates, deletes, VACUUM and scans.
my @load = start_load(8);
finish_load('load', @load);
check_index('after the load', 'items_l2', '<->');

# CREATE INDEX CONCURRENTLY under load (its validation pass inserts the rows
# that came in meanwhile).
@load = start_load(15);
sleep 2;
$node->safe_psql('postgres',
	'CREATE INDEX CONCURRENTLY items_cos ON items USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 8)');
finish_load('create index concurrently', @load);
is( $node->safe_psql('postgres',
		"SELECT indisvalid FROM pg_index WHERE indexrelid = 'items_cos'::regclass"),
	't', 'the concurrently built index is valid');
check_index('after create index concurrently', 'items_cos', '<=>');
check_index('after create index concurrently', 'items_l2', '<->');

# REINDEX CONCURRENTLY under load.
@load = start_load(15);
sleep 2;
$node->safe_psql('postgres', 'REINDEX INDEX CONCURRENTLY items_l2');
finish_load('reindex concurrently', @load);
check_index('after reindex concurrently', 'items_l2', '<->');
check_index('after reindex concurrently', 'items_cos', '<=>');

# VACUUM, then the same checks.
$node->safe_psql('postgres', 'VACUUM items');
check_index('after vacuum', 'items_l2', '<->');
check_index('after vacuum', 'items_cos', '<=>');

$node->stop;
done_testing();
