# Requests their backends gave up. A backend cancelled while the service
# serves its request leaves the request to the service, which frees the
# request slot once it has answered it. When that backend then disconnects,
# the slot must stay with the service: given to another backend at once, the
# old request's answer would be taken as the answer to the new one (a build
# would then write the quantizers of a training run that never happened).
# Here a batch search the service serves (the GPU process stopped under
# it) is cancelled and its session ends; a new session then builds an
# index through the service, and the index answers like a sequential scan. A backend terminated while its request waits,
# not yet taken, withdraws it: the slot is not lost (more terminations than
# slots, then every session is still served). A scan cancelled while the
# GPU process holds it is not told to load the index's mirror (it would
# not, and every other scan would use the CPU until the claim lapsed): the
# next scan loads it; nor is one of a backend terminated while it loads. On
# machines without a GPU the service's CPU emulation is the GPU process.
use strict;
use warnings;

use IPC::Run;
use GpuNode;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = GpuNode::start('abandoned', q{autovacuum = off
# Few request slots (one per possible backend), so that a lost one shows.
max_connections = 6
max_worker_processes = 2
max_parallel_workers = 0
max_wal_senders = 0
autovacuum_max_workers = 1
gpu_ivfpq.gpu_timeout = 120
});
$node->safe_psql(
	'postgres', q{
	CREATE TABLE e (id int, v real[]);
	INSERT INTO e SELECT i, ARRAY[i % 7, i % 3]::real[] FROM generate_series(1, 500) i;
	CREATE INDEX ei ON e USING gpu_ivfpq (v) WITH (lists = 4, m = 2);
	SELECT gpu_ivfpq_prewarm('ei');
	CREATE TABLE d (id int, v real[]);
	INSERT INTO d SELECT i, ARRAY[(i * 0.618034) % 1]::real[] FROM generate_series(1, 5000) i;
});

# The GPU process is stopped, so that the service waits on a batch search
# it took: the search is cancelled by statement_timeout, then its session
# ends (the slot it leaves is the service's until the service answers).
my $gpid0 = $node->safe_psql('postgres', 'SELECT gpu_process_pid FROM gpu_ivfpq_status');
ok(kill('STOP', $gpid0), 'GPU process stopped');
my $a = $node->background_psql('postgres', on_error_stop => 0);
my $apid = $a->query_safe('SELECT pg_backend_pid()');
$a->query(q{SET statement_timeout = '1s';
	SELECT count(*) FROM gpu_ivfpq_knn_batch('ei', ARRAY[[1, 1], [2, 2]]::real[], 3)});
like($a->{stderr}, qr/canceling statement due to statement timeout/, 'the waiting batch search is cancelled');
$a->quit;
ok($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $apid"),
	'its session ended');

# A new session's build sends its training request meanwhile; the GPU
# process goes on. The build gets an answer of its own (after the service
# answered the abandoned search), and its index is sound.
my ($bout, $berr) = ('', '');
my $builder = IPC::Run::start(
	[ 'psql', '-X', '-q', '-d', $node->connstr('postgres'), '-c',
		'/* builder */ CREATE INDEX di ON d USING gpu_ivfpq (v) WITH (lists = 100)' ],
	'>', \$bout, '2>', \$berr);
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE '/* builder */%' AND wait_event_type = 'Extension'}),
	'the build waits for its training request');
ok(kill('CONT', $gpid0), 'GPU process continued');
$builder->finish;
is($berr, '', 'the build finished');
my $nearest = q{SELECT string_agg(id::text, ',') FROM (SELECT id FROM d ORDER BY v <-> '{0.5}' LIMIT 5) s};
my $by_index = $node->safe_psql('postgres',
	"SET gpu_ivfpq.device = cpu; SET gpu_ivfpq.probes = 4; SET enable_seqscan = off; $nearest");
my $by_seqscan = $node->safe_psql('postgres', "SET enable_indexscan = off; SET enable_bitmapscan = off; $nearest");
is($by_index, $by_seqscan, 'the index built after the abandoned request answers like a sequential scan');

# ---- requests withdrawn before the service took them ----
# The GPU process is stopped while it serves one batch search: the service
# waits on it, and the batch searches of other sessions wait, not taken.
# Each of those sessions is terminated; there are more of them than slots.
$node->safe_psql('postgres', q{SELECT gpu_ivfpq_prewarm('di')});
my $batch = q{SELECT count(*) FROM gpu_ivfpq_knn_batch('di', ARRAY[[0.1], [0.2], [0.3]]::real[], 3)};
my $gpid = $node->safe_psql('postgres', 'SELECT gpu_process_pid FROM gpu_ivfpq_status');
ok(kill('STOP', $gpid), 'GPU process stopped');
my ($hout, $herr) = ('', '');
my $holder = IPC::Run::start([ 'psql', '-X', '-At', '-d', $node->connstr('postgres'), '-c', $batch ],
	'>', \$hout, '2>', \$herr);
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE 'SELECT count(*) FROM gpu_ivfpq_knn_batch%' AND wait_event_type = 'Extension'}),
	'a batch search waits on the stopped GPU process');
my $withdrawn = 0;
for my $round (1 .. 12)
{
	my ($o, $e) = ('', '');
	my $h = IPC::Run::start(
		[ 'psql', '-X', '-At', '-d', $node->connstr('postgres'), '-c', "/* round $round */ $batch" ],
		'>', \$o, '2>', \$e);
	my $waits = $node->poll_query_until('postgres',
		qq{SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE '/* round $round */%' AND wait_event_type = 'Extension'});
	$node->safe_psql('postgres',
		qq{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '/* round $round */%'});
	$h->finish;
	$withdrawn++ if $waits;
}
is($withdrawn, 12, 'twelve waiting batch searches were terminated (more than the slots)');
ok(kill('CONT', $gpid), 'GPU process continued');
$holder->finish;
chomp $hout;
is($hout, '9', 'the batch search the GPU process held is answered');
for my $i (1 .. 3)
{
	is($node->safe_psql('postgres', "SET gpu_ivfpq.device = gpu; $batch"),
		'9', "session $i: a batch search is still served by the GPU (no slot was lost)");
}

# ---- a scan held by the GPU process and cancelled does not claim the load ----
# Its own insert makes the GPU process hold the scan until the change log
# is applied, and the service, stopped, applies nothing: the scan is
# cancelled while it waits. Once the service goes on, the GPU process finds
# no mirror for it; the next scan of another session is the one to load it.
$node->safe_psql(
	'postgres', q{
	CREATE TABLE held (id int, v real[]);
	INSERT INTO held SELECT i, ARRAY[i % 11, i % 7]::real[] FROM generate_series(1, 500) i;
	CREATE INDEX held_idx ON held USING gpu_ivfpq (v) WITH (lists = 4, m = 2);
});
my $spid = $node->safe_psql('postgres', 'SELECT service_pid FROM gpu_ivfpq_status');
ok(kill('STOP', $spid), 'service stopped');
my ($rc, $out, $err) = $node->psql('postgres',
	q{BEGIN; INSERT INTO held VALUES (0, '{1, 1}'); SET LOCAL statement_timeout = '1s';
	  SET LOCAL enable_seqscan = off; SELECT id FROM held ORDER BY v <-> '{1, 1}' LIMIT 1; ROLLBACK;});
like($err, qr/canceling statement due to statement timeout/, 'the held scan is cancelled');
ok(kill('CONT', $spid), 'service continued');
# Scans of $index (device = auto: a scan told that another loads the mirror
# uses the CPU, and loads nothing) until one has loaded its mirror; true
# within seconds, not once a claim of the one that gave up lapsed (a minute).
sub scans_load
{
	my ($table, $index) = @_;
	for (1 .. 30)
	{
		$node->safe_psql('postgres',
			"SET enable_seqscan = off; SELECT id FROM $table ORDER BY v <-> '{1, 1}' LIMIT 1");
		return 1
		  if $node->safe_psql('postgres',
			"SELECT count(*) > 0 FROM gpu_ivfpq_mirrors WHERE indexrelid = '$index'::regclass") eq 't';
		usleep(500_000);
	}
	return 0;
}
ok(scans_load('held', 'held_idx'), 'another session\'s scan loads the mirror at once');

# ---- a backend terminated while it loads gives the load up ----
# With the service stopped, a scan told to load the mirror waits for its
# load request; it is terminated (FATAL: no error path runs). Once the
# service goes on, another session's scan loads the mirror within seconds.
$node->safe_psql(
	'postgres', q{
	CREATE TABLE held2 (id int, v real[]);
	INSERT INTO held2 SELECT i, ARRAY[i % 13, i % 5]::real[] FROM generate_series(1, 500) i;
	CREATE INDEX held2_idx ON held2 USING gpu_ivfpq (v) WITH (lists = 4, m = 2);
});
# A commit into a mirrored index returns once the service applied the change
# log this far: the scan below is then not held for it, it is told to load.
$node->safe_psql('postgres', q{INSERT INTO held VALUES (9999, '{50, 50}')});
ok(kill('STOP', $spid), 'service stopped again');
my ($lo, $le) = ('', '');
my $loader = IPC::Run::start(
	[ 'psql', '-X', '-At', '-d', $node->connstr('postgres'), '-c',
		q{/* loader */ SET enable_seqscan = off; SELECT id FROM held2 ORDER BY v <-> '{1, 1}' LIMIT 1} ],
	'>', \$lo, '2>', \$le);
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE '/* loader */%' AND wait_event_type = 'Extension'}),
	'the scan waits for its load request');
$node->safe_psql('postgres', q{SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE '/* loader */%'});
$loader->finish;
ok(kill('CONT', $spid), 'service continued again');
ok(scans_load('held2', 'held2_idx'), 'after the loader was terminated, another session\'s scan loads the mirror at once');

$node->stop;
done_testing();
