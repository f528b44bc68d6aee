# GPU faults never cost a session: while pgbench runs k-NN queries, the GPU
# process is killed with SIGKILL, then with SIGSEGV (as a fault in CUDA code
# or the driver would), then stopped (as a hung GPU would) until the service
# times it out. Every transaction must succeed with the exact answer (the
# CPU engine serves while the GPU process restarts), the postmaster must
# never reinitialise the cluster, the service itself must never restart,
# and the status view must count each death with its cause while the GPU
# serves again after each restart.
#
# The GPU process runs the CPU emulation of the GPU, or the GPU itself with
# GPU_IVFPQ_EXPECT_GPU=1 (the GPU machine's run).
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $gpu = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 1 : 0;
my $node = PostgreSQL::Test::Cluster->new('faults');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
shared_preload_libraries = 'gpu_ivfpq'
gpu_ivfpq.service_emulate_gpu = @{[ $gpu ? 'off' : 'on' ]}
gpu_ivfpq.gpu_timeout = 3
restart_after_crash = on
max_connections = 40
});
$node->start;

# 4000 rows, 16 lists all probed, 1000 candidates re-ranked: the index's
# answer is the exact one on the GPU and on the CPU alike, so each pgbench
# transaction can compare it with a sequential scan's.
$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION gpu_ivfpq;
	CREATE TABLE items (id int PRIMARY KEY, v real[]);
	INSERT INTO items
	SELECT g, ARRAY[sin(g), cos(g), sin(g * 0.7), cos(g * 1.3), sin(g * 0.37), cos(g * 0.11),
	                sin(g * 2.1), cos(g * 0.53)]::real[]
	FROM generate_series(1, 4000) g;
	CREATE INDEX items_v ON items USING gpu_ivfpq (v) WITH (lists = 16, m = 4);
	ALTER DATABASE postgres SET gpu_ivfpq.probes = 16;
	ALTER DATABASE postgres SET gpu_ivfpq.rerank = 1000;
	ALTER DATABASE postgres SET enable_seqscan = off;
});

sub status
{
	my ($cols) = @_;
	return $node->safe_psql('postgres', "SELECT $cols FROM gpu_ivfpq_status");
}

my $serving = q{SELECT state LIKE 'running (GPU%' AND gpu_process_pid IS NOT NULL FROM gpu_ivfpq_status};
ok($node->poll_query_until('postgres', $serving), 'the GPU process serves')
  or BAIL_OUT('no GPU process: ' . status('state, device, last_error'));
is(status('state'), $gpu ? 'running (GPU)' : 'running (GPU emulated on the CPU, for tests)',
	'state names the device');
$node->safe_psql('postgres', 'SELECT gpu_ivfpq_prewarm(\'items_v\')');

# Each transaction: the index's 10 nearest ids must equal the sequential
# scan's (the distance function is not an indexable operator), else a
# division by zero (volatile, so that the planner does not fold it).
my $script = $node->basedir . '/knn.sql';
open(my $fh, '>', $script) or die;
print $fh q{\set a random(1, 100000)
SELECT CASE WHEN
  (SELECT array_agg(id ORDER BY id) FROM
     (SELECT id FROM items ORDER BY v <-> ARRAY[sin(:a), cos(:a), sin(:a * 0.7), cos(:a * 1.3),
        sin(:a * 0.37), cos(:a * 0.11), sin(:a * 2.1), cos(:a * 0.53)]::real[] LIMIT 10) i)
  = (SELECT array_agg(id ORDER BY id) FROM
     (SELECT id FROM items ORDER BY gpu_ivfpq_l2_distance(v, ARRAY[sin(:a), cos(:a), sin(:a * 0.7),
        cos(:a * 1.3), sin(:a * 0.37), cos(:a * 0.11), sin(:a * 2.1), cos(:a * 0.53)]::real[]) LIMIT 10) s)
  THEN 1 ELSE 1 / floor(random() * 0)::int END;
};
close($fh);

my ($out, $err) = ('', '');
my $clients = 8;
like(
	$node->safe_psql('postgres', q{EXPLAIN SELECT id FROM items ORDER BY v <-> '{1,2,3,4,5,6,7,8}' LIMIT 10}),
	qr/Index Scan using items_v/, 'the queries use the index');
# The load runs in rounds of 10 s (seeds 1, 2, ...) until the faults are done
# and $stop exists, so that it outlasts them however slow the machine (a
# fixed -T could end before the last fault's "serves queries again", which
# needs the load's queries); a round that fails ends it with its status.
my $stop = $node->basedir . '/load.stop';
my $pgbench = IPC::Run::start(
	[
		'bash', '-c', 'i=0; while [ ! -e "$0" ]; do i=$((i + 1)); pgbench --random-seed "$i" "$@" || exit; done',
		$stop, '-n', '-c', $clients, '-j', 4, '-T', 10,
		'-f', $script, '-h', $node->host, '-p', $node->port, 'postgres'
	],
	'>', \$out, '2>', \$err);

# Waits until the GPU process has died $n times and a new one serves again.
sub wait_restart
{
	my ($n, $old) = @_;
	return $node->poll_query_until('postgres',
		"SELECT gpu_restarts = $n AND gpu_process_pid IS NOT NULL AND gpu_process_pid <> $old "
		  . "AND state LIKE 'running (GPU%' FROM gpu_ivfpq_status");
}

# Waits until the GPU serves queries again (the mirror reloaded on demand).
sub wait_gpu_queries
{
	my $before = status('queries_gpu');
	return $node->poll_query_until('postgres', "SELECT queries_gpu > $before + 50 FROM gpu_ivfpq_status");
}

ok(wait_gpu_queries(), 'the GPU serves the pgbench queries')
  or BAIL_OUT("pgbench: $err");

my @faults = (
	[ 'KILL', qr/^was killed by signal 9/, 'SIGKILL' ],
	[ 'SEGV', qr/^was killed by signal 11/, 'SIGSEGV' ],
	[ 'STOP', qr/^did not answer within 3 s and was killed/, 'a hang (SIGSTOP)' ]);
my $n = 0;
foreach my $f (@faults)
{
	my ($signal, $cause, $what) = @$f;
	my $pid = status('gpu_process_pid');
	kill $signal, $pid;
	$n++;
	ok(wait_restart($n, $pid), "after $what a new GPU process serves");
	like(status('last_gpu_exit'), $cause, "the status view names the cause of $what");
	ok(wait_gpu_queries(), "the GPU serves queries again after $what");
}

open(my $stop_fh, '>', $stop) or die "$stop: $!";
close($stop_fh);
$pgbench->finish;
my $rc = $? >> 8;
is($rc, 0, 'pgbench exited cleanly') or diag("pgbench stderr:\n$err");
# Every round reports, and none failed a transaction.
my @failed = $out =~ /number of failed transactions: (\d+) \(/g;
my @rounds = $out =~ /number of transactions actually processed: (\d+)/g;
ok(@failed && @failed == @rounds && !grep({ $_ != 0 } @failed), 'zero failed transactions')
  or diag("pgbench output:\n$out");
my $processed = 0;
$processed += $_ for @rounds;
ok(@rounds && $processed > 0, "pgbench processed transactions ($processed in " . scalar(@rounds) . ' rounds)');
is($err =~ /division by zero/ ? 'wrong answers' : 'exact answers', 'exact answers',
	'every transaction got the exact answer');

is(status('service_starts'), '1', 'the service itself never restarted');
is(status('gpu_restarts'), '3', 'three GPU process restarts counted');

my $log = slurp_file($node->logfile);
unlike($log, qr/crash of another server process/, 'no session was lost to a crash');
unlike($log, qr/terminating any other active server processes|reinitializing/,
	'the postmaster never reinitialised the cluster');
like($log, qr/gpu_ivfpq service: the GPU process was killed by signal 9/, 'the death is logged');

# A reload (SIGHUP to every process group of the postmaster's children)
# must not touch the GPU process: it runs in a session of its own.
my $pid = status('gpu_process_pid');
$node->reload;
sleep 1;
is(status('gpu_process_pid'), $pid, 'a configuration reload leaves the GPU process running');

# Stopping the server ends the GPU process with the service.
$node->stop;
ok(!kill(0, $pid), 'the GPU process ended with the server');

done_testing();
