# The functions that take an index (or a table) as a regclass open it as
# core does: the caller's SELECT privilege on the table is checked before
# any lock, and the table is locked before the index. While the table's
# owner holds it (BEGIN; LOCK TABLE ... IN ACCESS EXCLUSIVE MODE), a role
# without privileges gets its permission error at once instead of queueing,
# and a role that may read the table queues for the table without holding
# the index, so that the owner's DROP INDEX goes through instead of failing
# with "deadlock detected"; the waiting call then reports the index gone.
# A relation of the wrong kind is refused, by name, without a lock either.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('lock_order');
$node->init;
$node->append_conf('postgresql.conf', "autovacuum = off\n");
$node->start;
$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION gpu_ivfpq;
	CREATE TABLE items (id int PRIMARY KEY, v real[]);
	INSERT INTO items SELECT i, ARRAY[i % 7, i % 11, i % 13, i % 17]::real[] FROM generate_series(1, 200) i;
	CREATE INDEX items_v ON items USING gpu_ivfpq (v) WITH (lists = 4);
	CREATE TABLE words (id int, word text);
	INSERT INTO words SELECT i, 'w' || i FROM generate_series(1, 100) i;
	CREATE INDEX words_w ON words USING gpu_metric (word);
	CREATE ROLE nobody LOGIN;
	CREATE ROLE reader LOGIN;
	GRANT SELECT ON items, words TO reader;
	-- A deadlock, if there were one, is reported to the owner, whose
	-- deadlock check runs first (as in the report of the defect).
	ALTER ROLE reader SET deadlock_timeout = '10min';
});

# Each call, the table it reads and the index it takes (undef: a table).
my @calls = (
	[ 'items', 'items_v', q{SELECT count(*) FROM gpu_ivfpq_knn_batch('items_v', ARRAY[[1,2,3,4]]::real[], 3)} ],
	[ 'items', 'items_v', q{SELECT count(*) FROM gpu_ivfpq_range('items_v', ARRAY[1,2,3,4]::real[], 5)} ],
	[ 'items', 'items_v', q{SELECT count(*) FROM gpu_ivfpq_knn_graph('items_v', 2)} ],
	[ 'items', 'items_v', q{SELECT gpu_ivfpq_prewarm('items_v')} ],
	[ 'items', 'items_v', q{SELECT gpu_ivfpq_check('items_v', true)} ],
	[ 'items', undef, q{SELECT count(*) FROM gpu_ivfpq_exact_knn('items', 'v', ARRAY[[1,2,3,4]]::real[], 3)} ],
	[ 'words', 'words_w', q{SELECT count(*) FROM gpu_metric_range_batch('words_w', ARRAY['w1'], 1)} ],
	[ 'words', 'words_w', q{SELECT count(*) FROM gpu_metric_knn_batch('words_w', ARRAY['w1'], 2)} ],
	[ 'words', 'words_w', q{SELECT gpu_metric_prewarm('words_w')} ],);

my $owner = $node->background_psql('postgres', on_error_stop => 0);

# Runs $sql as $role while the owner holds its table; returns psql's stderr.
# lock_timeout only turns a wait (the defect) into an error: with the
# refusal taken before any lock, no wait happens however slow the machine.
sub call_while_locked
{
	my ($table, $role, $sql) = @_;
	$owner->query_safe("BEGIN; LOCK TABLE $table IN ACCESS EXCLUSIVE MODE");
	my ($rc, $out, $err) = $node->psql('postgres', "SET lock_timeout = '5s'; $sql",
		extra_params => [ '-U', $role ]);
	$owner->query_safe('ROLLBACK');
	return $err;
}

# 1. Without any privilege: refused at once, by name, without waiting.
for my $c (@calls)
{
	my ($table, $index, $sql) = @$c;
	like(call_while_locked($table, 'nobody', $sql),
		qr/permission denied for table $table/, "without privileges, refused at once: $sql");
}

# 2. The wrong kind of relation: refused at once, naming it and the method.
my @wrong = (
	[ 'items', q{SELECT count(*) FROM gpu_ivfpq_knn_batch('items', ARRAY[[1,2,3,4]]::real[], 3)},
		qr/"items" is not a gpu_ivfpq index/ ],
	[ 'items', q{SELECT count(*) FROM gpu_ivfpq_range('items_pkey', ARRAY[1,2,3,4]::real[], 5)},
		qr/"items_pkey" is not a gpu_ivfpq index/ ],
	[ 'words', q{SELECT gpu_ivfpq_check('words_w')}, qr/"words_w" is not a gpu_ivfpq index/ ],
	[ 'items', q{SELECT gpu_metric_prewarm('items_v')}, qr/"items_v" is not a gpu_metric index/ ],
	[ 'items', q{SELECT count(*) FROM gpu_metric_knn_batch('items', ARRAY['w1'], 2)},
		qr/"items" is not a gpu_metric index/ ],
	[ 'items', q{SELECT count(*) FROM gpu_ivfpq_exact_knn('items_v', 'v', ARRAY[[1,2,3,4]]::real[], 3)},
		qr/"items_v" is not a table or materialized view/ ],);
for my $w (@wrong)
{
	my ($table, $sql, $expect) = @$w;
	like(call_while_locked($table, 'nobody', $sql), $expect, "wrong relation refused at once: $sql");
}

# 3. A role that may read the table waits for it, holding no lock on the
# index: the owner's DROP INDEX goes through, and the call then finds the
# index gone.
my $reader = $node->background_psql('postgres', on_error_stop => 0, extra_params => [ '-U', 'reader' ]);
my $reader_pid = $reader->query_safe('SELECT pg_backend_pid()');
for my $c (@calls)
{
	my ($table, $index, $sql) = @$c;
	next unless defined $index;
	my $def = $node->safe_psql('postgres', "SELECT pg_get_indexdef('$index'::regclass)");

	$owner->query_safe("BEGIN; LOCK TABLE $table IN ACCESS EXCLUSIVE MODE");
	$reader->{stderr} = '';
	$reader->query_until(qr/started/, "\\echo started\n$sql;\n");
	ok( $node->poll_query_until(
			'postgres', "SELECT count(*) > 0 FROM pg_locks WHERE pid = $reader_pid AND NOT granted"),
		"the reader waits for the owner: $sql");
	$owner->{stderr} = '';
	my (undef, $failed) = $owner->query("DROP INDEX $index");
	ok(!$failed, "the owner's DROP INDEX goes through while the reader waits: $sql")
	  or diag($owner->{stderr});
	$owner->{stderr} = '';
	$owner->query_safe($failed ? 'ROLLBACK' : 'COMMIT');
	# The banner of this query follows the end of the waiting call.
	$reader->query('SELECT 1');
	like($reader->{stderr}, qr/relation with OID \d+ does not exist/,
		"the waiting call finds the index gone: $sql");
	$node->safe_psql('postgres', $def) unless $node->safe_psql('postgres', "SELECT to_regclass('$index') IS NOT NULL") eq 't';
}

# The same calls succeed when nothing is in the way.
for my $c (@calls)
{
	my ($table, $index, $sql) = @$c;
	next if $sql =~ /prewarm/;    # no GPU service on this server
	my ($rc, $out, $err) = $node->psql('postgres', $sql, extra_params => [ '-U', 'reader' ]);
	is($rc, 0, "the reader's call runs: $sql") or diag($err);
}

$reader->quit;
$owner->quit;
$node->stop;
done_testing();
