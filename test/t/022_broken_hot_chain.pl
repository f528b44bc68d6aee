# CREATE INDEX over HOT chains that the new index breaks: rows updated
# (HOT, their vector not yet indexed) while an older snapshot still sees
# their old versions. The index points at the chains' roots with the new
# vectors, so it must not serve that older snapshot: PostgreSQL marks it
# (pg_index.indcheckxmin) when the build reports a broken chain. A serial
# build and a build that reads the table over parallel workers (the
# workers see the chains, and hand the fact back) both report it, and the
# old snapshot's k-NN query does not use the index and finds the old rows.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('hot_chain');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
autovacuum = off
max_worker_processes = 8
max_parallel_workers = 4
});
$node->start;
$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION gpu_ivfpq;
	-- Room on every page for the updated versions: the updates stay HOT.
	CREATE TABLE t (id int PRIMARY KEY, v real[]) WITH (fillfactor = 50);
	INSERT INTO t SELECT i, ARRAY[sin(i), cos(i * 1.3), sin(i * 0.7), cos(i * 0.11)]::real[]
	FROM generate_series(1, 60000) i;
});

my $round = 0;
foreach my $workers (0, 2)
{
	my $what = $workers ? 'parallel build' : 'serial build';
	$round++;

	# An older snapshot: sees every row as it is now.
	my $old = $node->background_psql('postgres');
	$old->query_safe(q{BEGIN ISOLATION LEVEL REPEATABLE READ});
	$old->query_safe(q{SELECT count(*) FROM t});

	# Rows 1 to 20 move far away; the only index is on id, so the updates are HOT.
	my $hot_before = $node->safe_psql('postgres',
		q{SELECT pg_stat_get_tuples_hot_updated('t'::regclass)});
	$node->safe_psql('postgres',
		qq{UPDATE t SET v = ARRAY[100 + id + $round, 100, 100, 100]::real[] WHERE id <= 20});
	ok( $node->poll_query_until(
			'postgres', qq{
			SELECT pg_stat_get_tuples_hot_updated('t'::regclass) >= $hot_before + 20}),
		"$what: the updates were HOT");

	my ($ret, $stdout, $stderr) = $node->psql(
		'postgres', qq{
		SET client_min_messages = debug1;
		SET max_parallel_maintenance_workers = $workers;
		SET min_parallel_table_scan_size = 0;
		SET maintenance_work_mem = '256MB';
		CREATE INDEX t_v ON t USING gpu_ivfpq (v) WITH (lists = 16, m = 2);
	});
	is($ret, 0, "$what: CREATE INDEX") or diag($stderr);
	if ($workers)
	{
		like($stderr, qr/reading table "t" with \d+ parallel workers/,
			"$what: the table was read by parallel workers");
	}
	else
	{
		unlike($stderr, qr/parallel workers/, "$what: the table was read serially");
	}
	is($node->safe_psql('postgres', q{SELECT indcheckxmin FROM pg_index WHERE indexrelid = 't_v'::regclass}),
		't', "$what: the index is marked for snapshots older than its build");

	# The old snapshot plans without the index and sees the old vectors:
	# row 1's old vector (the one it had before this round's update) is
	# nearest to itself.
	my $was = $round == 1
	  ? q{'{0.8414709848,0.2674988286,0.6442176872,0.9939560235}'::real[]}
	  : 'ARRAY[100 + 1 + ' . ($round - 1) . ', 100, 100, 100]::real[]';
	$old->query_safe(q{SET enable_seqscan = off});
	my $plan = $old->query_safe(qq{EXPLAIN (COSTS OFF) SELECT id FROM t ORDER BY v <-> $was LIMIT 1});
	unlike($plan, qr/t_v/, "$what: the older snapshot's plan does not use the index");
	is($old->query_safe(qq{SELECT id FROM t ORDER BY v <-> $was LIMIT 1}),
		'1', "$what: the older snapshot finds row 1 at its old vector");
	$old->query_safe(q{COMMIT});
	$old->quit;

	# A new snapshot uses the index and finds the rows where they are now.
	like(
		$node->safe_psql(
			'postgres', qq{
			SET enable_seqscan = off;
			EXPLAIN (COSTS OFF) SELECT id FROM t ORDER BY v <-> ARRAY[100 + 1 + $round, 100, 100, 100]::real[] LIMIT 1}),
		qr/Index Scan using t_v/, "$what: a new snapshot's plan uses the index");
	is( $node->safe_psql(
			'postgres', qq{
			SET enable_seqscan = off;
			SET gpu_ivfpq.probes = 16;
			SELECT id FROM t ORDER BY v <-> ARRAY[100 + 1 + $round, 100, 100, 100]::real[] LIMIT 1}),
		'1', "$what: a new snapshot finds row 1 at its new vector");
	$node->safe_psql('postgres', q{DROP INDEX t_v});
}

$node->stop;
done_testing();
