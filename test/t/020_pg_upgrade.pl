# pg_upgrade from an older major version: gpu_ivfpq and gpu_metric indexes
# built on the old server keep their files (the format is the extension's
# own, and pg_upgrade copies index files as they are), so after the upgrade
# they answer exactly as before, pass gpu_ivfpq_check, take inserts and
# VACUUM, and rebuild. The old server is the one whose bin folder
# GPU_IVFPQ_UPGRADE_FROM names (scripts/run-tests.sh passes PostgreSQL 15's
# when it tests 18), with the extension installed in both; the test is
# skipped without it.
use strict;
use warnings;

use File::Basename qw(dirname);
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $old_bin = $ENV{GPU_IVFPQ_UPGRADE_FROM} // '';
plan skip_all => 'GPU_IVFPQ_UPGRADE_FROM names no older PostgreSQL bin folder'
  unless $old_bin ne '' && -x "$old_bin/pg_ctl";

chomp(my $new_bindir = `pg_config --bindir`);
my ($old_major) = `$old_bin/pg_config --version` =~ /PostgreSQL (\d+)/;
my ($new_major) = `pg_config --version` =~ /PostgreSQL (\d+)/;
plan skip_all => "the old server ($old_major) is not older than this one ($new_major)"
  unless defined $old_major && defined $new_major && $old_major < $new_major;
plan skip_all => "gpu_ivfpq is not installed in PostgreSQL $old_major"
  unless -f `$old_bin/pg_config --sharedir` =~ s/\s+$//r . '/extension/gpu_ivfpq.control';

# Both clusters with the same locale and encoding, and without data
# checksums (18's initdb turns them on; pg_upgrade wants both alike).
my $old = PostgreSQL::Test::Cluster->new('old', install_path => dirname($old_bin));
$old->init(extra => [ '--no-locale', '--encoding=UTF8' ]);
$old->start;
$old->safe_psql(
	'postgres', q{
	CREATE EXTENSION gpu_ivfpq;
	CREATE TABLE items (id int PRIMARY KEY, tenant int, v real[]);
	INSERT INTO items
	SELECT i, i % 4, ARRAY(SELECT sin(i * 0.37 + d * 1.3)::real FROM generate_series(1, 16) d)
	FROM generate_series(1, 3000) i;
	CREATE INDEX items_l2 ON items USING gpu_ivfpq (v, tenant) WITH (lists = 16, m = 4);
	CREATE INDEX items_cos ON items USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 8, m = 8);
	CREATE TABLE words (id int PRIMARY KEY, w text);
	INSERT INTO words
	SELECT i, string_agg(chr(97 + ((i * 7 + k * 13) % 26)), '' ORDER BY k)
	FROM generate_series(1, 2000) i, generate_series(1, 3 + i % 6) k GROUP BY i;
	CREATE INDEX words_lc ON words USING gpu_metric (w);
	VACUUM ANALYZE items;
	VACUUM ANALYZE words;
});

# What the indexes answer: k-NN with probes below and at the list count,
# filtered k-NN, the batch function, an edit-distance range and k-NN search;
# every scan through the index (checked by EXPLAIN in the first query).
my $answers_sql = q{
	SET enable_seqscan = off;
	SET enable_bitmapscan = off;
	SET gpu_ivfpq.rerank = 20;
	SET gpu_ivfpq.probes = 3;
	WITH q AS (SELECT g, ARRAY(SELECT cos(g * 0.91 + d * 0.7)::real FROM generate_series(1, 16) d) AS qv
			   FROM generate_series(1, 6) g)
	SELECT 'l2', g, ARRAY(SELECT id FROM items ORDER BY v <-> qv LIMIT 10)::text FROM q
	UNION ALL
	SELECT 'cosine', g, ARRAY(SELECT id FROM items ORDER BY v <=> qv LIMIT 10)::text FROM q
	UNION ALL
	SELECT 'tenant', g, ARRAY(SELECT id FROM items WHERE tenant = 2 ORDER BY v <-> qv LIMIT 10)::text FROM q
	UNION ALL
	SELECT 'batch', 0, ARRAY(SELECT row(b.query, b.rank, b.tid)::text
							 FROM gpu_ivfpq_knn_batch('items_l2', (SELECT array_agg(qv ORDER BY g) FROM q), 5) b
							 ORDER BY b.query, b.rank)::text
	UNION ALL
	SELECT 'range', 0, ARRAY(SELECT id FROM words WHERE w <% edit_range('abcde', 2) ORDER BY id)::text
	UNION ALL
	SELECT 'edit knn', 0, ARRAY(SELECT id FROM words ORDER BY w <~> 'hello', id LIMIT 8)::text
	ORDER BY 1, 2;
};
my $plan_sql = q{
	SET enable_seqscan = off;
	EXPLAIN (COSTS OFF) SELECT id FROM items ORDER BY v <-> (SELECT v FROM items WHERE id = 1) LIMIT 10;
};
like($old->safe_psql('postgres', $plan_sql), qr/Index Scan using items_l2/, 'the old server scans the index');
my $before = $old->safe_psql('postgres', $answers_sql);
my $version = $old->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'gpu_ivfpq'});
like($before, qr/^batch\|0\|\{.+\}$/m, 'the old server answers every query');
$old->stop;

my $new = PostgreSQL::Test::Cluster->new('new');
my @no_checksums = $new_major >= 18 ? ('--no-data-checksums') : ();
$new->init(extra => [ '--no-locale', '--encoding=UTF8', @no_checksums ]);

# pg_upgrade writes its reports into the current folder.
my $work = PostgreSQL::Test::Utils::tempdir();
chdir $work or die "chdir $work: $!";
command_ok(
	[
		'pg_upgrade', '--no-sync',
		'-d', $old->data_dir, '-D', $new->data_dir,
		'-b', $old_bin, '-B', $new_bindir,
		'-p', $old->port, '-P', $new->port,
		'-s', $work
	],
	"pg_upgrade from $old_major to $new_major");

$new->start;
is($new->safe_psql('postgres', q{SELECT extversion FROM pg_extension WHERE extname = 'gpu_ivfpq'}),
	$version, 'the extension keeps its version');
like($new->safe_psql('postgres', $plan_sql), qr/Index Scan using items_l2/, 'the new server scans the index');
is($new->safe_psql('postgres', $answers_sql), $before, 'the upgraded indexes answer as before');
foreach my $idx ('items_l2', 'items_cos')
{
	is($new->safe_psql('postgres', "SELECT gpu_ivfpq_check('$idx', true)"),
		'', "gpu_ivfpq_check passes on the upgraded $idx");
}

# The upgraded indexes are written to: inserts, deletes and VACUUM, each
# answer equal to a sequential scan with every list probed; then REINDEX.
$new->safe_psql(
	'postgres', q{
	INSERT INTO items
	SELECT i, i % 4, ARRAY(SELECT sin(i * 0.37 + d * 1.3)::real FROM generate_series(1, 16) d)
	FROM generate_series(3001, 3500) i;
	DELETE FROM items WHERE id % 7 = 0;
	INSERT INTO words VALUES (5001, 'hallo'), (5002, 'helo');
	VACUUM items;
	VACUUM words;
});
my $exact_sql = q{
	SET gpu_ivfpq.probes = 16;
	SET gpu_ivfpq.rerank = 4000;
	WITH q AS (SELECT g, ARRAY(SELECT cos(g * 0.91 + d * 0.7)::real FROM generate_series(1, 16) d) AS qv
			   FROM generate_series(1, 6) g)
	SELECT g, ARRAY(SELECT id FROM items ORDER BY v <-> qv, id LIMIT 10) FROM q
	UNION ALL
	SELECT 0, ARRAY(SELECT id FROM words WHERE w <% edit_range('hello', 1) ORDER BY id)
	ORDER BY 1;
};
my $seq = $new->safe_psql('postgres', "SET enable_indexscan = off; SET enable_bitmapscan = off; $exact_sql");
is($new->safe_psql('postgres', "SET enable_seqscan = off; SET enable_bitmapscan = off; $exact_sql"), $seq,
	'after DML and VACUUM the upgraded indexes equal sequential scans');
like($seq, qr/^0\|\{.*5001.*5002.*\}$/m, 'the new words are found');
$new->safe_psql('postgres', 'REINDEX TABLE items; REINDEX TABLE words;');
is($new->safe_psql('postgres', "SET enable_seqscan = off; SET enable_bitmapscan = off; $exact_sql"), $seq,
	'after REINDEX too');

$new->stop;
done_testing();
