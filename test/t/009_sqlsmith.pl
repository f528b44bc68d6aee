# SQLsmith against the extension: random queries over tables with real[]
# columns of several dimensions (NULL and zero vectors, no NaN) and
# gpu_ivfpq indexes of the three operator classes (one untrained), on an
# instance whose GPU service runs (its CPU emulation where there is no GPU).
# No query may crash a server process or make the service restart, none may
# raise an internal error (XX000) from the extension's code, and the server
# must still answer, with indexes that gpu_ivfpq_check finds sound and that
# agree with sequential scans.
#
# SQLsmith builds queries from the catalog, calls only functions that return
# one value, and uses operators only in comparisons. So that it reaches the
# extension, sqlsmith sees (as a user without superuser rights):
#  - the tables and the extension's views only (--exclude-catalog);
#  - scalar wrappers of the set-returning functions, which replace a NULL
#    argument (what SQLsmith passes most) by a usable value;
#  - a table of edge-case arguments (k, radii, regclasses, column and
#    metric names, vectors) that its column references pick from;
#  - a smaller function catalog: it reads pg_proc unqualified, and its
#    search_path puts first a view of pg_proc that keeps the extension's
#    functions and a sample of the built-in ones. Were that to change, the
#    test still runs, only with fewer calls of the extension.
#
# The seed is fixed and printed (GPU_IVFPQ_SQLSMITH_SEED and
# GPU_IVFPQ_SQLSMITH_QUERIES replay a run); timeouts can make two runs of a
# seed differ slightly. Skipped when sqlsmith (Debian package sqlsmith) is
# not installed.
use strict;
use warnings;

use IPC::Run;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my ($sqlsmith) = grep { -x } map { "$_/sqlsmith" } split /:/, ($ENV{PATH} // '');
plan skip_all => 'sqlsmith is not installed (Debian package sqlsmith)' unless $sqlsmith;

my $seed = $ENV{GPU_IVFPQ_SQLSMITH_SEED} || 20240917;
my $queries = $ENV{GPU_IVFPQ_SQLSMITH_QUERIES} || 10000;

my $gpu = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 1 : 0;
my $node = PostgreSQL::Test::Cluster->new('sqlsmith');
$node->init;
# Crashes are counted from the log, not stopped at: the postmaster restarts
# and SQLsmith reconnects. Verbose errors name the source file of each,
# which tells the extension's (.cpp) from PostgreSQL's (.c).
$node->append_conf(
	'postgresql.conf', qq{shared_preload_libraries = 'gpu_ivfpq'
gpu_ivfpq.service_emulate_gpu = } . ($gpu ? 'off' : 'on') . q{
restart_after_crash = on
log_statement = none
log_error_verbosity = verbose
track_functions = all
});
$node->start;

$node->safe_psql('postgres', 'CREATE DATABASE smith');
$node->safe_psql(
	'smith', q{
CREATE EXTENSION gpu_ivfpq;
SELECT setseed(0.25);
CREATE TABLE vec3 (id int PRIMARY KEY, v real[]);
INSERT INTO vec3 SELECT g, CASE WHEN g % 17 = 0 THEN NULL WHEN g % 13 = 0 THEN '{0,0,0}'
  ELSE ARRAY[random(), random(), random()] END::real[] FROM generate_series(1, 500) g;
CREATE INDEX vec3_l2 ON vec3 USING gpu_ivfpq (v) WITH (lists = 4, m = 1);
CREATE INDEX vec3_cos ON vec3 USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 4, m = 3);
CREATE TABLE vec8 (id int PRIMARY KEY, label text, v real[]);
INSERT INTO vec8 SELECT g, 'l' || (g % 5), CASE WHEN g % 11 = 0 THEN NULL WHEN g % 7 = 0 THEN array_fill(0::real, ARRAY[8])
  ELSE ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, 8) WHERE g > 0) END FROM generate_series(1, 1000) g;
CREATE INDEX vec8_ip ON vec8 USING gpu_ivfpq (v real_ip_ops) WITH (lists = 8, m = 4);
CREATE INDEX vec8_l2 ON vec8 USING gpu_ivfpq (v) WITH (lists = 8, m = 2);
CREATE TABLE vec4 (id int, v real[]);
SET client_min_messages = warning;
CREATE INDEX vec4_untrained ON vec4 USING gpu_ivfpq (v);
RESET client_min_messages;
INSERT INTO vec4 SELECT g, ARRAY[g, -g, g * 0.5, 1]::real[] FROM generate_series(1, 50) g;
INSERT INTO vec4 VALUES (51, NULL), (52, '{0,0,0,0}');

-- Edge-case arguments for SQLsmith's column references.
CREATE TABLE fuzz_args (k int, radius float8, idx regclass, col name, metric text, q real[]);
INSERT INTO fuzz_args VALUES
  (0, 'NaN', 'vec3_l2', 'v', 'l2', '{0.5,0.5,0.5}'),
  (-1, 'Infinity', 'vec3_cos', 'id', 'cosine', '{0,0,0}'),
  (1, '-Infinity', 'vec8_ip', 'label', 'ip', '{1,2,3,4,5,6,7,8}'),
  (10, -1, 'vec8_l2', 'nosuch', 'L2', '{{1,2,3},{4,5,6}}'),
  (1000, 0, 'vec4_untrained', 'v', 'manhattan', '{1,NULL,3}'),
  (1001, 0.5, 'vec3_pkey', 'v', '', '{NaN,1,2}'),
  (2147483647, 1e300, 'vec3', 'v', NULL, '{}'),
  (NULL, NULL, 'vec8', 'v', 'l2', '{Infinity,1,2,3}'),
  (5, 2, 999999, 'v', 'cosine', NULL),
  (3, 1, 'fuzz_args', 'q', 'ip', '{{{1,2},{3,4}},{{5,6},{7,8}}}'),
  (20, 0.1, 'vec4', 'v', 'l2', '{1,2,3,4}'),
  (2, 0.2, 'gpu_ivfpq_mirrors', 'entries', 'ip', '{0,0,0,0,0,0,0,0}');

-- What SQLsmith calls instead of the set-returning functions.
CREATE SCHEMA smith;
CREATE FUNCTION smith.knn_batch(idx regclass, q real[], k int) RETURNS bigint LANGUAGE sql VOLATILE AS $$
  SELECT count(*) FROM gpu_ivfpq_knn_batch(coalesce(idx, 'vec8_l2'),
    coalesce(q, '{0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8}'), coalesce(k, 10)) $$;
CREATE FUNCTION smith.knn_graph(idx regclass, k int) RETURNS float8 LANGUAGE sql VOLATILE AS $$
  SELECT max(distance) FROM gpu_ivfpq_knn_graph(coalesce(idx, 'vec3_l2'), coalesce(k, 3)) $$;
CREATE FUNCTION smith.exact_knn(tbl regclass, col name, q real[], k int, metric text) RETURNS float8
  LANGUAGE sql VOLATILE AS $$
  SELECT sum(distance) FROM gpu_ivfpq_exact_knn(coalesce(tbl, 'vec8'), coalesce(col, 'v'),
    coalesce(q, '{0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8}'), coalesce(k, 10), coalesce(metric, 'l2')) $$;
CREATE FUNCTION smith.range(idx regclass, q real[], radius float8, max_rows int) RETURNS bigint
  LANGUAGE sql VOLATILE AS $$
  SELECT count(*) FROM gpu_ivfpq_range(coalesce(idx, 'vec8_l2'),
    coalesce(q, '{0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8}'), coalesce(radius, 1.0), coalesce(max_rows, 0)) $$;
CREATE FUNCTION smith.prewarm(idx regclass) RETURNS bigint LANGUAGE sql VOLATILE AS $$
  SELECT gpu_ivfpq_prewarm(coalesce(idx, 'vec8_ip')) $$;

-- The function catalog SQLsmith loads: everything outside pg_catalog (the
-- extension's functions, the wrappers) but the functions behind the status
-- views (they are queried as views, and SQLsmith would call them in most
-- select lists), and one in 32 of the built-in functions on the types these
-- tables hold.
CREATE VIEW smith.pg_proc AS SELECT * FROM pg_catalog.pg_proc
  WHERE (pronamespace <> 'pg_catalog'::regnamespace AND proname NOT IN ('gpu_ivfpq_status', 'gpu_ivfpq_mirrors'))
     OR (prorettype = ANY ('{float4[],float8,int4,int8,bool,regclass,text,name,anyarray,anyelement,float4,oid}'::regtype[])
         AND proargtypes::oid[] <@ '{float4[],float4,float8,int4,int8,bool,regclass,oid,text,name,anyarray,anyelement}'::regtype[]::oid[]
         AND pronargs > 0 AND oid::int8 % 32 = 0);

CREATE ROLE smith LOGIN;
GRANT USAGE ON SCHEMA smith TO smith;
GRANT SELECT ON smith.pg_proc TO smith;
GRANT ALL ON ALL TABLES IN SCHEMA public TO smith;
GRANT pg_monitor TO smith;
ALTER ROLE smith SET search_path = smith, pg_catalog, public;
ANALYZE;
});
ok($node->poll_query_until('smith', q{SELECT state LIKE 'running (GPU%' FROM gpu_ivfpq_status}),
	'the service serves from ' . ($gpu ? 'the GPU' : 'its CPU emulation'));

# ---------------------------------------------------------------- run
my $dump = $node->basedir . '/sqlsmith_queries.sql';
my $progress = $node->basedir . '/sqlsmith_stderr.txt';
my $target = sprintf('host=%s port=%d dbname=smith user=smith', $node->host, $node->port);
my @cmd = ($sqlsmith, "--target=$target", '--exclude-catalog', "--seed=$seed",
	"--max-queries=$queries", '--dump-all-queries', '--verbose');
note("running: @cmd");
my $log_start = -s $node->logfile;
my $started = time;
my $rc = eval {
	IPC::Run::run(\@cmd, '<', \undef, '>', $dump, '2>', $progress, IPC::Run::timeout(600));
	$? >> 8;
};
my $failure = $@;
my $elapsed = time - $started;
my $summary = slurp_file($progress);
is($failure, '', 'sqlsmith finished within 10 minutes');
is($rc, 0, "sqlsmith ran $queries queries from seed $seed ($elapsed s)")
  or diag("sqlsmith output:\n" . substr($summary, -3000));
note("sqlsmith error summary:\n" . ($summary =~ /(queries: .*)/s ? substr($1, 0, 4000) : $summary));

# ---------------------------------------------------------------- checks
my $log = slurp_file($node->logfile, $log_start);
my @crashes = $log =~ /^(.*(?:terminated by signal|was terminated|PANIC:|TRAP:).*\n(?:.*DETAIL:.*\n)?)/mg;
is(scalar @crashes, 0, "no server process crashed (replay: GPU_IVFPQ_SQLSMITH_SEED=$seed)")
  or diag("crashes:\n" . join('', @crashes));

# Errors raised by the extension's code (a .cpp source file): none may be
# an internal error (XX000). PostgreSQL's own internal errors are counted.
my (@internal, $ours, $core);
while ($log =~ /ERROR:  (\w{5}): (.*)\n(?:.*\n){0,3}?.*LOCATION:  (\S+), (\S+):\d+/mg)
{
	my ($state, $msg, $func, $file) = ($1, $2, $3, $4);
	if ($file =~ /\.cpp$/)
	{
		$ours++;
		push @internal, "$msg ($func, $file)" if $state eq 'XX000';
	}
	elsif ($state eq 'XX000')
	{
		$core++;
	}
}
is(scalar @internal, 0, 'no internal error (XX000) from the extension') or diag(join("\n", @internal));
note(sprintf('%d statements failed with an error of the extension, %d with an internal error of PostgreSQL',
	$ours // 0, $core // 0));

# How much of the run reached the extension: statements that name one of
# its functions or views, or change an indexed table; calls that completed
# (an error, or a NULL argument to a STRICT function, counts none; the
# prewarm wrapper is inlined into its caller).
my @stmts = split /;\n/, slurp_file($dump);
my $calls = grep { /gpu_ivfpq_\w+\(|smith\.(?:knn_|exact_|range|prewarm)/ } @stmts;
my $views = grep { /public\.gpu_ivfpq_(?:status|mirrors)\b(?!\()/ } @stmts;
my $dml = grep { /^\s*(?:insert|update|delete|merge)\b[^;]*public\.vec/i } @stmts;
note(sprintf('%d statements: %d (%.0f%%) call an extension function, %d read its views, %d change an indexed table',
	scalar @stmts, $calls, 100 * $calls / (@stmts || 1), $views, $dml));
$node->poll_query_until('smith', q{SELECT count(*) = 0 FROM pg_stat_activity WHERE usename = 'smith'});
note("calls that completed:\n"
	  . $node->safe_psql('smith',
		q{SELECT string_agg(format('  %s.%s: %s', schemaname, funcname, calls), E'\n' ORDER BY schemaname, funcname)
		  FROM pg_stat_user_functions WHERE funcname LIKE 'gpu_ivfpq%' OR schemaname = 'smith'}));

is($node->safe_psql('smith', 'SELECT count(*) FROM vec8'), '1000', 'the server answers');
is($node->safe_psql('smith', 'SELECT service_starts FROM gpu_ivfpq_status'), '1', 'the service never restarted');

# SQLsmith's statements are rolled back, but their index entries stay
# behind: the indexes must still be sound, hold every row, and answer as
# sequential scans do.
is( $node->psql(
		'smith', q{SELECT gpu_ivfpq_check(indexrelid, true) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
		  JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'gpu_ivfpq'}),
	0,
	'gpu_ivfpq_check finds every index sound and complete');
for my $t ([ 'vec8_l2', 'vec8', '<->' ], [ 'vec8_ip', 'vec8', '<#>' ], [ 'vec3_cos', 'vec3', '<=>' ])
{
	my ($idx, $table, $op) = @$t;
	# Distances, not ids: rows at equal distances may come in either order.
	my $inner = "SELECT v $op (SELECT v FROM $table WHERE id = 2) AS d FROM $table ORDER BY v $op (SELECT v FROM $table WHERE id = 2) LIMIT 10";
	my $knn = "SELECT string_agg(round(d::numeric, 9)::text, ',') FROM ($inner) s";
	my $settings = 'SET enable_seqscan = off; SET gpu_ivfpq.probes = 64; SET gpu_ivfpq.rerank = 2000;';
	like($node->safe_psql('smith', "$settings EXPLAIN (COSTS OFF) $inner"),
		qr/Index Scan using $idx/, "$idx serves the scan");
	is($node->safe_psql('smith', "$settings $knn"),
		$node->safe_psql('smith', "SET enable_indexscan = off; $knn"),
		"$idx answers as a sequential scan after the run");
}

$node->stop;
done_testing();
