# The GPU path of k-NN scans through the service: the same answers as the
# CPU engine for the three operator classes; mirrors coherent under
# concurrent inserts, deletes, VACUUM and queries (every freshly inserted row
# is found at distance 0 through the GPU, no wrong row ever comes back);
# REINDEX, TRUNCATE and DROP replace or free mirrors; the memory budget
# evicts least recently used mirrors and falls back to the CPU with a
# WARNING when an index does not fit; a cancelled wait and a killed service
# leave queries working.
#
# Without a GPU the service runs its CPU emulation of the GPU
# (gpu_ivfpq.service_emulate_gpu), which takes the same request, batching and
# coherence paths; GPU_IVFPQ_EXPECT_GPU=1 (the GPU machine) uses the GPU.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $gpu = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 1 : 0;
my $node = PostgreSQL::Test::Cluster->new('gpu');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{shared_preload_libraries = 'gpu_ivfpq'
gpu_ivfpq.service_emulate_gpu = } . ($gpu ? 'off' : 'on') . qq{
# One GPU: the budget checks below count one copy per mirror (several GPUs:
# 014_multi_gpu.pl).
gpu_ivfpq.devices = '0'
maintenance_work_mem = '128MB'
restart_after_crash = on
});
$node->start;

my $vector = 'ARRAY(SELECT random()::real FROM generate_series(1, 16) WHERE g > 0)';
$node->safe_psql(
	'postgres', qq{
	CREATE EXTENSION gpu_ivfpq;
	SELECT setseed(0.5);
	CREATE TABLE items (id bigserial PRIMARY KEY, v real[]);
	INSERT INTO items (v) SELECT $vector FROM generate_series(1, 20000) g;
	CREATE INDEX items_l2 ON items USING gpu_ivfpq (v) WITH (lists = 64, m = 8);
	CREATE INDEX items_ip ON items USING gpu_ivfpq (v real_ip_ops) WITH (lists = 64, m = 8);
	CREATE INDEX items_cos ON items USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 64, m = 8);
	CREATE TABLE queries AS SELECT g AS q, $vector AS v FROM generate_series(1, 60) g;
	ALTER DATABASE postgres SET enable_seqscan = off;
});
ok($node->poll_query_until('postgres', q{SELECT state LIKE 'running (GPU%' FROM gpu_ivfpq_status}),
	'the service serves from ' . ($gpu ? 'the GPU' : 'its CPU emulation'));

sub status
{
	my ($col) = @_;
	return $node->safe_psql('postgres', "SELECT $col FROM gpu_ivfpq_status");
}

# Top 10 of every query, one line per query.
sub knn_all
{
	my ($device, $op, $extra) = @_;
	$extra //= '';
	return $node->safe_psql(
		'postgres', qq{SET gpu_ivfpq.device = $device; $extra
		SELECT string_agg(ids, E'\\n' ORDER BY q) FROM (
			SELECT q.q, (SELECT string_agg(id::text, ',') FROM
				(SELECT id FROM items ORDER BY v $op q.v LIMIT 10) s) AS ids
			FROM queries q) x;});
}

# 1. GPU and CPU give the same rows. The emulation runs the CPU engine's
# arithmetic, so its answers are identical; a GPU sums in another order, so
# near-ties may swap: require identical top-10 sets for 95% of the queries.
for my $op ('<->', '<#>', '<=>')
{
	my $before = status('queries_gpu');
	my $g = knn_all('gpu', $op);
	my $c = knn_all('cpu', $op);
	my @g = split /\n/, $g;
	my @c = split /\n/, $c;
	my $same = 0;
	for my $i (0 .. $#g)
	{
		my %a = map { $_ => 1 } split /,/, $g[$i];
		$same++ if (grep { $a{$_} } split /,/, $c[$i]) == 10;
	}
	is(scalar(@g), 60, "$op: 60 queries answered on the GPU path");
	if ($gpu) { cmp_ok($same, '>=', 57, "$op: GPU and CPU top-10 sets agree ($same of 60)"); }
	else { is($g, $c, "$op: GPU path and CPU engine return identical rows"); }
	cmp_ok(status('queries_gpu') - $before, '>=', 60, "$op: the GPU served the scans");
}
like($node->safe_psql('postgres', q{SELECT string_agg(index, ',' ORDER BY index) FROM gpu_ivfpq_mirrors}),
	qr/items_cos,items_ip,items_l2/, 'three mirrors listed');

# Re-ranking continues past the first round exactly as on the CPU: a
# selective filter needs several rounds.
my $filtered = q{SELECT string_agg(id::text, ',') FROM
	(SELECT id FROM items WHERE id % 50 = 0 ORDER BY v <-> (SELECT v FROM queries WHERE q = 1) LIMIT 10) s};
my $fg = $node->safe_psql('postgres', "SET gpu_ivfpq.device = gpu; $filtered");
my $fc = $node->safe_psql('postgres', "SET gpu_ivfpq.device = cpu; $filtered");
is(scalar(split /,/, $fg), 10, 'filtered query (2% of rows) returns 10 rows through the GPU');
if (!$gpu) { is($fg, $fc, 'filtered query: same rows as the CPU engine'); }

# 2. Concurrent inserts, deletes, VACUUM and GPU queries. Each insert is
# looked up at once through the index: it must come first at distance 0
# (else the transaction divides by zero and pgbench fails). Deletes take only
# the initial rows: a delete of a just-inserted row between its INSERT and
# its lookup would fail the check without any fault of the index.
my $dir = PostgreSQL::Test::Utils::tempdir;
PostgreSQL::Test::Utils::append_to_file(
	"$dir/insert_find.sql", qq{
INSERT INTO items (v) SELECT $vector FROM generate_series(1, 1) g RETURNING id AS new_id \\gset
SELECT 1 / (CASE WHEN (SELECT id FROM items ORDER BY v <-> (SELECT v FROM items WHERE id = :new_id) LIMIT 1) = :new_id
             AND (SELECT v <-> (SELECT v FROM items WHERE id = :new_id) FROM items ORDER BY v <-> (SELECT v FROM items WHERE id = :new_id) LIMIT 1) = 0
            THEN 1 ELSE 0 END);
});
PostgreSQL::Test::Utils::append_to_file(
	"$dir/delete.sql", qq{
\\set d random(1, 20000)
DELETE FROM items WHERE id = :d;
});
PostgreSQL::Test::Utils::append_to_file("$dir/vacuum.sql", "VACUUM items;\n");
my $before_batches = status('batches');
my $before_gpu = status('queries_gpu');
my ($out, $err) = ('', '');
my $h = IPC::Run::start(
	[
		'pgbench', '-n', '-c', '8', '-j', '4', '-T', '15',
		'-f', "$dir/insert_find.sql\@20",
		'-f', "$dir/delete.sql\@5",
		'-f', "$dir/vacuum.sql\@1",
		'-h', $node->host, '-p', $node->port, 'postgres'
	],
	'<', \undef, '>', \$out, '2>', \$err,
	IPC::Run::timeout(300));
# Meanwhile, a GPU-required session keeps querying; it must never fail.
my $gpu_session_ok = 1;
for my $i (1 .. 20)
{
	my ($rc, $o, $e) = $node->psql('postgres',
		q{SET gpu_ivfpq.device = gpu; SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> (SELECT v FROM queries WHERE q = 2) LIMIT 10) s});
	$gpu_session_ok = 0 if $rc != 0 || $o ne '10';
	diag("GPU session: $e") if $rc != 0;
}
ok($h->finish, 'concurrent inserts, deletes, VACUUM and GPU lookups: no wrong or missing row')
  or diag("$out\n$err");
like($out, qr/number of transactions actually processed: [1-9]/, 'pgbench processed transactions');
note($1) if $out =~ /(number of transactions actually processed: \d+)/;
ok($gpu_session_ok, 'a session with gpu_ivfpq.device = gpu got its answers throughout');
my $q = status('queries_gpu') - $before_gpu;
my $b = status('batches') - $before_batches;
cmp_ok($q, '>', 0, 'the GPU served the concurrent lookups');
note(sprintf('concurrent load: %d GPU searches in %d batches (mean batch %.2f)', $q, $b, $b ? $q / $b : 0));

# After the load, every row is found first by its own vector through the GPU.
is( $node->safe_psql(
		'postgres', q{SET gpu_ivfpq.device = gpu;
		SELECT count(*) FROM (SELECT id, v FROM items ORDER BY id DESC LIMIT 300) r
		WHERE (SELECT i.id FROM items i ORDER BY i.v <-> r.v LIMIT 1) <> r.id}),
	'0', 'the 300 newest rows are each found first by their own vector');

# 3. A new version replaces the mirror: REINDEX and TRUNCATE.
$node->safe_psql('postgres', 'REINDEX INDEX items_l2');
$node->safe_psql('postgres',
	q{SET gpu_ivfpq.device = gpu; SELECT id FROM items ORDER BY v <-> (SELECT v FROM queries WHERE q = 3) LIMIT 1});
is( $node->safe_psql(
		'postgres', q{SELECT count(*) FROM gpu_ivfpq_mirrors m WHERE m.index = 'items_l2'
		AND m.relfilenode = pg_relation_filenode('items_l2')}),
	'1', 'after REINDEX the mirror is the new relfilenode, and only it');
is($node->safe_psql('postgres', q{SELECT count(*) FROM gpu_ivfpq_mirrors WHERE index = 'items_l2'}),
	'1', 'the old version is gone');
$node->safe_psql('postgres', 'CREATE TABLE t2 AS SELECT * FROM items; CREATE INDEX t2_idx ON t2 USING gpu_ivfpq (v) WITH (lists = 16, m = 8)');
$node->safe_psql('postgres', q{SELECT gpu_ivfpq_prewarm('t2_idx'); TRUNCATE t2; INSERT INTO t2 SELECT * FROM items LIMIT 100});
is( $node->safe_psql(
		'postgres', q{SET gpu_ivfpq.device = auto; SELECT count(*) FROM (SELECT id FROM t2 ORDER BY v <-> (SELECT v FROM queries WHERE q = 3) LIMIT 500) s}),
	'100', 'after TRUNCATE the scan sees exactly the new rows');
$node->safe_psql('postgres', 'DROP TABLE t2');
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM gpu_ivfpq_mirrors WHERE index IS NULL AND datname = 'postgres'}),
	'DROP frees the mirror');

# 4. Memory budget: room for about 1.5 mirrors of this size.
my $kb = $node->safe_psql('postgres', q{SELECT ceil(max(size_mb) * 1024 * 1.5)::int FROM gpu_ivfpq_mirrors});
$node->safe_psql('postgres', "ALTER SYSTEM SET gpu_ivfpq.gpu_memory_budget = '${kb}kB'; SELECT pg_reload_conf();");
ok($node->poll_query_until('postgres', q{SELECT mirrors <= 1 FROM gpu_ivfpq_status}),
	'lowering the budget evicts mirrors');
$node->safe_psql('postgres', q{SELECT gpu_ivfpq_prewarm('items_ip')});
$node->safe_psql('postgres', q{SELECT gpu_ivfpq_prewarm('items_cos')});
is($node->safe_psql('postgres', q{SELECT string_agg(index, ',') FROM gpu_ivfpq_mirrors}),
	'items_cos', 'loading another mirror evicted the least recently used one');
$node->safe_psql('postgres', q{CREATE TABLE big AS SELECT * FROM items UNION ALL SELECT id + 100000, v FROM items UNION ALL SELECT id + 200000, v FROM items;
	CREATE INDEX big_idx ON big USING gpu_ivfpq (v) WITH (lists = 64, m = 8)});
# Three times the rows: its vectors do not fit the budget, its codes do. The
# mirror keeps the codes only and scans re-rank from the heap, visibly, with
# the exact answers of a sequential scan at exact settings.
my $big_q = q{SELECT id FROM big ORDER BY v <-> (SELECT v FROM queries WHERE q = 4) LIMIT 10};
my ($rc, $o, $e) = $node->psql('postgres',
	"SET client_min_messages = debug1; SET gpu_ivfpq.device = gpu; SELECT count(*) FROM ($big_q) s");
is($o, '10', 'an index whose vectors do not fit the budget is served by the GPU');
like($e, qr/GPU service: 1 of 1 rounds, 0 re-ranked on the GPU.*[1-9][0-9]* from the heap/,
	'its scans re-rank from the heap (DEBUG)');
is($node->safe_psql('postgres', q{SELECT vectors FROM gpu_ivfpq_mirrors WHERE index = 'big_idx'}),
	'f', 'the status view shows its mirror without vectors');
# The same candidates re-ranked from the heap (GPU) and from the index's
# vector copies (CPU engine): the same rows in the same order.
my $both = q{SET gpu_ivfpq.probes = 16; SET gpu_ivfpq.rerank = 400;
	SELECT array_agg(id) FROM (SELECT id FROM big ORDER BY v <-> (SELECT v FROM queries WHERE q = %d) LIMIT 30) s};
is( $node->safe_psql('postgres', 'SET gpu_ivfpq.device = gpu; ' . join(';', map { sprintf($both, $_) } 1 .. 5)),
	$node->safe_psql('postgres', 'SET gpu_ivfpq.device = cpu; ' . join(';', map { sprintf($both, $_) } 1 .. 5)),
	'heap re-rank answers equal the CPU engine re-ranking from the vector copies');
# A budget below even its codes: the CPU serves it.
$kb = $node->safe_psql('postgres',
	q{SELECT floor(size_mb * 1024 / 2)::int FROM gpu_ivfpq_mirrors WHERE index = 'big_idx'});
$node->safe_psql('postgres', "ALTER SYSTEM SET gpu_ivfpq.gpu_memory_budget = '${kb}kB'; SELECT pg_reload_conf();");
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM gpu_ivfpq_mirrors WHERE index = 'big_idx'}),
	'a smaller budget evicts it');
my $fallbacks = status('gpu_fallbacks');
($rc, $o, $e) = $node->psql('postgres', "SELECT count(*) FROM ($big_q) s");
is($o, '10', 'an index larger than the budget is still served (by the CPU)');
like($e, qr/does not fit in GPU memory, using the CPU/, 'with a WARNING');
cmp_ok(status('gpu_fallbacks'), '>', $fallbacks, 'counted as a fallback');
($rc, $o, $e) = $node->psql('postgres',
	q{SET gpu_ivfpq.device = gpu; SELECT count(*) FROM (SELECT id FROM big ORDER BY v <-> (SELECT v FROM queries WHERE q = 4) LIMIT 10) s});
isnt($rc, 0, 'gpu_ivfpq.device = gpu makes it an error instead');
$node->safe_psql('postgres', "ALTER SYSTEM RESET gpu_ivfpq.gpu_memory_budget; SELECT pg_reload_conf();");

# 5. Cancelled waits (statement_timeout) leave the service healthy.
my $pid = status('service_pid');
for my $i (1 .. 10)
{
	$node->psql('postgres',
		q{SET statement_timeout = '1ms'; SET gpu_ivfpq.device = gpu;
		SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> (SELECT v FROM queries WHERE q = 5) LIMIT 2000) s});
}
is(status('service_pid'), $pid, 'the service survived cancelled requests');
is( $node->safe_psql(
		'postgres', q{SET gpu_ivfpq.device = gpu; SELECT count(*) FROM (SELECT id FROM items ORDER BY v <-> (SELECT v FROM queries WHERE q = 5) LIMIT 10) s}),
	'10', 'and serves the next query');

# 6. The service killed: queries keep working on the CPU, then the GPU again
# with mirrors rebuilt from the pages.
my $cpu_answer = knn_all('cpu', '<->');
kill 'TERM', $pid;
is(knn_all('auto', '<->'), $cpu_answer, 'queries work while the service is down') if !$gpu;
ok(knn_all('auto', '<->') ne '', 'queries work while the service is down') if $gpu;
ok($node->poll_query_until('postgres', "SELECT service_pid IS NOT NULL AND service_pid <> $pid AND state LIKE 'running (GPU%' FROM gpu_ivfpq_status"),
	'the service restarted');
my $g = knn_all('gpu', '<->');
if (!$gpu) { is($g, $cpu_answer, 'after the restart the GPU path answers again, from a reloaded mirror'); }
else { ok($g ne '', 'after the restart the GPU path answers again, from a reloaded mirror'); }
like($node->safe_psql('postgres', q{SELECT string_agg(index, ',') FROM gpu_ivfpq_mirrors}),
	qr/items_l2/, 'the mirror was rebuilt lazily');

$node->stop;
done_testing();
