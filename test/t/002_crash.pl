# Crash safety of gpu_ivfpq indexes: pgbench clients insert, delete and
# VACUUM concurrently while the server crashes (an immediate shutdown, then
# a backend killed with SIGKILL, which makes the postmaster reinitialize).
# After each crash recovery every committed row is found through the index
# (exactly once), each row's own vector finds that row first, and the index
# keeps working. An unlogged table's index comes back empty and usable.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use CrashRestart;

my $node = PostgreSQL::Test::Cluster->new('main');
$node->init;
$node->append_conf('postgresql.conf', "maintenance_work_mem = '64MB'");
$node->start;

$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION gpu_ivfpq;
	-- A trained index.
	CREATE TABLE items (id bigserial, v real[]);
	SELECT setseed(0.1);
	INSERT INTO items (v)
	SELECT ARRAY(SELECT random()::real FROM generate_series(1, 16) WHERE g > 0)
	FROM generate_series(1, 3000) g;
	CREATE INDEX items_idx ON items USING gpu_ivfpq (v) WITH (lists = 16, m = 4);
	-- An untrained index (built on an empty table).
	CREATE TABLE fresh (id bigserial, v real[]);
	CREATE INDEX fresh_idx ON fresh USING gpu_ivfpq (v) WITH (lists = 16);
	-- An unlogged table.
	CREATE UNLOGGED TABLE scratch (id bigserial, v real[]);
	INSERT INTO scratch (v)
	SELECT ARRAY(SELECT random()::real FROM generate_series(1, 16) WHERE g > 0)
	FROM generate_series(1, 1000) g;
	CREATE INDEX scratch_idx ON scratch USING gpu_ivfpq (v) WITH (lists = 8);
});

my $dir = PostgreSQL::Test::Utils::tempdir;
my $vector = 'ARRAY(SELECT random()::real FROM generate_series(1, 16) WHERE g > 0)';
PostgreSQL::Test::Utils::append_to_file(
	"$dir/insert.sql", qq{
BEGIN;
INSERT INTO items (v) SELECT $vector FROM generate_series(1, 5) g;
INSERT INTO fresh (v) SELECT $vector FROM generate_series(1, 5) g;
INSERT INTO scratch (v) SELECT $vector FROM generate_series(1, 5) g;
COMMIT;
});
PostgreSQL::Test::Utils::append_to_file(
	"$dir/delete.sql", q{
\set d random(1, 30000)
DELETE FROM items WHERE id = :d;
DELETE FROM fresh WHERE id = :d;
});
PostgreSQL::Test::Utils::append_to_file(
	"$dir/update.sql", qq{
\\set d random(1, 30000)
UPDATE items SET v = $vector FROM generate_series(1, 1) g WHERE id = :d;
});
PostgreSQL::Test::Utils::append_to_file("$dir/vacuum.sql",
	"VACUUM items;\nVACUUM fresh;\n");

# Starts pgbench in the background; returns its handle.
sub start_load
{
	my ($out, $err) = ('', '');
	my $h = IPC::Run::start(
		[
			'pgbench', '-n', '-c', '4', '-j', '2', '-T', '120',
			'-f', "$dir/insert.sql\@10",
			'-f', "$dir/delete.sql\@3",
			'-f', "$dir/update.sql\@2",
			'-f', "$dir/vacuum.sql\@1",
			'-h', $node->host, '-p', $node->port, 'postgres'
		],
		'<', \undef, '>', \$out, '2>', \$err,
		IPC::Run::timeout(180));
	return $h;
}

# Waits until the load has committed at least $rows more rows into items.
sub wait_for_rows
{
	my ($rows) = @_;
	my $start = $node->safe_psql('postgres', 'SELECT max(id) FROM items');
	$node->poll_query_until('postgres',
		"SELECT max(id) >= $start + $rows FROM items")
	  or die "the load did not insert rows";
}

# Every committed row of $table is found through the index exactly once,
# and each row's vector finds that row first.
sub check_table
{
	my ($step, $table) = @_;
	my $exact =
	  'SET enable_seqscan = off; SET gpu_ivfpq.probes = 65536; '
	  . 'SET gpu_ivfpq.rerank = 1000000; SET gpu_ivfpq.max_scan_tuples = 100000000;';
	my $zero = "array_fill(0::real, ARRAY[16])";

	my $plan = $node->safe_psql('postgres',
		"$exact EXPLAIN (COSTS OFF) SELECT id FROM $table ORDER BY v <-> $zero");
	like($plan, qr/Index Scan using ${table}_idx/, "$step: $table: index scan plan");

	my $heap = $node->safe_psql('postgres',
		"SET enable_indexscan = off; SELECT count(*), string_agg(id::text, ',' ORDER BY id) FROM $table"
	);
	my $index = $node->safe_psql('postgres',
		"$exact SELECT count(*), string_agg(id::text, ',' ORDER BY id) FROM "
		  . "(SELECT id FROM $table ORDER BY v <-> $zero) x");
	my ($count) = split /\|/, $heap;
	ok($count > 0, "$step: $table has rows ($count)");
	is($index, $heap, "$step: $table: the index returns every row once");

	my $self = $node->safe_psql(
		'postgres', qq{
		$exact
		SELECT count(*) FILTER (WHERE found = id), count(*) FROM (
			SELECT s.id, (SELECT t.id FROM $table t ORDER BY t.v <-> s.v LIMIT 1) AS found
			FROM (SELECT id, v FROM $table ORDER BY id DESC LIMIT 100) s) x;
	});
	my ($found, $total) = split /\|/, $self;
	is($found, $total, "$step: $table: each of the newest rows is its own nearest neighbour");
}

# The unlogged table is empty after a crash; its index works.
sub check_unlogged
{
	my ($step) = @_;
	is($node->safe_psql('postgres', 'SELECT count(*) FROM scratch'),
		'0', "$step: the unlogged table is empty");
	$node->safe_psql(
		'postgres', q{
		INSERT INTO scratch (v)
		SELECT ARRAY(SELECT random()::real FROM generate_series(1, 16) WHERE g > 0)
		FROM generate_series(1, 300) g;
	});
	my $q = "ORDER BY v <-> array_fill(0.5::real, ARRAY[16]) LIMIT 10";
	is( $node->safe_psql('postgres',
			"SET enable_seqscan = off; SELECT array_agg(id) FROM (SELECT id FROM scratch $q) x"),
		$node->safe_psql('postgres',
			"SET enable_indexscan = off; SELECT array_agg(id) FROM (SELECT id FROM scratch $q) x"),
		"$step: the unlogged table's index answers exactly after new inserts");
	$node->safe_psql('postgres', 'TRUNCATE scratch');
}

check_table('before any crash', 'items');

# Crash 1: immediate shutdown under load.
my $load = start_load();
wait_for_rows(2000);
$node->stop('immediate');
$load->finish;
$node->start;
check_table('after immediate shutdown', 'items');
check_table('after immediate shutdown', 'fresh');
check_unlogged('after immediate shutdown');

# Crash 2: a backend killed with SIGKILL; the postmaster restarts the others
# and recovers.
$node->append_conf('postgresql.conf', 'restart_after_crash = on');
$node->reload;
$load = start_load();
wait_for_rows(2000);
# A pgbench backend, preferably one inside a transaction.
my $pid = $node->safe_psql(
	'postgres', q{
	SELECT pid FROM pg_stat_activity
	WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()
	ORDER BY state = 'idle in transaction' OR query LIKE 'INSERT%' DESC LIMIT 1});
ok($pid =~ /^\d+$/, 'found a pgbench backend');
kill 'KILL', $pid;
$load->finish;
CrashRestart::poll_until($node, 'SELECT true')
  or die "the server did not come back";
check_table('after backend crash', 'items');
check_table('after backend crash', 'fresh');
check_unlogged('after backend crash');

# After recovery: more load, VACUUM, and a clean restart.
$load = start_load();
wait_for_rows(500);
$load->kill_kill;
$load->finish;
$node->safe_psql('postgres', 'VACUUM items; VACUUM fresh');
$node->restart;
check_table('after recovery, load and restart', 'items');
check_table('after recovery, load and restart', 'fresh');

$node->stop;
done_testing();
