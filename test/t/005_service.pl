# The GPU service process: with gpu_ivfpq in shared_preload_libraries a
# background worker starts, reports its device (none in a build without
# CUDA) in the gpu_ivfpq_status view, counts the scans served on the CPU,
# and comes back after being terminated or killed, while k-NN queries keep
# returning the exact answer. Without the preload the view says so.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

use CrashRestart;

my $node = PostgreSQL::Test::Cluster->new('service');
$node->init;
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'gpu_ivfpq'\nrestart_after_crash = on");
$node->start;

$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION gpu_ivfpq;
	CREATE TABLE items (id int, v real[]);
	INSERT INTO items
	SELECT g, ARRAY[sin(g), cos(g), sin(g * 0.7), cos(g * 1.3)]::real[]
	FROM generate_series(1, 2000) g;
	CREATE INDEX ON items USING gpu_ivfpq (v) WITH (lists = 8, m = 2);
});

# Exact settings: every list probed and every row re-ranked, so the index
# must return what a sequential scan returns. (5000 candidates are more than
# one GPU round selects, so these scans run on the CPU engine even with a
# GPU: 006_gpu_service.pl tests the GPU path.)
my $knn = q{SET enable_seqscan = off; SET gpu_ivfpq.probes = 8; SET gpu_ivfpq.rerank = 5000;
	SELECT string_agg(id::text, ',') FROM
	(SELECT id FROM items ORDER BY v <-> '{0.3, 0.2, 0.1, 0.9}' LIMIT 10) s;};
my $exact = $node->safe_psql('postgres',
	q{SELECT string_agg(id::text, ',') FROM
	(SELECT id FROM items ORDER BY v <-> '{0.3, 0.2, 0.1, 0.9}' LIMIT 10) s;});

# A build without CUDA, or a machine without a GPU, reports no device and
# serves on the CPU; GPU_IVFPQ_EXPECT_GPU=1 (the GPU machine's run) requires
# the service to have found the GPU.
my $running = q{SELECT state LIKE 'running%' AND service_pid IS NOT NULL FROM gpu_ivfpq_status};
ok($node->poll_query_until('postgres', $running), 'service is running');
my ($pid1, $device, $starts, $state) = split /\|/,
  $node->safe_psql('postgres', 'SELECT service_pid, device, service_starts, state FROM gpu_ivfpq_status');
if ($ENV{GPU_IVFPQ_EXPECT_GPU})
{
	unlike($device, qr/^none/, "GPU device reported: $device");
	is($state, 'running (GPU)', 'state says the GPU serves');
}
else
{
	is($state, $device =~ /^none/ ? 'running (no GPU: scans use the CPU)' : 'running (GPU)',
		"state matches the device ($state)");
}
is($starts, 1, 'service started once');

my $before = $node->safe_psql('postgres', 'SELECT queries_cpu FROM gpu_ivfpq_status');
is($node->safe_psql('postgres', $knn), $exact, 'index answer equals the sequential scan');
my $after = $node->safe_psql('postgres', 'SELECT queries_cpu FROM gpu_ivfpq_status');
is($after, $before + 1, 'the scan was counted as served on the CPU');

# SIGTERM: the service exits with an error and the postmaster restarts it.
# (The service has no database connection, so pg_terminate_backend does not
# know it: signal it directly.)
kill 'TERM', $pid1;
is($node->safe_psql('postgres', $knn), $exact, 'queries work while the service restarts');
ok( $node->poll_query_until(
		'postgres',
		"SELECT service_starts = 2 AND service_pid IS NOT NULL AND service_pid <> $pid1 FROM gpu_ivfpq_status"),
	'service restarted after SIGTERM');

# SIGKILL: the postmaster reinitializes shared memory and restarts everything.
my $pid2 = $node->safe_psql('postgres', 'SELECT service_pid FROM gpu_ivfpq_status');
kill 'KILL', $pid2;
# Until the postmaster has noticed the crash the old state is still visible:
# wait for a running service with another pid.
ok( CrashRestart::poll_until(
		$node,
		"SELECT state LIKE 'running%' AND service_pid IS NOT NULL AND service_pid <> $pid2 FROM gpu_ivfpq_status"),
	'a new service process runs after SIGKILL and crash restart');
is($node->safe_psql('postgres', $knn), $exact, 'queries work after the crash restart');

# Without the preload there is no service, and the view says why.
$node->append_conf('postgresql.conf', "shared_preload_libraries = ''");
$node->restart;
like($node->safe_psql('postgres', 'SELECT state FROM gpu_ivfpq_status'),
	qr/not loaded/, 'without shared_preload_libraries the view says the service is not loaded');
is($node->safe_psql('postgres', $knn), $exact, 'queries work without the service');

$node->stop;
done_testing();
