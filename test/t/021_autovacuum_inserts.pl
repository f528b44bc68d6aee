# An autovacuum run that a batch of inserts starts (the table's
# autovacuum_vacuum_insert_threshold) finds no dead rows: it must not read
# the whole gpu_ivfpq index to count its entries. The index's buffer
# accesses (pg_statio_user_indexes) across that run stay far below its page
# count, while a manual VACUUM of the same table still counts every entry
# (reltuples exact) and so reads every list page.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('autovacuum_inserts');
$node->init;
$node->append_conf(
	'postgresql.conf', qq{
autovacuum_naptime = 1
track_counts = on
});
$node->start;

# Vectors with copies in the pages, so that the index spans many pages;
# autoanalyze off for the table (it would not read the index either, but
# keeps the run to the one VACUUM the inserts start).
$node->safe_psql(
	'postgres', q{
	CREATE EXTENSION gpu_ivfpq;
	CREATE TABLE t (id int, v real[]) WITH (
		autovacuum_enabled = off,
		autovacuum_vacuum_insert_threshold = 1000,
		autovacuum_vacuum_insert_scale_factor = 0,
		autovacuum_analyze_threshold = 2000000000);
	SELECT setseed(0.5);
	INSERT INTO t SELECT i, ARRAY(SELECT random()::real FROM generate_series(1, 32) WHERE i > 0)
	FROM generate_series(1, 20000) i;
	CREATE INDEX t_idx ON t USING gpu_ivfpq (v) WITH (lists = 16, m = 8);
	VACUUM t;
	SELECT pg_stat_force_next_flush();
});

my $pages = $node->safe_psql('postgres', q{SELECT pg_relation_size('t_idx') / 8192});
cmp_ok($pages, '>', 200, "the index spans many pages ($pages)");

# Buffer accesses to the index so far. Each session that touches the
# index flushes its counters before it returns (pg_stat_force_next_flush:
# at its next idle point, before psql gets its answer), so none come late.
sub index_accesses
{
	my $out = $node->safe_psql(
		'postgres', q{
		SELECT pg_stat_force_next_flush();
		SELECT idx_blks_read + idx_blks_hit FROM pg_statio_user_indexes WHERE indexrelname = 't_idx'});
	return (split /\n/, $out)[-1];
}

# 2000 more rows, then let autovacuum at the table.
$node->safe_psql(
	'postgres', q{
	INSERT INTO t SELECT i, ARRAY(SELECT random()::real FROM generate_series(1, 32) WHERE i > 0)
	FROM generate_series(20001, 22000) i;
	SELECT pg_stat_force_next_flush();
});
my $count0 = $node->safe_psql('postgres',
	q{SELECT autovacuum_count FROM pg_stat_user_tables WHERE relname = 't'});
my $before = index_accesses();
$node->safe_psql('postgres', q{ALTER TABLE t SET (autovacuum_enabled = on)});

# The worker reports its VACUUM at once and its buffer counts when it
# exits: wait for both.
ok( $node->poll_query_until(
		'postgres', qq{
		SELECT autovacuum_count > $count0 FROM pg_stat_user_tables WHERE relname = 't'}),
	'autovacuum vacuumed the table after the inserts');
$node->safe_psql('postgres', q{ALTER TABLE t SET (autovacuum_enabled = off)});
ok( $node->poll_query_until(
		'postgres', q{
		SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'autovacuum worker'}),
	'the autovacuum worker has exited');
my $after = index_accesses();
cmp_ok($after - $before, '<', $pages / 4,
	"autovacuum after inserts read few index pages ($before -> $after of $pages)");

# A manual VACUUM counts every entry: reltuples is exact, and it reads the lists.
$before = index_accesses();
$node->safe_psql('postgres', q{VACUUM t; SELECT pg_stat_force_next_flush();});
$after = index_accesses();
is($node->safe_psql('postgres', q{SELECT reltuples::bigint FROM pg_class WHERE relname = 't_idx'}),
	'22000', 'a manual VACUUM counts the entries');
cmp_ok($after - $before, '>=', $pages / 2, "a manual VACUUM reads the list pages ($before -> $after)");

$node->stop;
done_testing();
