# The direct path between backends and the GPU process (the query segment):
# rows committed by one session are found by another's next scan and a
# session's own uncommitted inserts by its own scans, with the GPU serving;
# a cancel while a search waits for a stopped GPU process ends that search
# alone and the backend's next scans are served again once the process
# goes on; gpu_metric scans take the same path; and a GPU process that
# writes malformed answers into the segment crashes no backend: every scan
# (gpu_ivfpq and gpu_metric) falls back to the CPU engine with the exact
# rows (device = gpu: an error that says why). On machines without a
# GPU the service's CPU emulation is the GPU process (GPU_IVFPQ_EXPECT_GPU=1
# uses the GPU).
use strict;
use warnings;

use IPC::Run;
use GpuNode;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);

my $node = GpuNode::start('direct', "gpu_ivfpq.gpu_timeout = 60\n");

$node->safe_psql(
	'postgres', q{
	CREATE TABLE items (id int, v real[]);
	INSERT INTO items
	SELECT g, ARRAY[sin(g), cos(g), sin(g * 0.7), cos(g * 1.3)]::real[]
	FROM generate_series(1, 3000) g;
	CREATE INDEX items_idx ON items USING gpu_ivfpq (v) WITH (lists = 8, m = 2);
	SELECT gpu_ivfpq_prewarm('items_idx');
});

# A word table under a gpu_metric index: its scans take the direct path too.
$node->safe_psql(
	'postgres', q{
	CREATE TABLE words (id int, w text);
	INSERT INTO words SELECT g, substr(md5(g::text), 1, 3 + g % 5) FROM generate_series(1, 2000) g;
	CREATE INDEX words_idx ON words USING gpu_metric (w) WITH (method = lc, bucket = 16);
	SELECT gpu_metric_prewarm('words_idx');
});
my $wset = q{SET enable_seqscan = off; SET enable_bitmapscan = off;};
sub wrange
{
	my ($q) = @_;
	return qq{SELECT string_agg(id::text, ',' ORDER BY id) FROM words WHERE w <% edit_range('$q', 2)};
}
sub wexact
{
	my ($q) = @_;
	return $node->safe_psql('postgres',
		qq{SELECT string_agg(id::text, ',' ORDER BY id) FROM words WHERE (w <~> '$q') <= 2});
}
my $queued = $node->safe_psql('postgres', 'SELECT queued_searches FROM gpu_ivfpq_status');
for my $wq ('1a2b', 'c4ca', 'e4da3')
{
	is($node->safe_psql('postgres', "SET gpu_ivfpq.device = gpu; $wset " . wrange($wq)),
		wexact($wq), "gpu_metric range scan '$wq' on the GPU: the exact rows");
}
cmp_ok($node->safe_psql('postgres', 'SELECT queued_searches FROM gpu_ivfpq_status'),
	'>=', $queued + 3, 'gpu_metric scans went through the query segment');

# Every list probed: the GPU's answer is the exact one.
my $set = q{SET enable_seqscan = off; SET gpu_ivfpq.probes = 8; SET gpu_ivfpq.rerank = 200;};
sub knn
{
	my ($q) = @_;
	return qq{SELECT string_agg(id::text, ',') FROM
		(SELECT id FROM items ORDER BY v <-> '$q' LIMIT 5) s};
}
sub exact
{
	my ($q) = @_;
	return $node->safe_psql('postgres',
		'SET enable_indexscan = off; SET enable_bitmapscan = off; ' . knn($q));
}

# ---- coherence: other sessions' commits, a session's own inserts ----
my $far = '{9, 9, 9, 9}';
my $before = $node->safe_psql('postgres', 'SELECT queries_gpu FROM gpu_ivfpq_status');
$node->safe_psql('postgres', q{INSERT INTO items VALUES (90001, '{9, 9, 9, 8.9}')});
is($node->safe_psql('postgres', "SET gpu_ivfpq.device = gpu; $set " . knn($far)),
	exact($far), "another session's committed row is found at once, on the GPU");
like(
	$node->safe_psql(
		'postgres', qq{BEGIN; INSERT INTO items VALUES (90002, '{9, 9, 9, 9}');
		SET gpu_ivfpq.device = gpu; $set } . knn($far) . q{; ROLLBACK;}),
	qr/^90002,90001/, "a session's own uncommitted insert is found by its own scan");
cmp_ok($node->safe_psql('postgres', 'SELECT queries_gpu FROM gpu_ivfpq_status'),
	'>', $before, 'the GPU served those scans');
my ($waited) = $node->safe_psql('postgres',
	'SELECT queued_searches > 0 AND mean_queue_wait_us >= mean_log_wait_us FROM gpu_ivfpq_status');
is($waited, 't', 'the status view shows the direct path stages');

# ---- a cancel while the GPU process is stopped ----
my $gpid = $node->safe_psql('postgres', 'SELECT gpu_process_pid FROM gpu_ivfpq_status');
ok(kill('STOP', $gpid), 'GPU process stopped');
my ($ret, $stdout, $stderr) = $node->psql('postgres',
	"SET gpu_ivfpq.device = gpu; SET statement_timeout = '300ms'; $set " . knn('{0.1, 0.2, 0.3, 0.4}'));
like($stderr, qr/canceling statement due to statement timeout/, 'the waiting scan is cancelled by its timeout');
ok(kill('CONT', $gpid), 'GPU process continued');
my $q = '{0.3, 0.2, 0.1, 0.9}';
# Its slot is free again once the process finished the abandoned search.
my $served = 0;
for (1 .. 300)
{
	($ret) = $node->psql('postgres', "SET gpu_ivfpq.device = gpu; $set " . knn($q));
	if ($ret == 0) { $served = 1; last; }
	usleep(100_000);
}
ok($served, 'scans are served again after the process went on');
is($node->safe_psql('postgres', "SET gpu_ivfpq.device = gpu; $set " . knn($q)),
	exact($q), 'with the exact rows');

# ---- commits wait for the change log where their index has a mirror ----
# A commit waits for the change log only where an index it appended to has
# a mirror: with the service stopped, an insert into an index nobody
# mirrored commits at once; one into a mirrored index waits until the
# service goes on, and its row is then in the mirror.
$node->safe_psql(
	'postgres', q{
	CREATE TABLE nomirror (id int, v real[]);
	INSERT INTO nomirror SELECT i, ARRAY[i % 7, i % 5, 1, 2]::real[] FROM generate_series(1, 300) i;
	CREATE INDEX nomirror_idx ON nomirror USING gpu_ivfpq (v) WITH (lists = 2, m = 2);
	SELECT gpu_ivfpq_prewarm('items_idx');
});
my $stopped = $node->safe_psql('postgres', 'SELECT service_pid FROM gpu_ivfpq_status');
ok(kill('STOP', $stopped), 'service stopped');
my $t0 = time();
my ($irc, $iout, $ierr) = $node->psql('postgres', q{INSERT INTO nomirror VALUES (1000, '{9, 9, 9, 9}')},
	timeout => 60);
is($irc, 0, 'an insert into an index without a mirror commits while the service is stopped');
cmp_ok(time() - $t0, '<', 30, 'without waiting for the service');
my ($wout, $werr) = ('', '');
my $writer = IPC::Run::start(
	[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-c',
		q{INSERT INTO items VALUES (777777, '{0.11, 0.22, 0.33, 0.44}')} ],
	'>', \$wout, '2>', \$werr);
ok( $node->poll_query_until(
		'postgres',
		q{SELECT count(*) = 1 FROM pg_stat_activity WHERE query LIKE 'INSERT INTO items VALUES (777777%' AND wait_event_type = 'Extension'}),
	'an insert into a mirrored index waits at commit for the stopped service');
ok(kill('CONT', $stopped), 'service continued');
$writer->finish;
is($werr, '', 'the insert into the mirrored index committed once the service went on');
is( $node->safe_psql(
		'postgres',
		q{SET enable_seqscan = off; SET gpu_ivfpq.device = gpu; SET gpu_ivfpq.probes = 8;
		  SELECT id FROM items ORDER BY v <-> '{0.11, 0.22, 0.33, 0.44}' LIMIT 1}),
	'777777', 'another session finds the committed row through the mirror');

# ---- a GPU process that writes garbage into the segment ----
$node->stop;
$ENV{GPU_IVFPQ_TEST_GARBAGE_ANSWERS} = '1';
$node->start;
delete $ENV{GPU_IVFPQ_TEST_GARBAGE_ANSWERS};
ok($node->poll_query_until('postgres', q{SELECT state LIKE 'running (GPU%' FROM gpu_ivfpq_status}),
	'the service is back');
$node->safe_psql('postgres', q{SELECT gpu_ivfpq_prewarm('items_idx')});
my $fallbacks = $node->safe_psql('postgres', 'SELECT gpu_fallbacks FROM gpu_ivfpq_status');
for my $i (1 .. 5)
{
	my $qi = "{0.$i, 0.5, 0.2, 0.7}";
	($ret, $stdout, $stderr) = $node->psql('postgres', $set . knn($qi));
	is($ret, 0, "scan $i survives a malformed answer");
	is($stdout, exact($qi), "scan $i returns the exact rows (the CPU engine)");
	like($stderr, qr/WARNING:.*ran on the CPU|malformed/, "scan $i warns");
}
($ret, $stdout, $stderr) = $node->psql('postgres', "SET gpu_ivfpq.device = gpu; $set " . knn($q));
like($stderr, qr/malformed search result/, 'device = gpu: an error that says the answer was malformed');
$node->safe_psql('postgres', q{SELECT gpu_metric_prewarm('words_idx')});
for my $i (1 .. 5)
{
	my $wq = substr("c4ca4238a0b9", $i, 4);
	($ret, $stdout, $stderr) = $node->psql('postgres', $wset . wrange($wq));
	is($ret, 0, "gpu_metric scan $i survives a malformed answer");
	is($stdout, wexact($wq), "gpu_metric scan $i returns the exact rows (the CPU engine)");
	like($stderr, qr/WARNING:.*ran on the CPU|malformed|outside the answer/, "gpu_metric scan $i warns");
}
cmp_ok($node->safe_psql('postgres', 'SELECT gpu_fallbacks FROM gpu_ivfpq_status'),
	'>=', $fallbacks + 5, 'each counted as a fallback');
is($node->safe_psql('postgres', 'SELECT service_starts, gpu_restarts FROM gpu_ivfpq_status'),
	'1|0', 'no process died or restarted');
ok(slurp_file($node->logfile) !~ /server process .* was terminated by signal/, 'no backend crashed');


# A restarted service makes a new segment; the direct path's counters go on
# from where they were (they never go back while the server runs).
my ($gpu_served, $nbatches, $spid) =
  split /\|/, $node->safe_psql('postgres', 'SELECT queries_gpu, batches, service_pid FROM gpu_ivfpq_status');
cmp_ok($gpu_served, '>', 0, 'the GPU served searches before the restart');
kill 'TERM', $spid;
ok( $node->poll_query_until(
		'postgres',
		"SELECT service_pid <> $spid AND state LIKE 'running (GPU%' FROM gpu_ivfpq_status"),
	'the service restarted');
my ($served2, $nbatches2) = split /\|/, $node->safe_psql('postgres', 'SELECT queries_gpu, batches FROM gpu_ivfpq_status');
cmp_ok($served2, '>=', $gpu_served, 'searches served: the count did not go back');
cmp_ok($nbatches2, '>=', $nbatches, 'batches: the count did not go back');

# The segment has a name of this cluster's own (its data directory's device
# and inode, and a random part), recorded in pg_dynshmem: an immediate stop
# leaves the segment, the next start removes it; a recorded name without
# this cluster's prefix (a data directory copied from another cluster) is
# never removed.
my $record = $node->data_dir . '/pg_dynshmem/gpu_ivfpq.queue';
my $recorded = slurp_file($record);
chomp $recorded;
like($recorded, qr{^/gpu_ivfpq\.[0-9a-f]+\.[0-9a-f]+\.[0-9a-f]{16}$}, 'the segment name is recorded, with a random part');
ok(-e "/dev/shm$recorded", 'the recorded segment exists');
$node->stop('immediate');
ok(-e "/dev/shm$recorded", 'an immediate stop leaves the segment');
$node->start;
ok($node->poll_query_until('postgres', q{SELECT state LIKE 'running (GPU%' FROM gpu_ivfpq_status}),
	'the service serves again');
ok(!-e "/dev/shm$recorded", 'the next start removed the segment left behind');
my $renamed = slurp_file($record);
chomp $renamed;
isnt($renamed, $recorded, 'the new segment has a new name');
my $foreign = '/gpu_ivfpq.0.0.00000000deadbeef';
open(my $fh, '>', "/dev/shm$foreign") or die "could not create /dev/shm$foreign: $!";
close($fh);
$node->stop('immediate');
unlink("/dev/shm$renamed");
open($fh, '>', $record) or die "could not write $record: $!";
print $fh "$foreign\n";
close($fh);
$node->start;
ok($node->poll_query_until('postgres', q{SELECT state LIKE 'running (GPU%' FROM gpu_ivfpq_status}),
	'the service serves after a foreign name was recorded');
ok(-e "/dev/shm$foreign", 'a recorded name of another cluster is not removed');
unlink("/dev/shm$foreign");

$node->stop;
done_testing();
