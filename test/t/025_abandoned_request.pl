# A backend cancelled while the service serves its request leaves the
# request to the service, which frees the request slot once it has answered
# it. When that backend then disconnects, the slot must stay with the
# service: given to another backend at once, the old request's answer would
# be taken as the answer to the new one (a build would then write the
# quantizers of a training run that never happened). Here a slow gpu_metric
# request is cancelled and its session ends; a new session then builds an
# index through the service, and the index answers like a sequential scan.
# On machines without a GPU the service's CPU emulation is the GPU process.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $gpu = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 1 : 0;
my $node = PostgreSQL::Test::Cluster->new('abandoned');
$node->init;
$node->append_conf('postgresql.conf', qq{shared_preload_libraries = 'gpu_ivfpq'
gpu_ivfpq.service_emulate_gpu = } . ($gpu ? 'off' : 'on') . qq{
autovacuum = off
});
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION gpu_ivfpq');
ok($node->poll_query_until('postgres', q{SELECT state LIKE 'running (GPU%' FROM gpu_ivfpq_status}),
	'the GPU serves') or BAIL_OUT('no GPU service');
$node->safe_psql(
	'postgres', q{
	CREATE TABLE lw (id int, word text);
	INSERT INTO lw SELECT i, (SELECT string_agg(substr(md5((i * 1000 + j)::text), 1, 8), '')
	                           FROM generate_series(1, 250) j)
	FROM generate_series(1, 3000) i;
	CREATE INDEX lwi ON lw USING gpu_metric (word);
	SELECT gpu_metric_prewarm('lwi');
	CREATE TABLE d (id int, v real[]);
	INSERT INTO d SELECT i, ARRAY[(i * 0.618034) % 1]::real[] FROM generate_series(1, 5000) i;
});

# A request that keeps the service busy for seconds (every word within the
# radius, long words), cancelled by statement_timeout; then the session ends.
my $slow = q{SELECT count(*) FROM gpu_metric_range_batch('lwi',
	(SELECT array_agg(repeat(md5(i::text), 64)) FROM generate_series(1, 3) i), 5000)};
my $a = $node->background_psql('postgres', on_error_stop => 0);
my $apid = $a->query_safe('SELECT pg_backend_pid()');
$a->query("SET statement_timeout = '1s'; $slow");
like($a->{stderr}, qr/canceling statement due to statement timeout/, 'the slow request is cancelled');
$a->quit;
ok($node->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $apid"),
	'its session ended');

# A new session's build trains through the service meanwhile: it gets an
# answer of its own (it waits for the service), and its index is sound.
$node->safe_psql('postgres', 'CREATE INDEX di ON d USING gpu_ivfpq (v) WITH (lists = 100)');
my $nearest = q{SELECT string_agg(id::text, ',') FROM (SELECT id FROM d ORDER BY v <-> '{0.5}' LIMIT 5) s};
my $by_index = $node->safe_psql('postgres',
	"SET gpu_ivfpq.device = cpu; SET gpu_ivfpq.probes = 4; SET enable_seqscan = off; $nearest");
my $by_seqscan = $node->safe_psql('postgres', "SET enable_indexscan = off; SET enable_bitmapscan = off; $nearest");
is($by_index, $by_seqscan, 'the index built after the abandoned request answers like a sequential scan');

$node->stop;
done_testing();
