# Citus distributed tables: a coordinator and two workers, each preloading
# citus and gpu_ivfpq (the GPU service on its CPU emulation of the GPU, or
# the GPU with GPU_IVFPQ_EXPECT_GPU=1). CREATE INDEX on the coordinator
# reaches every shard, trains each shard's index on its rows and prints no
# NOTICE about the coordinator's empty shell table (nor do the workers);
# ORDER BY v <-> q LIMIT 10 through the coordinator is pushed down to every
# shard, runs as an index scan there, and the coordinator's merge equals the
# exact answer of a local copy of the rows with every list probed (a recall
# floor at the default settings); a query filtered on the distribution
# column is routed to one shard and answered by its index; inserts, deletes
# and VACUUM through the coordinator keep the answers exact. An index made
# on an empty distributed table is untrained on every shard: the workers say
# so (at DEBUG1, as Citus passes on worker messages of DDL), and the shards'
# planners prefer sequential scans until a REINDEX trains it.
#
# Skipped when Citus is not installed (scripts/run-tests.sh builds it from
# its source tarball when that is at hand).
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $coord = PostgreSQL::Test::Cluster->new('coordinator');
my $sharedir = $coord->config_data('--sharedir');
plan skip_all => "Citus is not installed ($sharedir/extension/citus.control not found)"
  unless -f "$sharedir/extension/citus.control";

my $gpu = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 1 : 0;
my @workers = map { PostgreSQL::Test::Cluster->new("worker$_") } (1, 2);

# Citus reaches the nodes over TCP by host name; the shared GPU gets a
# memory budget per instance that three of them fit together.
for my $node ($coord, @workers)
{
	$node->init;
	$node->append_conf(
		'postgresql.conf', qq{shared_preload_libraries = 'citus, gpu_ivfpq'
gpu_ivfpq.service_emulate_gpu = } . ($gpu ? 'off' : 'on') . qq{
gpu_ivfpq.gpu_memory_budget = '512MB'
listen_addresses = '127.0.0.1'
citus.local_hostname = '127.0.0.1'
max_prepared_transactions = 20
maintenance_work_mem = '128MB'
log_statement = none
});
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION citus');
}
$coord->safe_psql('postgres', "SELECT citus_set_coordinator_host('127.0.0.1', " . $coord->port . ')');
$coord->safe_psql('postgres', "SELECT citus_add_node('127.0.0.1', " . $_->port . ')') for @workers;

# CREATE EXTENSION on the coordinator reaches the workers.
$coord->safe_psql('postgres', 'CREATE EXTENSION gpu_ivfpq');
is($_->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'gpu_ivfpq'}),
	$coord->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'gpu_ivfpq'}),
	'gpu_ivfpq is installed on worker ' . $_->name)
  for @workers;
ok($_->poll_query_until('postgres', q{SELECT state LIKE 'running (GPU%' FROM gpu_ivfpq_status}),
	'the GPU service of ' . $_->name . ' serves from ' . ($gpu ? 'the GPU' : 'its CPU emulation'))
  for @workers;

# 40000 rows of 20 tenants, distributed by tenant over 4 shards (2 per
# worker), and a local copy on the coordinator for the exact answers.
my $dim = 16;
my $vector = "ARRAY(SELECT random()::real FROM generate_series(1, $dim) WHERE g > 0)";
$coord->safe_psql(
	'postgres', qq{
	SELECT setseed(0.7);
	CREATE TABLE items_exact (id bigint, tenant int, v real[]);
	INSERT INTO items_exact SELECT g, g % 20, $vector FROM generate_series(1, 40000) g;
	CREATE TABLE queries (q int, v real[]);
	INSERT INTO queries SELECT g, $vector FROM generate_series(1, 30) g;
	SET citus.shard_count = 4;
	CREATE TABLE items (id bigint, tenant int, v real[]);
	SELECT create_distributed_table('items', 'tenant');
	INSERT INTO items SELECT * FROM items_exact;
});

# The ids of "SELECT id FROM tbl WHERE filter ORDER BY v <-> q LIMIT k", in
# the order the query returns them (through the coordinator's merge for the
# distributed table).
$coord->safe_psql(
	'postgres', q{
	CREATE FUNCTION knn(tbl regclass, qv real[], k int, filter text DEFAULT 'true') RETURNS text
	LANGUAGE plpgsql AS $$
	DECLARE
		r record;
		ids text[] := '{}';
	BEGIN
		FOR r IN EXECUTE format('SELECT id FROM %s WHERE %s ORDER BY v <-> %L::real[] LIMIT %s',
								tbl, filter, qv, k) LOOP
			ids := ids || r.id::text;
		END LOOP;
		RETURN array_to_string(ids, ',');
	END $$;
});

# The shards of items: "shardid|port" per shard.
my @shards = map { [ split /\|/ ] } split /\n/, $coord->safe_psql(
	'postgres', q{SELECT shardid, nodeport FROM citus_shards
	  WHERE table_name = 'items'::regclass ORDER BY shardid});
is(scalar(@shards), 4, '4 shards');
my %worker_of = map { ($_->port => $_) } @workers;
ok((grep { !$worker_of{ $_->[1] } } @shards) == 0, 'every shard is on a worker');

# CREATE INDEX on the coordinator: nothing at NOTICE or above, neither from
# the coordinator's build on its empty shell table nor from the workers
# (their shard builds, and the shells Citus keeps there for its metadata).
# At DEBUG1 the coordinator reports its shell's index left untrained, and
# Citus passes on the workers' NOTICEs and WARNINGs: there are none.
my ($rc, $out, $err) = $coord->psql('postgres',
	'CREATE INDEX items_v ON items USING gpu_ivfpq (v, tenant) WITH (lists = 32, m = 8)');
is($rc, 0, 'CREATE INDEX on the distributed table');
is($err, '', 'CREATE INDEX prints nothing on the coordinator');
$coord->safe_psql('postgres', 'DROP INDEX items_v');
($rc, $out, $err) = $coord->psql('postgres',
	'SET client_min_messages = debug1; CREATE INDEX items_v ON items USING gpu_ivfpq (v, tenant) WITH (lists = 32, m = 8)');
is($rc, 0, 'CREATE INDEX again, with DEBUG1 messages');
like($err, qr/gpu_ivfpq index "items_v" on the Citus table "items" is left untrained/,
	'the coordinator says at DEBUG1 why its shell index is untrained');
unlike($err, qr/without vectors|vectors for \d+ lists/, 'no build says it lacks vectors');
unlike($err, qr/DETAIL:  from 127\.0\.0\.1/, 'the workers print nothing');

# The index exists on every shard, on its worker (Citus hides shards from
# pg_class unless told otherwise).
for my $s (@shards)
{
	my ($shardid, $port) = @$s;
	is( $worker_of{$port}->safe_psql(
			'postgres', qq{SET citus.override_table_visibility = off;
			  SELECT count(*) FROM pg_index i
			  JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
			  WHERE i.indrelid = 'items_$shardid'::regclass AND a.amname = 'gpu_ivfpq'}),
		1,
		"shard $shardid has its gpu_ivfpq index on port $port");
}

# Settings reach the workers only as SET LOCAL inside a transaction with
# citus.propagate_set_commands = local (a session SET stays on the
# coordinator). Exact: every list probed, every row re-ranked.
my $exact_settings = q{SET citus.propagate_set_commands = 'local';
	SET LOCAL gpu_ivfpq.probes = 32; SET LOCAL gpu_ivfpq.rerank = 100000;};

# Top 10 of every query, one line per query.
sub knn_all
{
	my ($tbl, $settings, $filter) = @_;
	$filter //= 'true';
	$settings //= '';
	return $coord->safe_psql(
		'postgres', qq{BEGIN; $settings
		SELECT string_agg(knn('$tbl', v, 10, \$f\$$filter\$f\$), E'\\n' ORDER BY q) FROM queries;
		COMMIT;});
}

# Mean recall@10 of the lines of $got against those of $want.
sub recall
{
	my ($got, $want) = @_;
	my @g = split /\n/, $got;
	my @w = split /\n/, $want;
	my ($hit, $all) = (0, 0);
	for my $i (0 .. $#w)
	{
		my %in = map { $_ => 1 } split /,/, $w[$i];
		$hit += grep { $in{$_} } split /,/, ($g[$i] // '');
		$all += scalar(keys %in);
	}
	return $all ? $hit / $all : 0;
}

# Each shard's scan reports what it did at DEBUG1: asked for with SET LOCAL
# client_min_messages on the workers, passed on by the coordinator with
# citus.worker_min_messages = debug1. Returns { shard index => lists probed }.
sub shard_scans
{
	my ($settings, $filter) = @_;
	$filter //= 'true';
	my ($rc, $out, $err) = $coord->psql(
		'postgres', qq{SET citus.propagate_set_commands = 'local';
		SET citus.worker_min_messages = debug1;
		BEGIN; $settings SET LOCAL client_min_messages = debug1;
		SELECT id FROM items WHERE $filter ORDER BY v <-> (SELECT v FROM queries WHERE q = 1) LIMIT 10;
		COMMIT;});
	is($rc, 0, 'query with per-shard scan reports');
	my %probed = $err =~ /gpu_ivfpq scan of "(items_v_\d+)" \([^)]*\): (\d+) lists probed/g;
	return \%probed;
}

my $exact = knn_all('items_exact');
is(knn_all('items', $exact_settings), $exact,
	'every list probed: the coordinator returns the exact top 10 in exact order');
my $r = recall(knn_all('items'), $exact);
# Measured 0.960 (10 of 32 lists probed on 10000-row shards of uniform
# 16-dimensional vectors); the floor leaves a margin for other platforms.
cmp_ok($r, '>=', 0.90, "recall\@10 at the default probes: $r");

# The workers' GPU services served the shards' scans (each shard's first
# scan loads its mirror and runs on the CPU meanwhile).
ok($_->safe_psql('postgres', 'SELECT queries_gpu > 0 FROM gpu_ivfpq_status') eq 't',
	'the GPU service of ' . $_->name . ' served scans')
  for @workers;

# Every shard scanned its index, with the lists the settings ask for.
my $probed = shard_scans('');
is_deeply([ sort keys %$probed ], [ map { "items_v_$_->[0]" } @shards ], 'every shard used its index');
is_deeply([ sort { $a <=> $b } values %$probed ], [ (10) x 4 ], 'each shard probed 10 lists (the default)');
$probed = shard_scans('SET LOCAL gpu_ivfpq.probes = 32;');
is_deeply([ values %$probed ], [ (32) x 4 ], 'SET LOCAL reached every shard: 32 lists probed');

# EXPLAIN: one task per shard, each an index scan of the shard's index under
# the pushed-down LIMIT; the coordinator sorts the shards' rows by distance.
my $q1 = $coord->safe_psql('postgres', 'SELECT v FROM queries WHERE q = 1');
my $plan = $coord->safe_psql('postgres',
	qq{SET citus.explain_all_tasks = on; EXPLAIN (COSTS OFF) SELECT id FROM items ORDER BY v <-> '$q1' LIMIT 10});
like($plan, qr/Task Count: 4/, 'EXPLAIN: 4 tasks');
like($plan, qr/Sort Key: remote_scan\./, 'EXPLAIN: the coordinator merges by distance');
for my $s (@shards)
{
	like($plan, qr/Limit\s+->\s+Index Scan using items_v_$s->[0] on items_$s->[0]/,
		"EXPLAIN: shard $s->[0] is an index scan under a pushed-down LIMIT");
}
unlike($plan, qr/Seq Scan/, 'EXPLAIN: no sequential scan');

# A tenant's query is routed to its shard alone and uses its index, the
# tenant compared in the index (the filter column).
$plan = $coord->safe_psql('postgres',
	qq{SET citus.explain_all_tasks = on; EXPLAIN (COSTS OFF) SELECT id FROM items WHERE tenant = 7 ORDER BY v <-> '$q1' LIMIT 10});
like($plan, qr/Task Count: 1/, 'EXPLAIN: a tenant query is one task (router plan)');
like($plan, qr/Index Scan using items_v_\d+ on items_\d+.*\s+Index Cond: \(tenant = 7\)/s,
	'EXPLAIN: the tenant query is an index scan with the tenant in the index condition');
my $exact7 = knn_all('items_exact', '', 'tenant = 7');
is(knn_all('items', $exact_settings, 'tenant = 7'), $exact7, 'tenant query, every list probed: exact');
$r = recall(knn_all('items', '', 'tenant = 7'), $exact7);
cmp_ok($r, '>=', 0.90, "tenant query, recall\@10 at the default probes: $r");
is(scalar(keys %{ shard_scans('', 'tenant = 7') }), 1, 'the tenant query scanned one shard');

# A query vector taken from the distributed table itself: Citus refuses the
# plain subquery (a join it cannot push down), a materialized CTE serves.
my $from_self = $coord->safe_psql(
	'postgres', qq{BEGIN; $exact_settings
	WITH q AS MATERIALIZED (SELECT v FROM items WHERE id = 5)
	SELECT array_to_string(ARRAY(SELECT id FROM items ORDER BY v <-> (SELECT v FROM q) LIMIT 10), ',');
	COMMIT;});
is($from_self, $coord->safe_psql('postgres', q{SELECT knn('items_exact', (SELECT v FROM items_exact WHERE id = 5), 10)}),
	'a query vector from the distributed table through a materialized CTE: exact with every list probed');

# The search functions read the one table or index they are given, outside
# the executor, where Citus does not distribute them: on the coordinator
# that is the empty shell, which they refuse with a hint; a shard's index
# serves them on its worker, and run_command_on_shards calls them on every
# shard.
($rc, $out, $err) = $coord->psql('postgres', qq{SELECT count(*) FROM gpu_ivfpq_knn_batch('items_v', '$q1', 10)});
like($err, qr/gpu_ivfpq_knn_batch cannot search table "items": it is a Citus table, whose rows are in its shards/,
	'gpu_ivfpq_knn_batch refuses the coordinator\'s shell index');
like($err, qr/HINT:  Query the table with ORDER BY \.\.\. LIMIT/, '... with a hint');
($rc, $out, $err) = $coord->psql('postgres', qq{SELECT count(*) FROM gpu_ivfpq_exact_knn('items', 'v', '$q1', 10)});
like($err, qr/gpu_ivfpq_exact_knn cannot search table "items": it is a Citus table/,
	'gpu_ivfpq_exact_knn refuses the coordinator\'s shell table');
is( $worker_of{ $shards[0][1] }->safe_psql('postgres',
		qq{SELECT count(*) FROM gpu_ivfpq_knn_batch('items_v_$shards[0][0]', '$q1', 10)}),
	10,
	'on its worker a shard\'s index serves gpu_ivfpq_knn_batch');
is( $coord->safe_psql(
		'postgres', qq{SELECT bool_and(success) AND sum(result::int) = 40 FROM run_command_on_shards('items',
		  \$\$SELECT count(*) FROM gpu_ivfpq_exact_knn('%s', 'v', '$q1', 10)\$\$)}),
	't',
	'run_command_on_shards: gpu_ivfpq_exact_knn on every shard');

# Inserts and deletes through the coordinator, then VACUUM: the answers stay
# exact. Each query's vector is inserted as a new row (found first, at
# distance 0), and each query's current nearest row is deleted.
$coord->safe_psql(
	'postgres', qq{
	CREATE TABLE gone AS
	  SELECT split_part(knn('items_exact', v, 1), ',', 1)::bigint AS id FROM queries
	  UNION SELECT id FROM items_exact WHERE id % 7 = 0;
	SELECT setseed(0.8);
	CREATE TABLE new_rows AS
	  SELECT 100000 + g AS id, g % 20 AS tenant, $vector AS v FROM generate_series(1, 2000) g
	  UNION ALL SELECT 200000 + q, q % 20, v FROM queries;
	INSERT INTO items SELECT * FROM new_rows;
	INSERT INTO items_exact SELECT * FROM new_rows;
});
$coord->safe_psql('postgres', 'DELETE FROM items WHERE id IN (SELECT id FROM gone)');
$coord->safe_psql('postgres', 'DELETE FROM items_exact WHERE id IN (SELECT id FROM gone)');
is($coord->safe_psql('postgres', 'SELECT count(*) FROM items'),
	$coord->safe_psql('postgres', 'SELECT count(*) FROM items_exact'), 'the same rows after DML');
my $exact_dml = knn_all('items_exact');
isnt($exact_dml, $exact, 'the exact answers changed');
is(knn_all('items', $exact_settings), $exact_dml, 'after inserts and deletes: exact with every list probed');
$r = recall(knn_all('items'), $exact_dml);
cmp_ok($r, '>=', 0.90, "after inserts and deletes: recall\@10 at the default probes: $r");
is( $coord->safe_psql('postgres',
		q{SELECT count(*) FROM queries WHERE split_part(knn('items', v, 1), ',', 1)::bigint = 200000 + q}),
	30,
	'each inserted query vector is its own nearest row');
$coord->safe_psql('postgres', 'VACUUM items');
is(knn_all('items', $exact_settings), $exact_dml, 'after VACUUM: exact with every list probed');

# An index made while the distributed table is empty is untrained on every
# shard. The coordinator's build says nothing at NOTICE (its shell is
# always empty); each shard's build says it had no vectors, which Citus
# passes on at DEBUG1. The shards' planners then prefer sequential scans
# (an untrained index re-ranks every row from the table), and a REINDEX
# after loading trains the shards' indexes.
$coord->safe_psql(
	'postgres', q{
	SET citus.shard_count = 4;
	CREATE TABLE late (id bigint, tenant int, v real[]);
	SELECT create_distributed_table('late', 'tenant');
});
($rc, $out, $err) = $coord->psql('postgres', 'CREATE INDEX late_v ON late USING gpu_ivfpq (v) WITH (lists = 32, m = 8)');
is($err, '', 'CREATE INDEX on an empty distributed table: nothing at NOTICE on the coordinator');
$coord->safe_psql('postgres', 'DROP INDEX late_v');
($rc, $out, $err) = $coord->psql('postgres',
	'SET client_min_messages = debug1; CREATE INDEX late_v ON late USING gpu_ivfpq (v) WITH (lists = 32, m = 8)');
my @untrained = $err =~ /gpu_ivfpq index "(late_v_\d+)" created on a table without vectors/g;
is(scalar(@untrained), 4, 'each empty shard says its index has no vectors (at DEBUG1 on the coordinator)');
$coord->safe_psql('postgres', 'INSERT INTO late SELECT * FROM items');
$plan = $coord->safe_psql('postgres',
	qq{SET citus.explain_all_tasks = on; EXPLAIN (COSTS OFF) SELECT id FROM late ORDER BY v <-> '$q1' LIMIT 10});
my $seqscans = () = $plan =~ /Seq Scan on late_\d+/g;
is($seqscans, 4, 'untrained shard indexes: every shard plans a sequential scan');
$coord->safe_psql('postgres', 'REINDEX INDEX late_v');
$plan = $coord->safe_psql('postgres',
	qq{SET citus.explain_all_tasks = on; EXPLAIN (COSTS OFF) SELECT id FROM late ORDER BY v <-> '$q1' LIMIT 10});
my $indexscans = () = $plan =~ /Index Scan using late_v_\d+/g;
is($indexscans, 4, 'after REINDEX every shard plans an index scan');
is( $coord->safe_psql('postgres',
		q{BEGIN; SET citus.propagate_set_commands = 'local'; SET LOCAL gpu_ivfpq.probes = 32; SET LOCAL gpu_ivfpq.rerank = 100000;
		  SELECT string_agg(knn('late', v, 10), E'\n' ORDER BY q) FROM queries; COMMIT;}),
	$exact_dml,
	'after REINDEX: exact with every list probed');

$_->stop for ($coord, @workers);
done_testing();
