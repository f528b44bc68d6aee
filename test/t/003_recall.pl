# Recall@10 of a gpu_ivfpq index on real data: Fashion-MNIST (Debian
# package dataset-fashion-mnist), 60000 training images of 28x28 uint8
# pixels as real[784], L2 distance, lists = 256, m = 16. The first N test
# images are the queries (N = $GPU_IVFPQ_RECALL_QUERIES, default 1000;
# GPU_IVFPQ_RECALL_QUERIES=0 skips the test). The exact ground truth costs
# a pass over the 60000 rows per query: it takes most of the test's time.
# Recall is tie-aware: a returned row counts when its exact distance is at
# most the 10th exact distance.
#
# Measured (1000 queries): probes 1 / rerank 10: 0.44, probes 4 / rerank
# 100: 0.94, probes 10 / rerank 100 (the defaults): 0.977, probes 16 /
# rerank 200: 0.994, probes 32 / rerank 200: 0.996; 1-NN label accuracy
# 0.84. The floors asserted below leave a margin for changes of training.
use strict;
use warnings;

use FashionMnist;
use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);

my $datadir = $FashionMnist::datadir;
my @files = @FashionMnist::files;
if (!FashionMnist::available())
{
	plan skip_all => "Fashion-MNIST is not installed in $datadir";
}

if (defined $ENV{GPU_IVFPQ_RECALL_QUERIES} && $ENV{GPU_IVFPQ_RECALL_QUERIES} eq '0')
{
	plan skip_all => 'GPU_IVFPQ_RECALL_QUERIES=0';
}
my $nqueries = $ENV{GPU_IVFPQ_RECALL_QUERIES} || 1000;
die "GPU_IVFPQ_RECALL_QUERIES must be a number from 1 to 10000"
  unless $nqueries =~ /^\d+$/ && $nqueries >= 1 && $nqueries <= 10000;
my $t_start = time;

sub idx_to_copy { return FashionMnist::idx_to_copy(@_); }

my $tmp = PostgreSQL::Test::Utils::tempdir;
is(idx_to_copy($files[0], $files[1], 60000, "$tmp/train.txt"),
	60000, 'converted the training images');
is(idx_to_copy($files[2], $files[3], $nqueries, "$tmp/test.txt"),
	$nqueries, "converted $nqueries test images");

my $node = PostgreSQL::Test::Cluster->new('recall');
$node->init;
$node->append_conf(
	'postgresql.conf', q{
shared_buffers = '384MB'
maintenance_work_mem = '512MB'
max_parallel_workers_per_gather = 0
max_wal_size = '4GB'
log_statement = 'none'
});
$node->start;

# Embeddings are stored uncompressed (3 kB each): no decompression per distance.
my $t0 = time;
$node->safe_psql(
	'postgres', qq{
	CREATE EXTENSION gpu_ivfpq;
	BEGIN;
	CREATE TABLE train (id int, label int, v real[]);
	ALTER TABLE train ALTER COLUMN v SET STORAGE PLAIN;
	COPY train FROM '$tmp/train.txt';
	CREATE TABLE test (id int, label int, v real[]);
	ALTER TABLE test ALTER COLUMN v SET STORAGE PLAIN;
	COPY test FROM '$tmp/test.txt';
	COMMIT;
	VACUUM ANALYZE train;
	VACUUM ANALYZE test;
});
unlink "$tmp/train.txt", "$tmp/test.txt";
diag(sprintf('Fashion-MNIST loaded in %.1f s', time - $t0));
is($node->safe_psql('postgres', 'SELECT count(*), count(DISTINCT label) FROM train'),
	'60000|10', 'training rows and labels');

$t0 = time;
$node->safe_psql('postgres',
	'CREATE INDEX train_idx ON train USING gpu_ivfpq (v) WITH (lists = 256, m = 16)');
diag(sprintf('index built in %.1f s, %s', time - $t0,
	$node->safe_psql('postgres', "SELECT pg_size_pretty(pg_relation_size('train_idx'))")));

# Runs the SQL statements of @parts in concurrent sessions; dies on error.
sub run_parallel
{
	my @parts = @_;
	my @sessions;
	for my $sql (@parts)
	{
		my ($out, $err) = ('', '');
		push @sessions,
		  [
			IPC::Run::start(
				[ 'psql', '-X', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr('postgres'), '-c', $sql ],
				'<', \undef, '>', \$out, '2>', \$err),
			\$err
		  ];
	}
	for my $s (@sessions)
	{
		$s->[0]->finish or die "query failed: ${$s->[1]}";
	}
}

# The exact 10 nearest rows of the queries WHERE $filter: ids and distances.
sub exact_knn_sql
{
	my ($table, $filter) = @_;
	return qq{
		INSERT INTO $table
		SELECT q.id, array_agg(x.id ORDER BY x.d, x.id), array_agg(x.d ORDER BY x.d)
		FROM test q CROSS JOIN LATERAL (
			SELECT t.id, t.v <-> q.v AS d FROM train t ORDER BY t.v <-> q.v LIMIT 10) x
		WHERE $filter
		GROUP BY q.id;
	};
}

# Exact ground truth by sequential scans, the queries split over two
# sessions. Every tenth query is also answered through the index with exact
# settings (every list probed, every row re-ranked), which must give the
# same distances.
$t0 = time;
$node->safe_psql('postgres',
	'CREATE TABLE gt (qid int, ids int[], dists float8[]); CREATE TABLE gt_index (LIKE gt)');
my $seq_settings = 'SET enable_indexscan = off; SET enable_bitmapscan = off;';
like($node->safe_psql('postgres',
		"$seq_settings EXPLAIN (COSTS OFF) " . exact_knn_sql('gt', 'true')),
	qr/Seq Scan on train/, 'ground truth by sequential scans');
run_parallel(map { $seq_settings . exact_knn_sql('gt', "q.id % 2 = $_") } (0, 1));
diag(sprintf('exact ground truth for %d queries in %.1f s', $nqueries, time - $t0));
is($node->safe_psql('postgres', 'SELECT count(*), bool_and(cardinality(ids) = 10) FROM gt'),
	"$nqueries|t", 'ground truth for every query');

$t0 = time;
my $exact_settings = 'SET enable_seqscan = off; SET gpu_ivfpq.probes = 256; '
  . 'SET gpu_ivfpq.rerank = 60000;';
like($node->safe_psql('postgres',
		"$exact_settings EXPLAIN (COSTS OFF) " . exact_knn_sql('gt_index', 'true')),
	qr/Index Scan using train_idx/, 'exact settings use the index');
run_parallel(map { $exact_settings . exact_knn_sql('gt_index', "q.id % 20 = $_") } (0, 10));
diag(sprintf('%d queries with exact index settings in %.1f s',
	$node->safe_psql('postgres', 'SELECT count(*) FROM gt_index'), time - $t0));
# Equal distances (ties between rows may come in another order).
is( $node->safe_psql(
		'postgres', q{
		SELECT count(*), count(*) FILTER (WHERE g.dists = i.dists)
		FROM gt_index i JOIN gt g USING (qid)}),
	$node->safe_psql('postgres', 'SELECT count(*), count(*) FROM gt_index'),
	'exact index settings give the exact 10 nearest rows');

# Recall@10 and ms per query with the given probes and rerank, through the
# index (checked from EXPLAIN).
$node->safe_psql(
	'postgres', q{
	CREATE FUNCTION recall(p int, r int, OUT recall float8, OUT ms float8) LANGUAGE plpgsql AS $$
	DECLARE
		t0 timestamptz;
		plan text := '';
		line text;
	BEGIN
		PERFORM set_config('enable_seqscan', 'off', true);
		PERFORM set_config('gpu_ivfpq.probes', p::text, true);
		PERFORM set_config('gpu_ivfpq.rerank', r::text, true);
		FOR line IN EXPLAIN (COSTS OFF)
			SELECT t.id FROM train t ORDER BY t.v <-> (SELECT v FROM test WHERE id = 1) LIMIT 10
		LOOP
			plan := plan || line;
		END LOOP;
		IF plan NOT LIKE '%Index Scan using train_idx%' THEN
			RAISE EXCEPTION 'the index is not used: %', plan;
		END IF;
		t0 := clock_timestamp();
		SELECT avg(hits) / 10.0, extract(epoch FROM clock_timestamp() - t0) * 1000 / count(*)
		INTO recall, ms
		FROM (
			SELECT (SELECT count(*) FROM (
						SELECT t.v <-> q.v AS d FROM train t ORDER BY t.v <-> q.v LIMIT 10) x
					WHERE x.d <= g.dists[10]) AS hits
			FROM gt g JOIN test q ON q.id = g.qid) y;
	END $$;
});

my %recall;
for my $setting ([ 1, 10 ], [ 4, 100 ], [ 10, 100 ], [ 16, 200 ], [ 32, 200 ])
{
	my ($p, $r) = @$setting;
	my ($rec, $ms) = split /\|/,
	  $node->safe_psql('postgres', "SELECT * FROM recall($p, $r)");
	$recall{"$p/$r"} = $rec;
	diag(sprintf('probes %3d, rerank %4d: recall@10 %.4f, %.2f ms/query', $p, $r, $rec, $ms));
}

cmp_ok($recall{'10/100'}, '>=', 0.95, 'recall@10 with the default settings (probes 10, rerank 100)');
cmp_ok($recall{'16/200'}, '>=', 0.98, 'recall@10 with probes 16, rerank 200');
cmp_ok($recall{'32/200'}, '>=', 0.98, 'recall@10 with probes 32, rerank 200');
cmp_ok($recall{'4/100'}, '>=', 0.88, 'recall@10 with probes 4, rerank 100');
cmp_ok($recall{'16/200'}, '>', $recall{'1/10'}, 'more probes and re-ranking find more');

# The nearest neighbour's label predicts the query's label (1-NN accuracy
# with raw pixels and L2 is about 0.85 on Fashion-MNIST).
my $accuracy = $node->safe_psql(
	'postgres', q{
	SET enable_seqscan = off;
	SELECT avg((q.label = (SELECT t.label FROM train t ORDER BY t.v <-> q.v LIMIT 1))::int)
	FROM test q;
});
diag(sprintf('1-NN label accuracy through the index: %.3f', $accuracy));
cmp_ok($accuracy, '>=', 0.80, '1-NN label accuracy through the index');

$node->stop;
diag(sprintf('total %.0f s', time - $t_start));
done_testing();
