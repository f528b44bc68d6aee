# Exact range search and filtered k-NN on Fashion-MNIST (20000 training
# images, L2, lists = 64, m = 16), with the extension preloaded so that the
# k-NN rounds go through the GPU service (its CPU emulation without a GPU).
#
# Range: gpu_ivfpq_range returns exactly the rows a sequential scan finds
# within r, for radii at the 10th, 100th and 1000th neighbour distance of
# several queries; max_rows keeps the nearest.
# Filtered: WHERE label-filter ORDER BY v <-> q LIMIT 10 with filters
# matching 50%, 5% and 0.5% of the rows returns 10 rows every time (the scan
# continues with more candidates and lists); recall against the exact
# filtered answer and the mean latency are reported and floors asserted, for
# the default settings and for probes 16 / rerank 400.
use strict;
use warnings;

use FashionMnist;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

if (!FashionMnist::available())
{
	plan skip_all => "Fashion-MNIST is not installed in $FashionMnist::datadir";
}
my @files = @FashionMnist::files;
my $tmp = PostgreSQL::Test::Utils::tempdir;
FashionMnist::idx_to_copy($files[0], $files[1], 20000, "$tmp/train.txt");
FashionMnist::idx_to_copy($files[2], $files[3], 40, "$tmp/test.txt");

my $gpu = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 1 : 0;
my $node = PostgreSQL::Test::Cluster->new('range');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{shared_preload_libraries = 'gpu_ivfpq'
gpu_ivfpq.service_emulate_gpu = } . ($gpu ? 'off' : 'on') . qq{
shared_buffers = '256MB'
maintenance_work_mem = '256MB'
max_parallel_workers_per_gather = 0
});
$node->start;
$node->safe_psql(
	'postgres', qq{
	CREATE EXTENSION gpu_ivfpq;
	CREATE TABLE fm (id int PRIMARY KEY, label int, v real[]);
	COPY fm FROM '$tmp/train.txt';
	CREATE TABLE q (id int, label int, v real[]);
	COPY q FROM '$tmp/test.txt';
	CREATE INDEX fm_idx ON fm USING gpu_ivfpq (v) WITH (lists = 64, m = 16);
	ANALYZE fm;
});

# ---- range search
my $ok = 1;
my ($checked, $total_rows) = (0, 0);
for my $qid (1 .. 6)
{
	for my $nth (10, 100, 1000)
	{
		my $r = $node->safe_psql('postgres',
			qq{SELECT d FROM (SELECT v <-> (SELECT v FROM q WHERE id = $qid) AS d FROM fm ORDER BY 1 LIMIT $nth) s ORDER BY d DESC LIMIT 1});
		my $exact = $node->safe_psql('postgres',
			qq{SET enable_indexscan = off; SELECT count(*), coalesce(sum(id), 0) FROM fm WHERE v <-> (SELECT v FROM q WHERE id = $qid) <= $r});
		my $got = $node->safe_psql('postgres',
			qq{SELECT count(*), coalesce(sum(fm.id), 0) FROM gpu_ivfpq_range('fm_idx', (SELECT v FROM q WHERE id = $qid), $r) r
			   JOIN fm ON fm.ctid = r.tid});
		$checked++;
		$total_rows += (split /\|/, $exact)[0];
		if ($got ne $exact) { $ok = 0; diag("query $qid radius $r ($nth-th): range $got, seq scan $exact"); }
	}
}
ok($ok, "range search equals the sequential scan ($checked query/radius pairs, $total_rows rows)");
my ($rc, $out, $err) = $node->psql('postgres',
	q{SET client_min_messages = debug1; SELECT count(*) FROM gpu_ivfpq_range('fm_idx', (SELECT v FROM q WHERE id = 1), 1000)});
note($1) if $err =~ /(\d+ of \d+ lists pruned.*candidates tested)/;
is( $node->safe_psql('postgres',
		q{SELECT string_agg(r.tid::text, ',') FROM gpu_ivfpq_range('fm_idx', (SELECT v FROM q WHERE id = 2), 1e9, 5) r}),
	$node->safe_psql('postgres',
		q{SET enable_indexscan = off; SELECT string_agg(ctid::text, ',') FROM (SELECT ctid FROM fm ORDER BY v <-> (SELECT v FROM q WHERE id = 2), ctid LIMIT 5) s}),
	'max_rows keeps the nearest rows, nearest first');

# Rows inserted after the build (covering radius grown on insert) and deleted
# rows (never returned).
$node->safe_psql('postgres',
	q{INSERT INTO fm SELECT 100000 + id, label, v FROM q WHERE id <= 5;
	  DELETE FROM fm WHERE id IN (SELECT fm.id FROM fm, q WHERE q.id = 3 ORDER BY fm.v <-> q.v LIMIT 3 OFFSET 1)});
is( $node->safe_psql('postgres',
		q{SELECT count(*) FROM gpu_ivfpq_range('fm_idx', (SELECT v FROM q WHERE id = 3), 1500) r JOIN fm ON fm.ctid = r.tid}),
	$node->safe_psql('postgres',
		q{SET enable_indexscan = off; SELECT count(*) FROM fm WHERE v <-> (SELECT v FROM q WHERE id = 3) <= 1500}),
	'after inserts and deletes the range is still exact');

# ---- filtered k-NN
# One session runs the 20 queries of a filter and times each (the index scan
# and its heap re-rank, without client round trips).
$node->safe_psql(
	'postgres', q{
CREATE FUNCTION run_filtered(f text, probes int, rerank int)
RETURNS TABLE (qid int, got int[], exact int[], ms float8) LANGUAGE plpgsql AS $$
DECLARE
	t0 timestamptz;
	qv real[];
BEGIN
	FOR qid IN 1 .. 20 LOOP
		SELECT v INTO qv FROM q WHERE id = qid;
		PERFORM set_config('gpu_ivfpq.probes', probes::text, true);
		PERFORM set_config('gpu_ivfpq.rerank', rerank::text, true);
		PERFORM set_config('enable_seqscan', 'off', true);
		PERFORM set_config('enable_indexscan', 'on', true);
		t0 := clock_timestamp();
		EXECUTE format('SELECT array_agg(id) FROM (SELECT id FROM fm WHERE %s ORDER BY v <-> $1 LIMIT 10) s', f)
			INTO got USING qv;
		ms := 1000 * extract(epoch FROM clock_timestamp() - t0);
		PERFORM set_config('enable_indexscan', 'off', true);
		PERFORM set_config('enable_seqscan', 'on', true);
		EXECUTE format('SELECT array_agg(id) FROM (SELECT id FROM fm WHERE %s ORDER BY v <-> $1 LIMIT 10) s', f)
			INTO exact USING qv;
		RETURN NEXT;
	END LOOP;
END $$;
});
my %filters = ('50%' => 'label < 5', '5%' => 'label = 3 AND id % 2 = 0', '0.5%' => 'label = 3 AND id % 20 = 0');
# (probes, rerank, recall floor): the defaults, and more candidates. Measured
# here (20 queries): defaults 0.860 / 0.785 / 0.875 for 50% / 5% / 0.5%;
# probes 16, rerank 400: 0.945 / 0.880 / 0.855. Filtered recall stays below
# the unfiltered one because a continued scan orders rows within each round,
# not across rounds (docs/scans.md, "How results are ordered").
my @settings = ([10, 100, 0.7], [16, 400, 0.8]);
for my $sel ('50%', '5%', '0.5%')
{
	my $f = $filters{$sel};
	my $matching = $node->safe_psql('postgres', "SELECT count(*) FROM fm WHERE $f");
	for my $s (@settings)
	{
		my ($probes, $rerank, $floor) = @$s;
		my ($all10, $recall, $ms) = split /\|/, $node->safe_psql(
			'postgres', qq{
			SELECT bool_and(cardinality(got) = 10),
			       round(avg((SELECT count(*) FROM unnest(got) g WHERE g = ANY (exact)) / 10.0), 3),
			       round(avg(ms)::numeric, 2)
			FROM run_filtered('$f', $probes, $rerank)});
		is($all10, 't', "filter $sel ($matching rows match), probes $probes rerank $rerank: every query returned 10 rows");
		cmp_ok($recall, '>=', $floor, "filter $sel, probes $probes rerank $rerank: recall\@10 $recall, $ms ms per query");
	}
}

$node->stop;
done_testing();
