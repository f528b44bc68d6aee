# A gpu_metric CREATE INDEX stops for statement_timeout, pg_cancel_backend
# and a fast shutdown while the engine builds: its threads poll the
# backend's interrupts, so the build ends before the engine is done (which
# it says in a DEBUG1 message) rather than after it. The build here, a List
# of Clusters with bucket = 1 over 60000 words, computes about 900 million
# distances: far longer than any of the waits below on any machine.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('metric_limits');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
max_parallel_maintenance_workers = 1
maintenance_work_mem = '256MB'
autovacuum = off
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gpu_ivfpq');
$node->safe_psql(
	'postgres', q{
	CREATE TABLE words AS
	SELECT substr(md5(i::text), 1, 6 + i % 7) AS word FROM generate_series(1, 60000) i;
	ANALYZE words;
});

my $build = q{CREATE INDEX words_lc ON words USING gpu_metric (word) WITH (bucket = 1)};
# What the backend logs once the engine has built the index.
my $built = qr/gpu_metric build: List of Clusters index of \d+ words built/;

# 1. statement_timeout.
my ($rc, $out, $err) =
  $node->psql('postgres', "SET client_min_messages = debug1; SET statement_timeout = '1s'; $build");
isnt($rc, 0, 'the build under statement_timeout = 1s fails');
like($err, qr/canceling statement due to statement timeout/, 'statement_timeout cancels the build');
unlike($err, $built, 'statement_timeout: the engine stopped before the end of its build');

# Starts the build in another session, named metric_build, and waits until
# the engine builds; returns the psql handle and its standard error.
sub start_build
{
	my $stderr = '';
	my $h = IPC::Run::start(
		[
			'psql', '-X', '-d', $node->connstr('postgres') . ' application_name=metric_build',
			'-c', "SET client_min_messages = debug1; $build"
		],
		'<', \undef, '>', \my $stdout, '2>', \$stderr,
		IPC::Run::timeout(900));
	$node->poll_query_until(
		'postgres', q{SELECT count(*) > 0 FROM pg_stat_progress_create_index p
		JOIN pg_stat_activity a USING (pid)
		WHERE a.application_name = 'metric_build' AND p.phase LIKE '%building the metric index%'})
	  or die 'the build did not reach the engine';
	return ($h, \$stderr);
}

# 2. pg_cancel_backend.
my ($h, $stderr) = start_build();
$node->safe_psql('postgres',
	q{SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE application_name = 'metric_build'});
$h->finish;
like($$stderr, qr/canceling statement due to user request/, 'pg_cancel_backend cancels the build');
unlike($$stderr, $built, 'pg_cancel_backend: the engine stopped before the end of its build');

# 3. A fast shutdown: the build's backend exits at once, and so the server.
($h, $stderr) = start_build();
$node->stop('fast');
$h->finish;
like(
	$$stderr,
	qr/terminating connection due to administrator command/,
	'a fast shutdown ends the build');
unlike($$stderr, $built, 'fast shutdown: the engine stopped before the end of its build');

# After all that, builds and searches work as before.
$node->start;
$node->safe_psql('postgres',
	q{CREATE INDEX words_six ON words USING gpu_metric (word) WHERE length(word) = 6});
is( $node->safe_psql(
		'postgres', q{SET enable_seqscan = off;
		SELECT count(*) FROM words WHERE length(word) = 6 AND word <% edit_range('abcdef', 3)}),
	$node->safe_psql(
		'postgres', q{SELECT count(*) FROM words WHERE length(word) = 6 AND word <~> 'abcdef' <= 3}),
	'after the cancelled builds an index answers as a sequential scan');

$node->stop;
done_testing();
