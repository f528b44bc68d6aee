# Several GPUs: the service's GPU process serves three emulated GPUs (or
# every GPU of the machine with GPU_IVFPQ_EXPECT_GPU=1). Mirrors are
# replicated while a copy fits one GPU's budget and sharded otherwise, or as
# the index option or the session setting asks; the views show where each
# mirror lives and what each GPU holds and did; the answers are the exact
# ones (every list probed, every candidate re-ranked) however the index is
# placed, through inserts, deletes and VACUUM; and a GPU taken off the list
# (gpu_ivfpq.devices) moves its mirrors to the others.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $gpu = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 1 : 0;
my $node = PostgreSQL::Test::Cluster->new('multi_gpu');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'gpu_ivfpq'
gpu_ivfpq.service_emulate_gpu = @{[ $gpu ? 'off' : 'on' ]}
gpu_ivfpq.service_emulate_devices = 3
});
$node->start;

my $state = $gpu ? 'running (GPU)' : 'running (GPU emulated on the CPU, for tests)';
sub serving
{
	return $node->poll_query_until('postgres',
		"SELECT state = '$state' AND gpu_process_pid IS NOT NULL FROM gpu_ivfpq_status");
}

$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION gpu_ivfpq;
	CREATE TABLE items (id int PRIMARY KEY, v real[]);
	INSERT INTO items
	SELECT g, ARRAY[sin(g), cos(g), sin(g * 0.7), cos(g * 1.3), sin(g * 0.37), cos(g * 0.11),
	                sin(g * 2.1), cos(g * 0.53)]::real[]
	FROM generate_series(1, 3000) g;
	CREATE INDEX items_v ON items USING gpu_ivfpq (v) WITH (lists = 16, m = 4);
	ALTER DATABASE postgres SET gpu_ivfpq.probes = 16;
	ALTER DATABASE postgres SET gpu_ivfpq.rerank = 1000;
	ALTER DATABASE postgres SET enable_seqscan = off;
	ALTER DATABASE postgres SET gpu_ivfpq.device = gpu;
});
ok(serving(), 'the GPU process serves') or BAIL_OUT('no GPU process');

my $ngpus = $node->safe_psql('postgres', 'SELECT count(*) FROM gpu_ivfpq_devices');
SKIP:
{
	skip 'one GPU only: placement over several needs two', 1 if $ngpus < 2;

	# The exact answers of a few queries, from a sequential scan.
	my @queries = map { "ARRAY[sin($_ * 1.7), cos($_), 0.3, -0.2, sin($_), 0.1, cos($_ * 0.3), 0.5]::real[]" } 1 .. 6;
	sub answers
	{
		my ($opts) = @_;
		return join "\n", map {
			$node->safe_psql('postgres',
				"$opts SELECT string_agg(id::text, ',') FROM (SELECT id FROM items ORDER BY v <-> $_ LIMIT 10) r")
		} @queries;
	}
	sub exact
	{
		return answers('SET enable_indexscan = off; SET enable_seqscan = on; SET gpu_ivfpq.device = cpu;');
	}
	sub mirror
	{
		return $node->safe_psql('postgres',
			"SELECT placement || ' ' || devices::text || ' ' || entries FROM gpu_ivfpq_mirrors");
	}
	my $served = sub {
		return $node->safe_psql('postgres', 'SELECT queries_gpu FROM gpu_ivfpq_status');
	};

	is($node->safe_psql('postgres', 'SELECT count(*) FROM gpu_ivfpq_devices WHERE alive'),
		$ngpus, 'the devices view lists every GPU, alive');
	my $all = join ',', 0 .. $ngpus - 1;

	# Auto, plenty of room: a copy on every GPU.
	my $before = $served->();
	is(answers(''), exact(), 'replicas answer exactly');
	cmp_ok($served->(), '>', $before, 'the GPU service served them');
	is(mirror(), "replicate {$all} 3000", 'the mirror is replicated on every GPU');
	is($node->safe_psql('postgres', 'SELECT count(*) FROM gpu_ivfpq_devices WHERE mirrors = 1 AND memory_used_mb > 0'),
		$ngpus, 'each GPU holds a copy');

	# The index option: shards (taken at the next load).
	$node->safe_psql('postgres', "ALTER INDEX items_v SET (placement = shard); SELECT gpu_ivfpq_prewarm('items_v')");
	is(mirror(), "shard {$all} 3000", 'the index option shards the mirror over every GPU');
	is(answers(''), exact(), 'shards answer exactly');

	# Changes reach the shard holding their list; VACUUM's removals every shard.
	$node->safe_psql(
		'postgres', q{
		INSERT INTO items SELECT g, ARRAY[cos(g), sin(g), 0.2, 0.1, -0.3, sin(g * 0.2), 0.7, cos(g * 3)]::real[]
		FROM generate_series(3001, 3600) g;
		DELETE FROM items WHERE id % 5 = 0;
	});
	$node->safe_psql('postgres', 'VACUUM items');
	is(answers(''), exact(), 'shards answer exactly after inserts, deletes and VACUUM');
	is(mirror(), "shard {$all} 2880", 'the shards hold every live entry');

	# The session setting wins over the option.
	$node->safe_psql('postgres', "SET gpu_ivfpq.placement = replicate; SELECT gpu_ivfpq_prewarm('items_v')");
	is(mirror(), "replicate {$all} 2880", 'the session setting replicates');
	is($node->psql('postgres', "ALTER INDEX items_v SET (placement = everywhere)"),
		3, 'an unknown placement is refused');

	# A budget a copy cannot fit: auto shards, with the same answers.
	$node->safe_psql('postgres', "ALTER INDEX items_v RESET (placement)");
	my $size_kb = $node->safe_psql('postgres', 'SELECT ceil(size_mb * 1024 / ' . $ngpus . ')::int FROM gpu_ivfpq_mirrors');
	my $budget_kb = int($size_kb * 0.7) + 1;
	$node->safe_psql('postgres',
		"ALTER SYSTEM SET gpu_ivfpq.gpu_memory_budget = '${budget_kb}kB'; SELECT pg_reload_conf()");
	$node->poll_query_until('postgres', "SELECT count(*) = 0 FROM gpu_ivfpq_mirrors")
	  or diag('the mirror was not evicted: ' . mirror());
	is(answers(''), exact(), 'answers under a small budget are exact');
	is(mirror(), "shard {$all} 2880", 'a mirror larger than one GPU\'s budget is sharded');
	ok($node->safe_psql('postgres', "SELECT bool_and(memory_used_mb * 1024 <= $budget_kb) FROM gpu_ivfpq_devices"),
		'each GPU stays within its budget');
	$node->safe_psql('postgres', "ALTER SYSTEM RESET gpu_ivfpq.gpu_memory_budget; SELECT pg_reload_conf()");

	# A GPU taken off the list: a new GPU process on the others; the mirror follows.
	my $rest = join ',', grep { $_ != 1 } 0 .. $ngpus - 1;
	my $pid = $node->safe_psql('postgres', 'SELECT gpu_process_pid FROM gpu_ivfpq_status');
	$node->safe_psql('postgres', "ALTER SYSTEM SET gpu_ivfpq.devices = '$rest'; SELECT pg_reload_conf()");
	ok( $node->poll_query_until(
			'postgres',
			"SELECT gpu_process_pid IS NOT NULL AND gpu_process_pid <> $pid AND state = '$state' FROM gpu_ivfpq_status"),
		'a new GPU process serves the GPUs left');
	is($node->safe_psql('postgres', 'SELECT string_agg(device::text, \',\' ORDER BY device) FROM gpu_ivfpq_devices'),
		$rest, 'the devices view lists the GPUs left');
	is(answers(''), exact(), 'answers after a GPU left are exact');
	is(mirror(), "replicate {$rest} 2880", 'the mirror reloaded on the GPUs left');
	$node->safe_psql('postgres', "ALTER SYSTEM SET gpu_ivfpq.devices = '99'; SELECT pg_reload_conf()");
	ok( $node->poll_query_until(
			'postgres', "SELECT state NOT LIKE 'running (GPU%' AND gpu_process_pid IS NULL FROM gpu_ivfpq_status"),
		'a list naming no visible GPU leaves the service on the CPU');
	is(answers('SET gpu_ivfpq.device = auto;'), exact(), 'the CPU engine answers exactly meanwhile');
	is($node->psql('postgres', "ALTER SYSTEM SET gpu_ivfpq.devices = 'zero'"), 3, 'a malformed list is refused');
	$node->safe_psql('postgres', "ALTER SYSTEM RESET gpu_ivfpq.devices; SELECT pg_reload_conf()");
	ok(serving(), 'every GPU serves again');
	is($node->safe_psql('postgres', 'SELECT count(*) FROM gpu_ivfpq_devices'), $ngpus, 'with every GPU');
}

$node->stop;
done_testing();
