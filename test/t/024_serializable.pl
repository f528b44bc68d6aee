# SERIALIZABLE transactions that read through the search functions: each
# function reads the whole index (or, for exact k-NN, the whole table), so
# it takes a relation-level predicate lock, as an index scan of an access
# method without predicate locks of its own does. Two transactions that
# each search near a point, find nothing, and insert near the other's point
# have no serial order: one of them must fail with a serialization error,
# whether the search found rows or not. Run with the service, its GPU
# process emulated on the CPU where there is no GPU (exact k-NN then
# answers from the index's mirror).
use strict;
use warnings;

use GpuNode;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = GpuNode::start('serializable', "autovacuum = off\n");
$node->safe_psql(
	'postgres', q{
	CREATE TABLE s1 (id int, v real[]);
	INSERT INTO s1 SELECT i, ARRAY[sin(i), cos(i), sin(i * 0.3), cos(i * 0.7)]::real[]
	FROM generate_series(1, 3000) i;
	CREATE INDEX s1_v ON s1 USING gpu_ivfpq (v) WITH (lists = 4, m = 2);
	SELECT gpu_ivfpq_prewarm('s1_v');
	CREATE TABLE words (id int, w text);
	INSERT INTO words SELECT i, md5(i::text) FROM generate_series(1, 2000) i;
	CREATE INDEX words_w ON words USING gpu_metric (w);
});

# Each case: what a transaction reads at its point (QV: the point), and what
# it inserts there; the two points lie within each other's search.
my @cases = (
	[
		'gpu_ivfpq_range',
		q{SELECT count(*) FROM gpu_ivfpq_range('s1_v', 'QV'::real[], 0.1)},
		q{INSERT INTO s1 VALUES (-1, 'QV')}, '{7,7,7,7}', '{7,7,7,7.001}'
	],
	[
		'gpu_ivfpq_knn_batch',
		q{SELECT count(*) FROM gpu_ivfpq_knn_batch('s1_v', 'QV'::real[], 1) WHERE distance < 0.1},
		q{INSERT INTO s1 VALUES (-1, 'QV')}, '{7,7,7,7}', '{7,7,7,7.001}'
	],
	[
		'gpu_ivfpq_exact_knn',
		q{SELECT count(*) FROM gpu_ivfpq_exact_knn('s1', 'v', ARRAY['QV'::real[]], 1) WHERE distance < 0.1},
		q{INSERT INTO s1 VALUES (-1, 'QV')}, '{7,7,7,7}', '{7,7,7,7.001}'
	],
	[
		'gpu_metric_range_batch',
		q{SELECT count(*) FROM gpu_metric_range_batch('words_w', ARRAY['QV'], 1)},
		q{INSERT INTO words VALUES (-1, 'QV')}, 'hello', 'hellp'
	],
	[
		'gpu_metric_knn_batch',
		q{SELECT count(*) FROM gpu_metric_knn_batch('words_w', ARRAY['QV'], 1) WHERE distance <= 1},
		q{INSERT INTO words VALUES (-1, 'QV')}, 'hello', 'hellp'
	],);

for my $c (@cases)
{
	my ($name, $read, $insert, $p1, $p2) = @$c;
	my @s = map { $node->background_psql('postgres', on_error_stop => 0) } (1, 2);
	my $errors = '';
	my @points = ($p1, $p2);

	for my $i (0, 1)
	{
		(my $sql = $read) =~ s/QV/$points[$i]/g;
		$s[$i]->query('BEGIN ISOLATION LEVEL SERIALIZABLE');
		my $found = $s[$i]->query($sql);
		is($found, '0', "$name: transaction " . ($i + 1) . ' finds nothing near its point');
	}
	for my $i (0, 1)
	{
		(my $sql = $insert) =~ s/QV/$points[$i]/g;
		$s[$i]->query($sql);
		$errors .= $s[$i]->{stderr};
	}
	for my $i (0, 1)
	{
		$s[$i]->query('COMMIT');
		$errors .= $s[$i]->{stderr};
	}
	$_->quit for @s;
	like($errors, qr/could not serialize access/, "$name: one of the two transactions fails to serialize");
	my $table = $insert =~ /words/ ? 'words' : 's1';
	is($node->safe_psql('postgres', "SELECT count(*) FROM $table WHERE id < 0"),
		'1', "$name: only one of the inserts committed");
	$node->safe_psql('postgres', "DELETE FROM $table WHERE id < 0");
}

$node->stop;
done_testing();
