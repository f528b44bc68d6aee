# Argument fuzz of the SQL surface: gpu_ivfpq_knn_batch, gpu_ivfpq_knn_graph,
# gpu_ivfpq_exact_knn, gpu_ivfpq_range, gpu_ivfpq_prewarm, gpu_ivfpq_check,
# the three distance operators and index scans ordered by them, each called with generated
# argument combinations: wrong dimensions, k out of range, NaN and infinite
# radii and elements, NULL arguments and elements, empty, 3-dimensional and
# 20000-element arrays, relations that are not gpu_ivfpq indexes or not
# tables, OIDs that do not exist, wrong columns and metric names.
#
# A call with a bad argument must fail cleanly, with an SQLSTATE that its
# bad arguments call for (never XX000, the internal-error code, and never a
# crash); a call with a NULL argument returns no rows (the functions are
# STRICT); any other call must return exactly what a sequential scan
# returns. Each case runs in a PL/pgSQL harness that catches its error and
# compares its rows with the sequential scan's answer in SQL, so a thousand
# cases take a few seconds; all run through the GPU service (its CPU
# emulation where there is no GPU), then on the CPU engine.
#
# Cases are the one-at-a-time variations of a valid call plus random
# combinations drawn from a printed seed (GPU_IVFPQ_FUZZ_SEED replays one).
# Known defects are marked `todo` on the argument value that triggers them:
# their cases run last, as TODO tests, after the crash check of the others.
use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $seed = $ENV{GPU_IVFPQ_FUZZ_SEED} // 20240917;
my $random_cases = 150;    # random combinations per function
srand($seed);

my $gpu = $ENV{GPU_IVFPQ_EXPECT_GPU} ? 1 : 0;
my $node = PostgreSQL::Test::Cluster->new('fuzz');
$node->init;
# The service (its CPU emulation of the GPU without one) serves the
# functions, as in production; a crash must not end the run, so the
# postmaster restarts and the next case goes on.
$node->append_conf(
	'postgresql.conf', qq{shared_preload_libraries = 'gpu_ivfpq'
gpu_ivfpq.service_emulate_gpu = } . ($gpu ? 'off' : 'on') . q{
restart_after_crash = on
log_statement = none
});
$node->start;

# ---------------------------------------------------------------- fixture
# t3: 3-d rows with NULL vectors, zero vectors (NaN under cosine) and exact
# duplicates; indexes of the three operator classes, a partial and an
# expression index, a btree. t4: an index built on an empty table, so
# untrained. Tables the exact search must refuse: non-finite elements, NULL
# elements, 2-d rows, mixed dimensions; and a view, a partitioned table, a
# foreign table, a materialized view, a sequence, a 20000-d table.
$node->safe_psql('postgres', 'CREATE DATABASE fuzz');
$node->safe_psql(
	'fuzz', q{
CREATE EXTENSION gpu_ivfpq;
SELECT setseed(0.42);
CREATE TABLE t3 (id int PRIMARY KEY, v real[], label text);
INSERT INTO t3 SELECT g,
  CASE WHEN g % 23 = 0 THEN NULL WHEN g % 19 = 0 THEN '{0,0,0}' WHEN g % 29 = 0 THEN '{0.5,0.5,0.5}'
       ELSE ARRAY[random() * 2 - 1, random() * 2 - 1, random() * 2 - 1] END::real[], 'row ' || g
FROM generate_series(1, 300) g;
CREATE INDEX t3_l2 ON t3 USING gpu_ivfpq (v) WITH (lists = 4, m = 3);
CREATE INDEX t3_ip ON t3 USING gpu_ivfpq (v real_ip_ops) WITH (lists = 4, m = 1);
CREATE INDEX t3_cos ON t3 USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 4, m = 3);
CREATE INDEX t3_part ON t3 USING gpu_ivfpq (v) WITH (lists = 2, m = 3) WHERE id % 2 = 0;
CREATE INDEX t3_expr ON t3 USING gpu_ivfpq ((v[1:2])) WITH (lists = 2, m = 2);
CREATE INDEX t3_btree ON t3 (id);
CREATE TABLE t4 (id int, v real[]);
SET client_min_messages = warning;
CREATE INDEX t4_untrained ON t4 USING gpu_ivfpq (v);
RESET client_min_messages;
INSERT INTO t4 SELECT g, ARRAY[g, -g, g * 0.5, 1]::real[] FROM generate_series(1, 40) g;
INSERT INTO t4 VALUES (41, NULL), (42, '{0,0,0,0}');
CREATE TABLE tnan (id int, v real[]);
INSERT INTO tnan SELECT g, ARRAY[g, 1, 2]::real[] FROM generate_series(1, 5) g;
INSERT INTO tnan VALUES (6, '{NaN,1,1}'), (7, '{Infinity,1,1}'), (8, '{-Infinity,0,0}');
CREATE TABLE tnullelem (id int, v real[]);
INSERT INTO tnullelem VALUES (1, '{1,2,3}'), (2, '{1,NULL,3}');
CREATE TABLE tmulti (id int, v real[]);
INSERT INTO tmulti VALUES (1, '{1,2,3}'), (2, '{{1,2,3}}');
CREATE TABLE tmixed (id int, v real[]);
INSERT INTO tmixed VALUES (1, '{1,2,3}'), (2, '{1,2,3,4}');
CREATE TABLE tbig (id int, v real[]);
INSERT INTO tbig SELECT g, ARRAY(SELECT ((g * 7 + i) % 13)::real FROM generate_series(1, 20000) i)
FROM generate_series(1, 12) g;
CREATE VIEW v3 AS SELECT * FROM t3;
CREATE TABLE part (id int, v real[]) PARTITION BY RANGE (id);
CREATE TABLE part1 PARTITION OF part FOR VALUES FROM (0) TO (1000);
INSERT INTO part SELECT id, v FROM t3;
CREATE MATERIALIZED VIEW mv3 AS SELECT * FROM t3;
CREATE EXTENSION file_fdw;
CREATE SERVER files FOREIGN DATA WRAPPER file_fdw;
CREATE FOREIGN TABLE ft3 (id int, v real[]) SERVER files OPTIONS (filename '/dev/null');
CREATE SEQUENCE seq1;
ANALYZE;
});

# ---------------------------------------------------------------- checkers
# The harness and the sequential-scan answers, in SQL. fz_got and fz_want
# hold (query, rank, tid, distance): the function's rows and the exact
# answer. Ties may come back in either order, so ranks are compared by
# distance, and each returned row is checked for its true distance.
$node->safe_psql(
	'fuzz', q{
-- Runs one case: its verdict ('ok' or 'WRONG: ...'), or its error.
CREATE FUNCTION fuzz_case(sql text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  verdict text;
  st text;
  msg text;
BEGIN
  EXECUTE sql INTO verdict;
  RETURN coalesce(verdict, 'WRONG: no verdict');
EXCEPTION WHEN OTHERS THEN
  GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
  RETURN 'ERROR ' || st || ': ' || msg;
END $$;

-- The queries of a real[] argument as the functions number them: a vector
-- is query 1, a matrix has one query per row from 1.
CREATE FUNCTION fuzz_queries(q real[]) RETURNS TABLE (n int, qv real[]) LANGUAGE sql IMMUTABLE AS $$
  SELECT 1, q WHERE array_ndims(q) = 1
  UNION ALL
  SELECT i - array_lower(q, 1) + 1, ARRAY(SELECT q[i][j] FROM generate_subscripts(q, 2) j ORDER BY j)
  FROM generate_subscripts(q, 1) i WHERE array_ndims(q) = 2 $$;

-- The exact answer: per query, the rows whose vector expression is not NULL
-- and that satisfy pred, by the operator, at most k (NULL: all) and within
-- radius (NULL: any).
CREATE FUNCTION fuzz_want(tbl regclass, expr text, pred text, op text, q real[], k int, radius float8)
RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  EXECUTE format($f$CREATE TEMP TABLE fz_want ON COMMIT DROP AS
    SELECT query::text, rank, tid, distance FROM (
      SELECT q.n AS query, t.ctid AS tid, (%1$s) %2$s q.qv AS distance,
             row_number() OVER (PARTITION BY q.n ORDER BY (%1$s) %2$s q.qv) AS rank
      FROM fuzz_queries($1) q, %3$s t WHERE (%1$s) IS NOT NULL AND (%4$s)) s
    WHERE ($2 IS NULL OR rank <= $2) AND ($3 IS NULL OR distance <= $3)$f$, expr, op, tbl, pred)
  USING q, k, radius;
END $$;

-- fz_got against fz_want: rows per query, ranks 1..n, no row twice, the
-- distance at each rank. NULL when they agree.
CREATE FUNCTION fuzz_compare() RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  r record;
BEGIN
  SELECT INTO r coalesce(g.query, w.query) AS query, coalesce(g.n, 0) AS got, coalesce(w.n, 0) AS want
    FROM (SELECT query, count(*) AS n FROM fz_got GROUP BY 1) g
    FULL JOIN (SELECT query, count(*) AS n FROM fz_want GROUP BY 1) w ON g.query = w.query
   WHERE g.n IS DISTINCT FROM w.n ORDER BY 1 LIMIT 1;
  IF FOUND THEN
    RETURN format('WRONG: query %s: %s rows, the sequential scan %s', r.query, r.got, r.want);
  END IF;
  SELECT INTO r query, rank FROM (
      SELECT query, rank, row_number() OVER (PARTITION BY query ORDER BY rank) AS pos FROM fz_got) s
   WHERE rank <> pos LIMIT 1;
  IF FOUND THEN
    RETURN format('WRONG: query %s: ranks are not 1..n (rank %s)', r.query, r.rank);
  END IF;
  SELECT INTO r query, tid FROM fz_got GROUP BY 1, 2 HAVING count(*) > 1 LIMIT 1;
  IF FOUND THEN
    RETURN format('WRONG: query %s: row %s returned twice', r.query, r.tid);
  END IF;
  SELECT INTO r g.query, g.rank, g.distance AS got, w.distance AS want
    FROM fz_got g JOIN fz_want w ON g.query = w.query AND g.rank = w.rank
   WHERE NOT (g.distance = w.distance OR abs(g.distance - w.distance) <= 1e-6 * greatest(1, abs(w.distance)))
   ORDER BY 1, 2 LIMIT 1;
  IF FOUND THEN
    RETURN format('WRONG: query %s rank %s: distance %s, the sequential scan %s', r.query, r.rank, r.got, r.want);
  END IF;
  RETURN NULL;
END $$;

-- Checks got_sql's rows (query, rank, tid, distance) against the exact answer.
CREATE FUNCTION fuzz_check(got_sql text, tbl regclass, expr text, pred text, op text, q real[], k int,
                           radius float8 DEFAULT NULL) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  r record;
  bad text;
BEGIN
  EXECUTE 'CREATE TEMP TABLE fz_got ON COMMIT DROP AS SELECT query::text, rank::int8, tid, distance FROM (' || got_sql || ') s';
  BEGIN
    PERFORM fuzz_want(tbl, expr, pred, op, q, k, radius);
  EXCEPTION WHEN OTHERS THEN
    RETURN 'WRONG: rows came back, but the sequential scan raises ' || SQLSTATE || ': ' || SQLERRM;
  END;
  bad := fuzz_compare();
  IF bad IS NOT NULL THEN
    RETURN bad;
  END IF;
  -- Each row returned is a row of the relation, with its true distance.
  EXECUTE format($f$SELECT g.query, g.rank, g.tid, g.distance, s.truth FROM fz_got g
      LEFT JOIN (SELECT q.n::text AS query, t.ctid AS tid, (%1$s) %2$s q.qv AS truth
                 FROM fuzz_queries($1) q, %3$s t WHERE (%1$s) IS NOT NULL AND (%4$s)) s
        ON s.query = g.query AND s.tid = g.tid
      WHERE NOT (g.distance = s.truth OR abs(g.distance - s.truth) <= 1e-6 * greatest(1, abs(s.truth)))
         OR s.tid IS NULL LIMIT 1$f$, expr, op, tbl, pred) INTO r USING q;
  IF r.tid IS NOT NULL THEN
    RETURN format('WRONG: query %s rank %s: row %s at distance %s, its distance is %s',
                  r.query, r.rank, r.tid, r.distance, coalesce(r.truth::text, '(not a row of the index)'));
  END IF;
  RETURN 'ok';
END $$;

-- The k-NN graph against the exact one: for every row of the index (vector
-- not NULL, predicate true), its k nearest other rows.
CREATE FUNCTION fuzz_check_graph(got_sql text, tbl regclass, expr text, pred text, op text, k int)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  r record;
  bad text;
BEGIN
  EXECUTE 'CREATE TEMP TABLE fz_got ON COMMIT DROP AS SELECT src::text AS query, rank::int8, dst AS tid, distance FROM ('
          || got_sql || ') s';
  EXECUTE format($f$CREATE TEMP TABLE fz_all ON COMMIT DROP AS
      SELECT a.ctid::text AS query, b.ctid AS tid, (%1$s) %2$s (%3$s) AS distance
      FROM %4$s a, %4$s b
      WHERE a.ctid <> b.ctid AND (%1$s) IS NOT NULL AND (%3$s) IS NOT NULL AND (%5$s) AND (%6$s)$f$,
      replace(expr, 'v', 'a.v'), op, replace(expr, 'v', 'b.v'), tbl,
      replace(pred, 'id', 'a.id'), replace(pred, 'id', 'b.id'));
  -- Rows without any neighbour are still sources: a one-row index has no edges.
  CREATE TEMP TABLE fz_want ON COMMIT DROP AS SELECT query, rank, tid, distance FROM (
      SELECT query, tid, distance, row_number() OVER (PARTITION BY query ORDER BY distance) AS rank FROM fz_all) s
    WHERE rank <= k;
  bad := fuzz_compare();
  IF bad IS NOT NULL THEN
    RETURN bad;
  END IF;
  SELECT INTO r g.query, g.tid, g.distance, a.distance AS truth FROM fz_got g
    LEFT JOIN fz_all a ON a.query = g.query AND a.tid = g.tid
   WHERE NOT (g.distance = a.distance OR abs(g.distance - a.distance) <= 1e-6 * greatest(1, abs(a.distance)))
      OR a.tid IS NULL LIMIT 1;
  IF FOUND THEN
    RETURN format('WRONG: src %s: dst %s at distance %s, its distance is %s',
                  r.query, r.tid, r.distance, coalesce(r.truth::text, '(not a row of the index)'));
  END IF;
  RETURN 'ok';
END $$;

-- An index scan (ORDER BY expr op q LIMIT lim on the index idx) against the
-- sequential scan. Rows whose vector is NULL are not in the index: the
-- answer leaves them out.
CREATE FUNCTION fuzz_check_scan(idx text, tbl regclass, expr text, pred text, op text, q real[], lim int)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  -- A NULL constant would be folded into ORDER BY NULL, which needs no
  -- index: a NULL query reaches the index as a parameter instead.
  key text := CASE WHEN q IS NULL THEN '(SELECT $1)' ELSE '$1' END;
  scan text := format('SELECT ctid, (%1$s) %2$s %5$s AS d FROM %3$s WHERE %4$s ORDER BY (%1$s) %2$s %5$s LIMIT $2',
                      expr, op, tbl, pred, key);
  plan text := '';
  line text;
  bad text;
  n int8;
  got int8;
BEGIN
  SET LOCAL enable_seqscan = off;
  SET LOCAL enable_bitmapscan = off;
  FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) ' || scan USING q, lim LOOP
    plan := plan || line || ' ';
  END LOOP;
  IF lim = 0 THEN
    EXECUTE 'SELECT count(*) FROM (' || scan || ') s' INTO got USING q, lim;
    RETURN CASE WHEN got = 0 THEN 'ok' ELSE 'WRONG: ' || got || ' rows for LIMIT 0' END;
  END IF;
  IF position('Index Scan using ' || idx in plan) = 0 THEN
    RETURN 'WRONG: not an index scan of ' || idx || ': ' || plan;
  END IF;
  EXECUTE 'CREATE TEMP TABLE fz_got ON COMMIT DROP AS SELECT ''1''::text AS query, rank, tid, distance FROM unnest('
          || '(SELECT array_agg(ctid) FROM (' || scan || ') s), (SELECT array_agg(d) FROM (' || scan || ') s))'
          || ' WITH ORDINALITY AS u(tid, distance, rank)' USING q, lim;
  -- A NULL query orders nothing: any lim rows of the index will do.
  IF q IS NULL THEN
    EXECUTE format('SELECT count(*) FROM %s WHERE (%s) IS NOT NULL AND (%s)', tbl, expr, pred) INTO n;
    SELECT count(*) INTO got FROM fz_got;
    RETURN CASE WHEN got = least(lim, n) THEN 'ok'
                ELSE format('WRONG: %s rows for a NULL query, the index has %s', got, n) END;
  END IF;
  SET LOCAL enable_seqscan = on;
  SET LOCAL enable_indexscan = off;
  BEGIN
    PERFORM fuzz_want(tbl, expr, pred, op, q, lim, NULL);
  EXCEPTION WHEN OTHERS THEN
    RETURN 'WRONG: rows came back, but the sequential scan raises ' || SQLSTATE || ': ' || SQLERRM;
  END;
  bad := fuzz_compare();
  IF bad IS NOT NULL THEN
    RETURN bad;
  END IF;
  RETURN 'ok';
END $$;

-- An operator's value against the formula computed in SQL (float8
-- throughout; cosine of a zero vector is NaN).
CREATE FUNCTION fuzz_check_op(a real[], b real[], op text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
  got float8;
  want float8;
  dot float8;
  na float8;
  nb float8;
  l2 float8;
BEGIN
  EXECUTE format('SELECT $1 %s $2', op) INTO got USING a, b;
  IF a IS NULL OR b IS NULL THEN
    RETURN CASE WHEN got IS NULL THEN 'ok' ELSE 'WRONG: ' || got || ' from a NULL operand' END;
  END IF;
  SELECT sum(x::float8 * y), sum(x::float8 * x), sum(y::float8 * y), sum((x::float8 - y) * (x::float8 - y))
    INTO dot, na, nb, l2 FROM unnest(a, b) AS u(x, y);
  want := CASE op WHEN '<->' THEN sqrt(l2) WHEN '<#>' THEN -dot
                  ELSE CASE WHEN na = 0 OR nb = 0 THEN 'NaN' ELSE 1 - dot / (sqrt(na) * sqrt(nb)) END END;
  IF got = want OR abs(got - want) <= 1e-6 * greatest(1, abs(want)) THEN
    RETURN 'ok';
  END IF;
  RETURN format('WRONG: %s, the formula gives %s', got, want);
END $$;
});

# ---------------------------------------------------------------- domains
# A value of an argument: its SQL, a short name for the test's name, and,
# when it is bad, the SQLSTATEs (or classes) an error may carry. todo: a
# known defect that this value triggers.

# Vectors and matrices for an index or column of $dim dimensions. ndim and
# len (the vector length, or row length of a matrix) decide what a context
# accepts.
sub vec_literal
{
	my @x = @_;
	return "'{" . join(',', @x) . "}'::real[]";
}

sub rand_vec
{
	my ($dim) = @_;
	return map { sprintf('%.4f', rand() * 2 - 1) } 1 .. $dim;
}

sub queries_for
{
	my ($dim) = @_;
	my @v = rand_vec($dim);
	my @m = map { '{' . join(',', rand_vec($dim)) . '}' } 1 .. 3;
	# About 20000 elements as a matrix of valid rows.
	my $big_rows = int((20000 + $dim - 1) / $dim);
	return (
		{ name => 'vector', sql => vec_literal(@v), ndim => 1, len => $dim },
		{ name => 'zero', sql => vec_literal((0) x $dim), ndim => 1, len => $dim },
		{ name => 'duplicate-row', sql => vec_literal((0.5) x $dim), ndim => 1, len => $dim },
		{ name => 'lower-bound-0', sql => "'[0:" . ($dim - 1) . "]={" . join(',', @v) . "}'::real[]", ndim => 1, len => $dim },
		{ name => 'matrix-3', sql => "'{" . join(',', @m) . "}'::real[]", ndim => 2, len => $dim },
		{
			name => "matrix-$big_rows",
			sql => "(SELECT array_agg(ARRAY(SELECT ((g * 7 + i) % 11) / 10.0 - 0.5 FROM generate_series(1, $dim) i)::real[]) FROM generate_series(1, $big_rows) g)",
			ndim => 2,
			len => $dim,
			heavy => 1
		},
		{ name => 'one-more-dim', sql => vec_literal(@v, 1), ndim => 1, len => $dim + 1 },
		{ name => 'one-element', sql => vec_literal(1), ndim => 1, len => 1 },
		{ name => 'vector-20000', sql => q{(SELECT array_agg((i % 7)::real) FROM generate_series(1, 20000) i)}, ndim => 1, len => 20000 },
		{ name => 'empty', sql => q{'{}'::real[]}, err => ['2202E'] },
		{ name => 'null-element', sql => vec_literal(@v[0 .. $dim - 2], 'NULL'), err => ['22004'] },
		{ name => 'nan', sql => vec_literal('NaN', @v[1 .. $dim - 1]), err => ['22000'] },
		{ name => 'infinity', sql => vec_literal(@v[0 .. $dim - 2], 'Infinity'), err => ['22000'] },
		{ name => '-infinity', sql => vec_literal('-Infinity', @v[1 .. $dim - 1]), err => ['22000'] },
		{ name => '3-d', sql => "'{{{" . join(',', @v) . "}}}'::real[]", err => ['2202E'] },
		{ name => 'matrix-null-element', sql => "'{{" . join(',', @v) . "},{" . join(',', @v[0 .. $dim - 2], 'NULL') . "}}'::real[]", err => ['22004', '2202E'] },
		{ name => 'matrix-nan', sql => "'{{" . join(',', @v) . "},{" . join(',', 'NaN', @v[1 .. $dim - 1]) . "}}'::real[]", err => ['22000', '2202E'] },
		{ name => 'null', sql => 'NULL::real[]', null => 1 },);
}

# What a query value means in a context: vectors only (range, scans) or
# vectors and matrices (batch, exact), against $dim dimensions. Returns the
# value with err filled in when the context refuses it. A mismatch against
# an index may also hit its dimension limit (54000).
sub query_in
{
	my ($q, $dim, $matrix_ok, $limit_ok) = @_;
	return $q if $q->{err} || $q->{null};
	my %c = %$q;
	my @err;
	push @err, '2202E' if $q->{ndim} == 2 && !$matrix_ok;
	push @err, '22000', ($limit_ok ? ('54000') : ()) if $q->{len} != $dim;
	$c{err} = \@err if @err;
	return \%c;
}

# gpu_ivfpq indexes: their table, vector expression, predicate, operator.
my %index = (
	t3_l2 => { table => 't3', expr => 'v', pred => 'true', op => '<->', dim => 3 },
	t3_ip => { table => 't3', expr => 'v', pred => 'true', op => '<#>', dim => 3 },
	t3_cos => { table => 't3', expr => 'v', pred => 'true', op => '<=>', dim => 3 },
	t3_part => { table => 't3', expr => 'v', pred => 'id % 2 = 0', op => '<->', dim => 3 },
	t3_expr => { table => 't3', expr => 'v[1:2]', pred => 'true', op => '<->', dim => 2 },
	t4_untrained => { table => 't4', expr => 'v', pred => 'true', op => '<->', dim => 4, untrained => 1 },);

# The index argument: every index above, and relations that are not one.
my @index_args = (
	(map { { name => $_, sql => "'$_'::regclass", idx => $index{$_} } } sort keys %index),
	{ name => 'btree', sql => q{'t3_btree'::regclass}, err => ['42809'] },
	{ name => 'table', sql => q{'t3'::regclass}, err => ['42809'] },
	{ name => 'view', sql => q{'v3'::regclass}, err => ['42809'] },
	{ name => 'sequence', sql => q{'seq1'::regclass}, err => ['42809'] },
	{ name => 'catalog', sql => q{'pg_class'::regclass}, err => ['42809'] },
	{ name => 'no-such-oid', sql => q{'999999'::regclass}, err => ['42'] },
	{ name => 'null', sql => 'NULL::regclass', null => 1 },);

my @k_args = (
	{ name => 'k=1', sql => '1' },
	{ name => 'k=5', sql => '5' },
	{ name => 'k=1000', sql => '1000' },
	{ name => 'k=0', sql => '0', err => ['22023'] },
	{ name => 'k=-1', sql => '-1', err => ['22023'] },
	{ name => 'k=1001', sql => '1001', err => ['22023'] },
	{ name => 'k=max', sql => '2147483647', err => ['22023'] },
	{ name => 'k=min', sql => '(-2147483647 - 1)', err => ['22023'] },
	{ name => 'k=null', sql => 'NULL::int', null => 1 },);

# ---------------------------------------------------------------- cases
# A case: the call's name, the verdict SQL, the SQLSTATEs an error may
# carry (none: the call must succeed), todo.
my @cases;

# The combined expectation of some argument values: NULL anywhere means no
# rows (one NULL for a $scalar function) and no error (the functions are
# STRICT); else any bad value means an error of one of the bad values'
# classes; else a correct result.
sub add_case
{
	my ($name, $args, $call, $verdict_sql, $scalar) = @_;
	my @bad = grep { $_->{err} } @$args;
	my ($todo) = map { $_->{todo} } grep { $_->{todo} } @$args;
	my $sql;
	my @err;
	if (grep { $_->{null} } @$args)
	{
		$sql = $scalar
		  ? "SELECT CASE WHEN count(*) = 1 AND bool_and(s IS NULL) THEN 'ok' ELSE 'WRONG: not one NULL from a NULL argument' END FROM ($call) s"
		  : "SELECT CASE WHEN count(*) = 0 THEN 'ok' ELSE 'WRONG: ' || count(*) || ' rows from a NULL argument' END FROM ($call) s";
	}
	elsif (@bad)
	{
		@err = map { @{ $_->{err} } } @bad;
		# s::text: every column is computed (the planner drops unused ones).
		$sql = "SELECT 'WRONG: ' || count(*) || ' rows instead of an error' FROM ($call) s WHERE s::text IS NOT NULL";
	}
	else
	{
		$sql = $verdict_sql->();
	}
	push @cases, { name => $name, sql => $sql, err => \@err, todo => $todo };
}


# One-at-a-time variations of a valid call, then random combinations.
# $domains: one list of values per argument; $valid: the position of a
# valid value in each; $build: values -> (name, call SQL, verdict SQL sub,
# the values as the call sees them). Heavy values (a 20000-element matrix)
# only vary alone.
sub generate
{
	my ($domains, $valid, $build, @extra) = @_;
	my @combos;
	for my $a (0 .. $#$domains)
	{
		for my $v (0 .. $#{ $domains->[$a] })
		{
			my @pick = @$valid;
			$pick[$a] = $v;
			push @combos, \@pick;
		}
	}
	# Extra valid combinations, by value names.
	for my $names (@extra)
	{
		push @combos, [
			map {
				my $arg = $_;
				my ($v) = grep { $domains->[$arg][$_]{name} eq $names->[$arg] } 0 .. $#{ $domains->[$arg] };
				$v
			} 0 .. $#$names
		];
	}
	my @random;
	for (1 .. $random_cases)
	{
		push @random, [ map { int(rand(scalar @$_)) } @$domains ];
	}
	my %seen;
	for my $pick (@combos, map { [ @$_, 'random' ] } @random)
	{
		my $random = @$pick > @$domains;
		my @idx = @$pick[ 0 .. $#$domains ];
		my $key = join(',', @idx);
		next if $seen{$key}++;
		my @values = map { $domains->[$_][ $idx[$_] ] } 0 .. $#$domains;
		# Random combinations leave out heavy values, and the values of known
		# defects, whose one-at-a-time cases reproduce them.
		next if $random && grep { $_->{heavy} || $_->{todo} } @values;
		my ($name, $call, $verdict, $resolved, $scalar) = $build->(@values);
		add_case($name, $resolved, $call, $verdict, $scalar);
	}
}

sub dq { my ($s) = @_; return '$case$' . $s . '$case$'; }
sub lit { my ($s) = @_; $s =~ s/'/''/g; return "'$s'"; }

# A query value of the same kind for $dim dimensions (the 20000-element
# vector is the same for every dimension).
my %queries_by_dim;
sub query_kind
{
	my ($name, $dim) = @_;
	$queries_by_dim{$dim} //= [ queries_for($dim) ];
	my ($q) = grep { $_->{name} eq $name } @{ $queries_by_dim{$dim} };
	return $q;
}
my @query_args = queries_for(3);

sub index_dim { my ($ix) = @_; return $ix->{idx} ? $ix->{idx}{dim} : 3; }

# -- gpu_ivfpq_knn_batch(index, queries, k)
generate(
	[ \@index_args, \@query_args, \@k_args ],
	[ 0, 0, 1 ],
	sub {
		my ($ix, $q0, $k) = @_;
		my $q = query_in(query_kind($q0->{name}, index_dim($ix)), index_dim($ix), 1, 1);
		my $call = "SELECT query, rank, tid, distance FROM gpu_ivfpq_knn_batch($ix->{sql}, $q->{sql}, $k->{sql})";
		my $i = $ix->{idx};
		return (
			"knn_batch($ix->{name}, $q->{name}, $k->{name})",
			$call,
			sub {
				"SELECT fuzz_check(" . lit($call) . ", '$i->{table}', " . lit($i->{expr}) . ', '
				  . lit($i->{pred}) . ", '$i->{op}', $q->{sql}, $k->{sql})";
			},
			[ $ix, $q, $k ]);
	});

# -- gpu_ivfpq_knn_graph(index, k)
generate(
	[ \@index_args, \@k_args ],
	[ 0, 1 ],
	sub {
		my ($ix, $k) = @_;
		my $call = "SELECT src, rank, dst, distance FROM gpu_ivfpq_knn_graph($ix->{sql}, $k->{sql})";
		my $i = $ix->{idx};
		return (
			"knn_graph($ix->{name}, $k->{name})",
			$call,
			sub {
				"SELECT fuzz_check_graph(" . lit($call) . ", '$i->{table}', " . lit($i->{expr}) . ', '
				  . lit($i->{pred}) . ", '$i->{op}', $k->{sql})";
			},
			[ $ix, $k ]);
	});

# -- gpu_ivfpq_exact_knn(tbl, col, queries, k, metric)
my @table_args = (
	{ name => 't3', sql => q{'t3'::regclass}, table => 't3', dim => 3 },
	{ name => 't4', sql => q{'t4'::regclass}, table => 't4', dim => 4 },
	{ name => 'matview', sql => q{'mv3'::regclass}, table => 'mv3', dim => 3 },
	{ name => 'partition', sql => q{'part1'::regclass}, table => 'part1', dim => 3 },
	{ name => '20000-d', sql => q{'tbig'::regclass}, table => 'tbig', dim => 20000 },
	{ name => 'nan-rows', sql => q{'tnan'::regclass}, err => ['22000'] },
	{ name => 'null-element-rows', sql => q{'tnullelem'::regclass}, err => [ '22004', '22000' ] },
	{ name => '2-d-rows', sql => q{'tmulti'::regclass}, err => [ '2202E', '22000' ] },
	{ name => 'mixed-dims', sql => q{'tmixed'::regclass}, err => ['22000'] },
	{ name => 'view', sql => q{'v3'::regclass}, err => ['42809'] },
	{ name => 'partitioned', sql => q{'part'::regclass}, err => ['42809'] },
	{ name => 'foreign', sql => q{'ft3'::regclass}, err => ['42809'] },
	{ name => 'index', sql => q{'t3_l2'::regclass}, err => ['42809'] },
	{ name => 'sequence', sql => q{'seq1'::regclass}, err => ['42'] },
	{ name => 'catalog', sql => q{'pg_class'::regclass}, err => ['42'] },
	{ name => 'no-such-oid', sql => q{'999999'::regclass}, err => ['42'] },
	{ name => 'null', sql => 'NULL::regclass', null => 1 },);
my @col_args = (
	{ name => 'v', sql => q{'v'} },
	{ name => 'int-column', sql => q{'id'}, err => [ '42804', '42703' ] },
	{ name => 'text-column', sql => q{'label'}, err => [ '42804', '42703' ] },
	{ name => 'no-such-column', sql => q{'nosuch'}, err => ['42703'] },
	{ name => 'system-column', sql => q{'ctid'}, err => ['42703'] },
	{ name => 'empty-name', sql => q{''}, err => ['42703'] },
	{ name => 'upper-case', sql => q{'V'}, err => ['42703'] },
	{ name => 'null', sql => 'NULL::name', null => 1 },);
my @metric_args = (
	{ name => 'l2', sql => q{'l2'}, op => '<->' },
	{ name => 'ip', sql => q{'ip'}, op => '<#>' },
	{ name => 'cosine', sql => q{'cosine'}, op => '<=>' },
	{ name => 'L2', sql => q{'L2'}, err => ['22023'] },
	{ name => 'manhattan', sql => q{'manhattan'}, err => ['22023'] },
	{ name => 'empty-metric', sql => q{''}, err => ['22023'] },
	{ name => 'trailing-space', sql => q{'l2 '}, err => ['22023'] },
	{ name => 'null', sql => 'NULL::text', null => 1 },);
generate(
	[ \@table_args, \@col_args, \@query_args, \@k_args, \@metric_args ],
	[ 0, 0, 0, 1, 0 ],
	sub {
		my ($t, $c, $q0, $k, $m) = @_;
		my $dim = $t->{dim} // 3;
		my $q = query_in($dim == 20000 ? $q0 : query_kind($q0->{name}, $dim), $dim, 1, 0);
		my $call = "SELECT query, rank, tid, distance FROM gpu_ivfpq_exact_knn($t->{sql}, $c->{sql}, $q->{sql}, $k->{sql}, $m->{sql})";
		return (
			"exact_knn($t->{name}, $c->{name}, $q->{name}, $k->{name}, $m->{name})",
			$call,
			sub {
				"SELECT fuzz_check(" . lit($call) . ", '$t->{table}', 'v', 'true', '$m->{op}', $q->{sql}, $k->{sql})";
			},
			[ $t, $c, $q, $k, $m ]);
	},
	# 20000 dimensions, each metric.
	map { [ '20000-d', 'v', 'vector-20000', 'k=5', $_ ] } qw(l2 ip cosine));

# -- gpu_ivfpq_range(index, query, radius, max_rows)
my @radius_args = (
	{ name => 'r=0.5', sql => '0.5' },
	{ name => 'r=0', sql => '0' },
	{ name => 'r=1e300', sql => '1e300' },
	{ name => 'r=inf', sql => q{'Infinity'::float8} },
	{ name => 'r=-inf', sql => q{'-Infinity'::float8}, negative => 1 },
	{ name => 'r=-0.5', sql => '-0.5', negative => 1 },
	{ name => 'r=nan', sql => q{'NaN'::float8}, err => ['22023'] },
	{ name => 'r=null', sql => 'NULL::float8', null => 1 },);
my @max_rows_args = (
	{ name => 'max=0', sql => '0', k => 'NULL' },
	{ name => 'max=default', sql => undef, k => 'NULL' },
	{ name => 'max=1', sql => '1', k => 1 },
	{ name => 'max=5', sql => '5', k => 5 },
	{ name => 'max=1000', sql => '1000', k => 1000 },
	{ name => 'max=max', sql => '2147483647', k => 2147483647 },
	{ name => 'max=-1', sql => '-1', err => ['22023'] },
	{ name => 'max=null', sql => 'NULL::int', null => 1 },);
generate(
	[ \@index_args, \@query_args, \@radius_args, \@max_rows_args ],
	[ 0, 0, 0, 0 ],
	sub {
		my ($ix, $q0, $r0, $mr) = @_;
		my $q = query_in(query_kind($q0->{name}, index_dim($ix)), index_dim($ix), 0, 0);
		# Negative radii are for inner products only.
		my $r = $r0;
		$r = { %$r0, err => ['22023'] } if $r0->{negative} && $ix->{idx} && $ix->{idx}{op} ne '<#>';
		my $args = "$ix->{sql}, $q->{sql}, $r->{sql}" . (defined $mr->{sql} ? ", $mr->{sql}" : '');
		my $call = "SELECT 1 AS query, rank, tid, distance FROM gpu_ivfpq_range($args) WITH ORDINALITY AS r(tid, distance, rank)";
		my $i = $ix->{idx};
		return (
			"range($ix->{name}, $q->{name}, $r->{name}, $mr->{name})",
			$call,
			sub {
				"SELECT fuzz_check(" . lit($call) . ", '$i->{table}', " . lit($i->{expr}) . ', '
				  . lit($i->{pred}) . ", '$i->{op}', $q->{sql}, $mr->{k}, $r->{sql})";
			},
			[ $ix, $q, $r, $mr ]);
	});

# -- gpu_ivfpq_prewarm(index): the index's entries; an untrained index
# cannot be mirrored. A NULL argument gives NULL.
for my $ix (@index_args)
{
	my $i = $ix->{idx};
	my $v = $i && $i->{untrained} ? { %$ix, err => ['55000'] } : $ix;
	my $call = "SELECT gpu_ivfpq_prewarm($ix->{sql}) AS entries";
	add_case(
		"prewarm($ix->{name})",
		[$v], $call,
		sub {
			"SELECT CASE WHEN e = n THEN 'ok' ELSE 'WRONG: ' || e || ' entries, the index has ' || n || ' rows' END"
			  . " FROM ($call) p(e), (SELECT count(*) FROM $i->{table} WHERE ($i->{expr}) IS NOT NULL AND ($i->{pred})) c(n)";
		},
		1);
}

# -- gpu_ivfpq_check(index, heapallindexed): the fixture's indexes are sound.
my @heapallindexed_args = (
	{ name => 'heapallindexed', sql => 'true' },
	{ name => 'lists-only', sql => 'false' },
	{ name => 'default', sql => undef },
	{ name => 'null', sql => 'NULL::boolean', null => 1 },);
generate(
	[ \@index_args, \@heapallindexed_args ],
	[ 0, 0 ],
	sub {
		my ($ix, $h) = @_;
		my $call = "SELECT gpu_ivfpq_check($ix->{sql}" . (defined $h->{sql} ? ", $h->{sql})" : ')') . ' AS c';
		return ("check($ix->{name}, $h->{name})", $call, sub { "SELECT 'ok' FROM ($call) s" }, [ $ix, $h ], 1);
	});

# -- the operators on two vectors: their value equals the formula's. A
# NULL operand gives NULL, whatever the other one is.
sub operand_errors
{
	my ($x) = @_;
	return @{ $x->{err} } if $x->{err};
	return ('2202E') if $x->{ndim} != 1;
	return ();
}
my @operand_args = grep { !$_->{heavy} } @query_args;
for my $op ('<->', '<#>', '<=>')
{
	generate(
		[ \@operand_args, \@operand_args ],
		[ 0, 0 ],
		sub {
			my ($a, $b) = @_;
			my @err;
			if (!$a->{null} && !$b->{null})
			{
				@err = (operand_errors($a), operand_errors($b));
				push @err, '22000' if !@err && $a->{len} != $b->{len};
			}
			return (
				"$a->{name} $op $b->{name}",
				"SELECT $a->{sql} $op $b->{sql} AS d",
				sub { "SELECT fuzz_check_op($a->{sql}, $b->{sql}, '$op')" },
				[ { name => 'operands', (@err ? (err => \@err) : ()) } ]);
		},
		[ 'vector-20000', 'vector-20000' ]);
}

# -- index scans: ORDER BY expr <op> query LIMIT n through each index.
my @limit_args = (
	{ name => 'limit=1', sql => '1' },
	{ name => 'limit=10', sql => '10' },
	{ name => 'limit=0', sql => '0' },
	{ name => 'limit=1000', sql => '1000' },
	{ name => 'limit=1001', sql => '1001' },);
my @scan_index_args = map { { name => $_, idx => $index{$_} } } sort keys %index;
generate(
	[ \@scan_index_args, [ grep { !$_->{heavy} } @query_args ], \@limit_args ],
	[ 0, 0, 1 ],
	sub {
		my ($ix, $q0, $lim) = @_;
		my $i = $ix->{idx};
		my $q = query_in(query_kind($q0->{name}, $i->{dim}), $i->{dim}, 0, 0);
		# The scan with a NULL query returns rows in no order: checked, not
		# skipped. LIMIT 0 reads no row: no error is due, whatever the query.
		$q = { %$q, null => 0 } if $q->{null};
		$q = { %$q, err => undef } if $lim->{sql} eq '0';
		my $sql = "SELECT fuzz_check_scan('$ix->{name}', '$i->{table}', " . lit($i->{expr}) . ', '
		  . lit($i->{pred}) . ", '$i->{op}', $q->{sql}, $lim->{sql})";
		return ("scan($ix->{name}, $q->{name}, $lim->{name})", $sql, sub { $sql }, [ $ix, $q, $lim ]);
	});

# ---------------------------------------------------------------- run
# All cases through one psql session; a case that ends the session (a
# crash) is recorded and the run goes on with the next one once the server
# is back.
# Every list is probed and 1000 candidates (more than a table's rows) are
# re-ranked, so the approximate searches are exact.
sub run_cases
{
	my ($list, $device) = @_;
	my @verdict;
	my $next = 0;
	while ($next < @$list)
	{
		my $script = qq{SET statement_timeout = '120s'; SET client_min_messages = warning;
SET gpu_ivfpq.probes = 65536; SET gpu_ivfpq.rerank = 1000; SET gpu_ivfpq.device = $device;
};
		$script .= "SELECT 'case $_|' || fuzz_case(" . dq($list->[$_]{sql}) . ");\n" for $next .. $#$list;
		my ($rc, $out, $err) = $node->psql('fuzz', $script);
		while ($out =~ /^case (\d+)\|(.*)$/mg)
		{
			$verdict[$1] = $2;
		}
		my $i = $next;
		$i++ while $i < @$list && defined $verdict[$i];
		last if $i == @$list;
		$err =~ s/\s+/ /g;
		$verdict[$i] = "CRASH: $err";
		$node->poll_query_until('fuzz', 'SELECT true')
		  or BAIL_OUT('the server did not come back after a crash');
		$next = $i + 1;
	}
	return @verdict;
}

sub judge
{
	my ($case, $verdict, $device) = @_;
	my $good;
	if ($verdict =~ /^ERROR (\w{5}): /)
	{
		my $state = $1;
		$good = $state ne 'XX000' && grep { $state =~ /^\Q$_\E/ } @{ $case->{err} };
	}
	else
	{
		$good = $verdict eq 'ok';
	}
	ok($good, "$case->{name} [$device]: $verdict");
	diag("case SQL (seed $seed): $case->{sql}") unless $good;
}

# Mirror the trained indexes first, so the service serves the functions
# (once its GPU process has opened the device: a CUDA context takes seconds).
$node->poll_query_until('fuzz', q{SELECT state LIKE 'running (GPU%' FROM gpu_ivfpq_status})
  or die 'the service did not start serving';
$node->safe_psql('fuzz', "SELECT gpu_ivfpq_prewarm(i) FROM unnest('{t3_l2,t3_ip,t3_cos,t3_part,t3_expr}'::regclass[]) i");

my @main = grep { !$_->{todo} } @cases;
my @todo = grep { $_->{todo} } @cases;
note(sprintf('seed %d: %d cases, %d of them known defects (TODO)', $seed, scalar @cases, scalar @todo));
my $log_start = -s $node->logfile;
# Through the service (device auto: its GPU, or the CPU emulation of one),
# then on the CPU engine.
my $served = $node->safe_psql('fuzz', 'SELECT queries_gpu FROM gpu_ivfpq_status');
for my $device ('auto', 'cpu')
{
	my @verdicts = run_cases(\@main, $device);
	judge($main[$_], $verdicts[$_] // 'no verdict', $device) for 0 .. $#main;
	my $errors = grep { defined && /^ERROR/ } @verdicts;
	note(sprintf('device %s: %d cases raised a clean error, %d returned rows', $device, $errors, @main - $errors));
	cmp_ok($node->safe_psql('fuzz', 'SELECT queries_gpu FROM gpu_ivfpq_status'), '>', $served, 'the service served searches')
	  if $device eq 'auto';
}

my $log = slurp_file($node->logfile, $log_start);
unlike($log, qr/terminated by signal|was terminated|PANIC|TRAP:/, 'no server process crashed');
is($node->safe_psql('fuzz', 'SELECT count(*) FROM t3'), '300', 'the server answers');
is($node->safe_psql('fuzz', 'SELECT service_starts FROM gpu_ivfpq_status'), '1', 'the service never restarted');

# The checkers themselves notice wrong answers: the right rows under another
# operator, a row short, distances off by 0.001, a graph with k - 1 edges.
my $batch = q{SELECT query, rank, tid, distance FROM gpu_ivfpq_knn_batch(''t3_l2'', ''{0.1,0.2,0.3}'', 5)};
for my $t (
	[ 'another operator', "SELECT fuzz_check('$batch', 't3', 'v', 'true', '<#>', '{0.1,0.2,0.3}', 5)" ],
	[ 'a row short', "SELECT fuzz_check('$batch', 't3', 'v', 'true', '<->', '{0.1,0.2,0.3}', 6)" ],
	[
		'distances off',
		"SELECT fuzz_check('SELECT query, rank, tid, distance + 0.001 AS distance FROM ($batch) s', 't3', 'v', 'true', '<->', '{0.1,0.2,0.3}', 5)"
	],
	[
		'graph one edge short',
		q{SELECT fuzz_check_graph('SELECT src, rank, dst, distance FROM gpu_ivfpq_knn_graph(''t3_l2'', 3)', 't3', 'v', 'true', '<->', 4)}
	])
{
	like($node->safe_psql('fuzz', "SET gpu_ivfpq.probes = 65536; SET gpu_ivfpq.rerank = 1000; $t->[1]"),
		qr/^WRONG: /, "the checker notices $t->[0]");
}

# Known defects: TODO until fixed, then their values lose the todo mark.
my @todo_verdicts = run_cases(\@todo, 'auto');
for my $i (0 .. $#todo)
{
	local $TODO = $todo[$i]{todo};
	judge($todo[$i], $todo_verdicts[$i] // 'no verdict', 'auto');
}
ok($node->poll_query_until('fuzz', 'SELECT true'), 'the server answers after the known defects');

$node->stop;
done_testing();
