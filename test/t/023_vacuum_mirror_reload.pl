# A VACUUM that removes more entries than the mirror takes in place
# invalidates the mirror and stops reporting removals; scans running beside
# it load the mirror again from pages it has not reached yet. Such a mirror
# must not outlive the pass: once VACUUM is done (and the heap may reuse the
# removed rows' TIDs), the mirror holds exactly the live rows and the GPU
# path returns the CPU engine's answers.
#
# The VACUUM is slowed by cost-based delay (as autovacuum is by default) so
# that scans reload the mirror while its pass is still going.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $gpu = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 1 : 0;
my $node = PostgreSQL::Test::Cluster->new('vacuum_mirror');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{shared_preload_libraries = 'gpu_ivfpq'
gpu_ivfpq.service_emulate_gpu = } . ($gpu ? 'off' : 'on') . qq{
gpu_ivfpq.devices = '0'
autovacuum = off
});
$node->start;

# One list, so the chain is in TID order: the first 66000 rows go, then
# 4000 stay, then 10000 more go. The mirror is invalidated after 65536
# removals, near the end of the first part.
$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION gpu_ivfpq;
	SELECT setseed(0.25);
	CREATE TABLE mv (id int, v real[]) WITH (autovacuum_enabled = off);
	INSERT INTO mv SELECT i, CASE WHEN i > 70000
		THEN ARRAY[random(), random(), random(), random()]::real[]
		ELSE ARRAY[5 + random(), 5 + random(), 5 + random(), 5 + random()]::real[] END
	FROM generate_series(1, 80000) i;
	CREATE INDEX mvi ON mv USING gpu_ivfpq (v) WITH (lists = 1, m = 2);
	CREATE TABLE stop_flag (x int);
});
ok($node->poll_query_until('postgres', q{SELECT state LIKE 'running (GPU%' FROM gpu_ivfpq_status}),
	'the service serves');
is($node->safe_psql('postgres', q{SELECT gpu_ivfpq_prewarm('mvi')}), '80000', 'mirror loaded');

# Delete, and let a first VACUUM prune the heap (leaving the index alone),
# so that the timed VACUUM spends its time on the index.
$node->safe_psql(
	'postgres', q{
	DELETE FROM mv WHERE id <= 66000 OR id > 70000;
	VACUUM (INDEX_CLEANUP OFF) mv;
});

# Scans in a loop, each asking for the mirror (loading it again once gone).
my ($out, $err) = ('', '');
my $scans = IPC::Run::start(
	[
		'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-c',
		q{SET enable_seqscan = off;
		  DO $$ BEGIN
		    WHILE NOT EXISTS (SELECT 1 FROM stop_flag) LOOP
		      PERFORM id FROM mv ORDER BY v <-> '{5,5,5,5}' LIMIT 1;
		      PERFORM pg_sleep(0.02);
		    END LOOP;
		  END $$;}
	],
	'>', \$out, '2>', \$err);

$node->safe_psql(
	'postgres', q{
	SET vacuum_cost_limit = 20;
	SET vacuum_cost_delay = '13ms';
	VACUUM mv;
	INSERT INTO stop_flag VALUES (1);
});
$scans->finish;
is($err, '', 'the scans beside VACUUM ran without errors');

# A scan now uses (or loads) the mirror; it must hold the live rows only.
# A scan that finds a load still under way (or the service still dropping
# the mirror) answers on the CPU and loads nothing, so each poll scans again.
$node->safe_psql(
	'postgres', q{
	CREATE FUNCTION scan_then_mirrored() RETURNS bool LANGUAGE plpgsql
	SET enable_seqscan = off AS $$
	BEGIN
		PERFORM id FROM mv ORDER BY v <-> '{0,0,0,0}' LIMIT 1;
		RETURN EXISTS (SELECT 1 FROM gpu_ivfpq_mirrors WHERE index = 'mvi');
	END $$;
});
ok($node->poll_query_until('postgres', q{SELECT scan_then_mirrored()}),
	'the mirror is loaded again');
is($node->safe_psql('postgres', q{SELECT entries FROM gpu_ivfpq_mirrors WHERE index = 'mvi'}),
	'4000', 'the mirror holds the 4000 live rows, no entry VACUUM removed');

# New rows take the freed TIDs; the GPU path answers as the CPU engine.
$node->safe_psql('postgres',
	q{INSERT INTO mv SELECT 100000 + i, ARRAY[50 + random(), 50 + random(), 50 + random(), 50 + random()]::real[]
	  FROM generate_series(1, 20000) i});
my $q = q{SET enable_seqscan = off;
	SELECT string_agg(id::text, ',' ORDER BY v <-> '{0,0,0,0}', ctid)
	FROM (SELECT id, v, ctid FROM mv ORDER BY v <-> '{0,0,0,0}' LIMIT 10) s};
my $cpu = $node->safe_psql('postgres', "SET gpu_ivfpq.device = cpu; $q");
my $gpu_answer = $node->safe_psql('postgres', "SET gpu_ivfpq.device = gpu; $q");
is($gpu_answer, $cpu, 'the GPU path returns the CPU engine\'s rows after TIDs were reused');

$node->stop;
done_testing();
