# A hot standby served by the GPU service: the primary announces every
# change of a gpu_ivfpq index's mirror in WAL, and the standby's replay
# keeps its own mirror coherent. After each step (build, inserts, deletes
# and VACUUM, REINDEX) the standby answers k-NN queries through the GPU
# (gpu_ivfpq.device = gpu, so anything else is an error) with the
# primary's rows, finds every new row through its mirror, and keeps one
# mirror that follows the changes in place. A primary restarted without
# the preload cannot announce: the metapage flag it sets makes the standby
# refuse the GPU for the changed indexes, with the rows still right; once
# the primary preloads again, its next change clears the flag and the
# standby serves from a fresh mirror. The standby is promoted, takes
# inserts and still serves them through the GPU, equal to sequential scans.
# A standby that does not preload gpu_ivfpq stops at the first record. An
# index with RaBitQ codes is mirrored and followed by replay alike, its rows
# (300 dimensions at 4 bits: 172 bytes) wider than a change-log entry's
# code bytes, so that replay puts them in the vector ring.
#
# Without a GPU both servers use the service's CPU emulation of the GPU;
# GPU_IVFPQ_EXPECT_GPU=1 (the GPU machine) uses the GPU.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $emulate = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 'off' : 'on';
my $preload = qq{shared_preload_libraries = 'gpu_ivfpq'
gpu_ivfpq.service_emulate_gpu = $emulate
};
my $dim = 8;
my $lists = 16;
# Dimensions of a table's vectors ($dim unless named here).
my %dims = (rq_items => 300);
sub dim_of { my ($table) = @_; return $dims{$table} // $dim; }

my $primary = PostgreSQL::Test::Cluster->new('primary');
$primary->init(allows_streaming => 1);
$primary->append_conf('postgresql.conf', $preload);
$primary->start;
$primary->safe_psql('postgres',
	'CREATE EXTENSION gpu_ivfpq; CREATE EXTENSION pageinspect; CREATE EXTENSION pg_walinspect;');

# Rows: id, and $dim pseudo-random dimensions from (seed, id).
sub insert_rows
{
	my ($node, $table, $from, $to, $seed) = @_;
	my $d = dim_of($table);
	$node->safe_psql(
		'postgres', qq{
		SELECT setseed($seed);
		INSERT INTO $table
		SELECT i, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, $d) WHERE i > 0)
		FROM generate_series($from, $to) i;
	});
}

foreach my $table ('items', 'others', 'rq_items')
{
	$primary->safe_psql('postgres',
		"CREATE TABLE $table (id int PRIMARY KEY, v real[]) WITH (autovacuum_enabled = off)");
}
insert_rows($primary, 'items',  1, 3000, 0.1);
insert_rows($primary, 'others', 1, 1000, 0.2);
insert_rows($primary, 'rq_items', 1, 800, 0.6);
$primary->safe_psql(
	'postgres', qq{
	CREATE INDEX items_idx ON items USING gpu_ivfpq (v) WITH (lists = $lists, m = 4);
	CREATE INDEX others_idx ON others USING gpu_ivfpq (v) WITH (lists = 8, m = 4);
	CREATE INDEX rq_items_idx ON rq_items USING gpu_ivfpq (v) WITH (lists = $lists, codes = rabitq);
});

$primary->backup('backup');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'backup', has_streaming => 1);
# Reconnects quickly after the primary restarts.
$standby->append_conf('postgresql.conf', "wal_retrieve_retry_interval = '100ms'");
$standby->start;
ok( $standby->poll_query_until(
		'postgres', q{SELECT state LIKE 'running (GPU%' FROM gpu_ivfpq_status}),
	'the standby runs the GPU service');

# Every list probed and 1000 candidates re-ranked: the answers depend only
# on the rows, so the primary's and the standby's must be equal.
my $exact = "SET enable_seqscan = off; SET gpu_ivfpq.probes = $lists; SET gpu_ivfpq.rerank = 1000;";

# The ids of the 10 nearest rows of 8 fixed query vectors, one group per
# query, on $node through the index with gpu_ivfpq.device = $device.
sub knn
{
	my ($node, $table, $device) = @_;
	my $d = dim_of($table);
	return $node->safe_psql(
		'postgres', qq{$exact SET gpu_ivfpq.device = $device;
		SELECT setseed(0.5);
		WITH queries AS MATERIALIZED (
			SELECT q, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, $d) WHERE q > 0) AS qv
			FROM generate_series(1, 8) q)
		SELECT string_agg(ARRAY(SELECT id FROM $table ORDER BY v <-> queries.qv LIMIT 10)::text, ' ' ORDER BY q)
		FROM queries;
	});
}

# The same with a sequential scan.
sub knn_seqscan
{
	my ($node, $table) = @_;
	my $d = dim_of($table);
	return $node->safe_psql(
		'postgres', qq{SET enable_indexscan = off; SET enable_bitmapscan = off;
		SELECT setseed(0.5);
		WITH queries AS MATERIALIZED (
			SELECT q, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, $d) WHERE q > 0) AS qv
			FROM generate_series(1, 8) q)
		SELECT string_agg(ARRAY(SELECT id FROM $table ORDER BY v <-> queries.qv LIMIT 10)::text, ' ' ORDER BY q)
		FROM queries;
	});
}

# The nearest row to each of the rows $from..$to (their own vectors), through
# the GPU: each must find itself.
sub nearest_to_themselves
{
	my ($node, $table, $from, $to) = @_;
	return $node->safe_psql(
		'postgres', qq{$exact SET gpu_ivfpq.device = gpu;
		SELECT bool_and((SELECT s.id FROM $table s ORDER BY s.v <-> t.v LIMIT 1) = t.id)
		FROM $table t WHERE t.id BETWEEN $from AND $to;
	});
}

sub queries_gpu
{
	my ($node) = @_;
	return $node->safe_psql('postgres', 'SELECT queries_gpu FROM gpu_ivfpq_status');
}

# The standby's mirror of an index: "relfilenode entries queries", one line
# per mirror of it.
sub mirror
{
	my ($index) = @_;
	return $standby->safe_psql('postgres',
		"SELECT string_agg(relfilenode || ' ' || entries || ' ' || queries, E'\\n') FROM gpu_ivfpq_mirrors WHERE index = '$index'"
	);
}

# After the standby caught up: the GPU serves its k-NN scans with the
# primary's answers, and its one mirror of the index holds as many entries
# as the index (the rows inserted since the last VACUUM).
sub check_standby
{
	my ($step, $table, $index, $entries) = @_;
	$primary->wait_for_catchup($standby);
	my $before = queries_gpu($standby);
	is(knn($standby, $table, 'gpu'), knn($primary, $table, 'auto'),
		"$step: the standby's GPU answers equal the primary's");
	cmp_ok(queries_gpu($standby) - $before, '>=', 8, "$step: the standby's service served them");
	my $node = $standby->safe_psql('postgres', "SELECT pg_relation_filenode('$index')");
	ok( $standby->poll_query_until(
			'postgres',
			"SELECT count(*) = 1 AND min(relfilenode) = $node AND min(entries) = $entries FROM gpu_ivfpq_mirrors WHERE index = '$index'"
		),
		"$step: one mirror of the current index version, with $entries entries")
	  or diag(mirror($index));
}

check_standby('build', 'items', 'items_idx', 3000);
my ($node0, undef, $queries0) = split / /, mirror('items_idx');

# RaBitQ codes: the standby mirrors them too, and replay carries their
# inserts (rows wider than an entry's code bytes, through the vector ring)
# and VACUUM's removals into that mirror: the same mirror, whose query
# count goes on past both checks' 8 queries.
check_standby('rabitq build', 'rq_items', 'rq_items_idx', 800);
my $rq_lsn = $primary->safe_psql('postgres', 'SELECT pg_current_wal_lsn()');
insert_rows($primary, 'rq_items', 801, 900, 0.7);
like(
	$primary->safe_psql(
		'postgres',
		"SELECT description FROM pg_get_wal_records_info('$rq_lsn', pg_current_wal_lsn())
		 WHERE resource_manager = 'gpu_ivfpq' AND record_type = 'APPEND' LIMIT 1"),
	qr/: list \d+ tid \(\d+,\d+\) code 172 bytes vector 0 floats/,
	'pg_walinspect: a RaBitQ row of 172 bytes announced whole');
check_standby('rabitq inserts', 'rq_items', 'rq_items_idx', 900);
ok( $standby->poll_query_until(
		'postgres', "SELECT queries >= 16 FROM gpu_ivfpq_mirrors WHERE index = 'rq_items_idx'"),
	'rabitq inserts: replay appended the wide rows to the mirror, which did not reload')
  or diag(mirror('rq_items_idx'));
is(nearest_to_themselves($standby, 'rq_items', 801, 830), 't',
	'rabitq inserts: each new row is the nearest to itself on the standby\'s GPU');
$primary->safe_psql('postgres', 'DELETE FROM rq_items WHERE id % 3 = 0; VACUUM rq_items');
check_standby('rabitq vacuum', 'rq_items', 'rq_items_idx', 600);
is(knn($standby, 'rq_items', 'gpu'), knn_seqscan($standby, 'rq_items'),
	'rabitq vacuum: the standby\'s GPU answers equal a sequential scan\'s');

# Inserts reach the standby's mirror by replay, in place: the same mirror
# (its query count goes on) finds each new row.
insert_rows($primary, 'items', 3001, 3500, 0.3);
check_standby('inserts', 'items', 'items_idx', 3500);
is(nearest_to_themselves($standby, 'items', 3001, 3040), 't',
	'inserts: each new row is the nearest to itself on the standby\'s GPU');
# The views are published by the service (at least every second), not by the scans.
ok( $standby->poll_query_until(
		'postgres', "SELECT queries > $queries0 FROM gpu_ivfpq_mirrors WHERE index = 'items_idx'"),
	'inserts: the same mirror served (not reloaded)');
my (undef, undef, $queries1) = split / /, mirror('items_idx');

# The records are in WAL under gpu_ivfpq's resource manager: named and
# described where the extension is loaded (pg_walinspect), by number in
# pg_waldump.
my $lsn = $primary->safe_psql('postgres', 'SELECT pg_current_wal_lsn()');
insert_rows($primary, 'items', 3501, 3600, 0.4);
$primary->safe_psql('postgres', 'DELETE FROM items WHERE id BETWEEN 3501 AND 3600; VACUUM items');
my $lsn2 = $primary->safe_psql('postgres', 'SELECT pg_current_wal_lsn()');
my $records = "FROM pg_get_wal_records_info('$lsn', '$lsn2') WHERE resource_manager = 'gpu_ivfpq'";
like(
	$primary->safe_psql(
		'postgres',
		"SELECT string_agg(record_type || ' ' || n, ', ' ORDER BY record_type)
		 FROM (SELECT record_type, count(*) AS n $records GROUP BY record_type) r"),
	qr/^APPEND 100, REMOVE [1-9][0-9]*$/,
	'pg_walinspect: an APPEND record per insert, REMOVE records for the VACUUM');
like(
	$primary->safe_psql('postgres', "SELECT description $records AND record_type = 'APPEND' LIMIT 1"),
	qr/^db \d+ index \d+ rel \d+ build \d+: list \d+ tid \(\d+,\d+\) code 4 bytes vector $dim floats/,
	'pg_walinspect: an APPEND record described');
my ($out, $err) = run_command(
	[ 'pg_waldump', '-p', $primary->data_dir . '/pg_wal', '-s', $lsn, '-e', $lsn2, '--rmgr=custom187' ]);
is(scalar(() = $out =~ /^rmgr: custom187 /mg),
	$primary->safe_psql('postgres', "SELECT count(*) $records"),
	'pg_waldump lists the same records as custom187')
  or diag($err);
check_standby('insert, delete and VACUUM of the same rows', 'items', 'items_idx', 3500);

# Deletes and VACUUM: the removals reach the standby's mirror in place.
$primary->safe_psql('postgres', 'DELETE FROM items WHERE id % 5 = 0; VACUUM items');
check_standby('deletes and VACUUM', 'items', 'items_idx', 2800);
ok( $standby->poll_query_until(
		'postgres', "SELECT queries > $queries1 FROM gpu_ivfpq_mirrors WHERE index = 'items_idx'"),
	'deletes and VACUUM: the same mirror served (not reloaded)');

# REINDEX: a new index version, mirrored anew; the old mirror is dropped
# by the announced invalidation.
$primary->safe_psql('postgres', 'REINDEX INDEX items_idx');
check_standby('REINDEX', 'items', 'items_idx', 2800);
isnt((split / /, mirror('items_idx'))[0], $node0, 'REINDEX: the mirror is of the new relfilenode');
check_standby('others, build', 'others', 'others_idx', 1000);

# The primary restarts without the preload: its changes are not announced.
# VACUUM (items) and an insert (others) each flag their index before
# changing it; the standby then refuses the GPU for both, and its rows
# still equal the primary's and a sequential scan.
$primary->adjust_conf('postgresql.conf', 'shared_preload_libraries', undef);
$primary->adjust_conf('postgresql.conf', 'gpu_ivfpq.service_emulate_gpu', undef);
$primary->restart;
$primary->safe_psql('postgres', 'DELETE FROM items WHERE id % 7 = 0; VACUUM items');
insert_rows($primary, 'items',  4001, 4200, 0.5);
insert_rows($primary, 'others', 1001, 1100, 0.6);
$primary->wait_for_catchup($standby);

# The flag sits in the metapage (offset 24 + 60: GpuIvfpqMetaPageData.flags).
foreach my $index ('items_idx', 'others_idx')
{
	is( $standby->safe_psql('postgres',
			"SELECT get_byte(get_raw_page('$index', 0), 84)"),
		'1', "$index: the metapage flags the unannounced changes on the standby");
	my ($ret, $stdout, $stderr) = $standby->psql('postgres',
		"$exact SET gpu_ivfpq.device = gpu; SELECT id FROM "
		  . ($index =~ s/_idx//r)
		  . " ORDER BY v <-> array_fill(0.1::real, ARRAY[$dim]) LIMIT 3");
	like($stderr, qr/changed on a primary that did not preload gpu_ivfpq.*REINDEX it on a primary that preloads gpu_ivfpq/s,
		"$index: the standby refuses the GPU, saying why and what to do");
}
foreach my $table ('items', 'others')
{
	my $rows = knn($standby, $table, 'auto');
	is($rows, knn($primary, $table, 'auto'), "unannounced $table: the standby's rows equal the primary's");
	is($rows, knn_seqscan($standby, $table), "unannounced $table: and a sequential scan's");
}

# Preloaded again: the next insert clears the flag (after an invalidation
# that drops the standby's stale mirror), and the standby serves from a
# fresh one, with every row.
$primary->append_conf('postgresql.conf', $preload);
$primary->restart;
insert_rows($primary, 'items', 4201, 4300, 0.7);
$primary->wait_for_catchup($standby);
is($standby->safe_psql('postgres', "SELECT get_byte(get_raw_page('items_idx', 0), 84)"),
	'0', 'preloaded again: an insert clears the flag');
my $items = $primary->safe_psql('postgres', 'SELECT count(*) FROM items');
check_standby('preloaded again', 'items', 'items_idx', $items);
is(nearest_to_themselves($standby, 'items', 4001, 4300), 't',
	'preloaded again: rows inserted without the preload are in the fresh mirror');
is(knn($standby, 'items', 'gpu'), knn_seqscan($standby, 'items'),
	'preloaded again: the GPU answers equal a sequential scan');

# Promotion: the promoted standby takes inserts, deletes and VACUUM, and
# its GPU answers them exactly.
$standby->promote;
$standby->safe_psql('postgres', 'SELECT 1');
insert_rows($standby, 'items', 5001, 5300, 0.8);
$standby->safe_psql('postgres', 'DELETE FROM items WHERE id % 11 = 0; VACUUM items');
my $before = queries_gpu($standby);
is(knn($standby, 'items', 'gpu'), knn_seqscan($standby, 'items'),
	'promoted: the GPU answers equal a sequential scan');
cmp_ok(queries_gpu($standby) - $before, '>=', 8, 'promoted: the service served them');
is(nearest_to_themselves($standby, 'items', 5001, 5040), 't',
	'promoted: each new row is the nearest to itself');
ok( $standby->poll_query_until(
		'postgres',
		"SELECT min(entries) = (SELECT count(*) FROM items) AND count(*) = 1 FROM gpu_ivfpq_mirrors WHERE index = 'items_idx'"
	),
	'promoted: one mirror, with every row');

# A standby that does not preload gpu_ivfpq cannot replay the records: its
# recovery stops at the first one, naming the resource manager it lacks.
$primary->backup('backup2');
my $bare = PostgreSQL::Test::Cluster->new('bare_standby');
$bare->init_from_backup($primary, 'backup2', has_streaming => 1);
$bare->adjust_conf('postgresql.conf', 'shared_preload_libraries', undef);
$bare->adjust_conf('postgresql.conf', 'gpu_ivfpq.service_emulate_gpu', undef);
$bare->start;
insert_rows($primary, 'items', 6001, 6010, 0.9);
ok($bare->wait_for_log(qr/resource manager with ID 187 not registered/),
	'a standby without the preload stops at the first record');
$bare->stop('immediate', fail_ok => 1);

$standby->stop;
$primary->stop;
done_testing();
