-- Index scans: plans, exact results for the three operator classes with
-- exact settings, the iterative continuation for filtered queries and its
-- bound, NULL queries, prepared statements, rescans (LATERAL), cursors.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
RESET client_min_messages;

\i test/sql/knn_function.inc
\i test/sql/explain_function.inc
-- 500 rows of 16 dimensions in [0, 10), and 5 query vectors (deterministic;
-- the distances of a query to the rows are all different).
SELECT setseed(0.42);
CREATE TABLE s (id int, v real[]);
INSERT INTO s
SELECT i, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 16) WHERE i > 0)
FROM generate_series(1, 500) i;
CREATE TABLE q (qid int, qv real[]);
INSERT INTO q
SELECT i, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 16) WHERE i > 0)
FROM generate_series(1, 5) i;
SELECT count(DISTINCT s.v <-> q.qv) = 2500 AS l2_distinct,
       count(DISTINCT s.v <#> q.qv) = 2500 AS ip_distinct,
       count(DISTINCT s.v <=> q.qv) = 2500 AS cos_distinct
FROM s, q;
-- The query vector of the single-query tests.
SELECT qv AS q1 FROM q WHERE qid = 1 \gset

CREATE INDEX s_l2 ON s USING gpu_ivfpq (v) WITH (lists = 8, m = 4);
ANALYZE s;

--
-- Plans. The table is small, so the planner prefers a sequential scan on
-- cost; enable_seqscan = off shows where the index can be used.
--
SET enable_seqscan = off;
-- ORDER BY <op> LIMIT: the index, either operand order.
SELECT * FROM explain_plan($q$SELECT id FROM s ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM s ORDER BY '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' <-> v LIMIT 5$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id, v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' AS d FROM s ORDER BY d LIMIT 5$q$) AS "QUERY PLAN";
-- ... with a filter on another column.
SELECT * FROM explain_plan($q$SELECT id FROM s WHERE id % 10 = 0 ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5$q$) AS "QUERY PLAN";
-- Never without ORDER BY, nor for a WHERE on the distance, nor for DESC,
-- nor for another operator than the operator class's, nor an expression.
SELECT * FROM explain_plan($q$SELECT id FROM s$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT count(*) FROM s$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM s WHERE v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' < 5$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM s WHERE v = '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}'$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM s ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' DESC LIMIT 5$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM s ORDER BY v <#> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM s ORDER BY (v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}') + 1 LIMIT 5$q$) AS "QUERY PLAN";
-- Properties of the index.
SELECT pg_index_column_has_property('s_l2', 1, 'orderable') AS orderable,
       pg_index_has_property('s_l2', 'index_scan') AS index_scan,
       pg_index_has_property('s_l2', 'bitmap_scan') AS bitmap_scan;
RESET enable_seqscan;

--
-- Exact settings (every list probed, every row re-ranked) give exactly the
-- results of a sequential scan, for each operator class.
--
SET gpu_ivfpq.probes = 8;
SET gpu_ivfpq.rerank = 1000;
-- L2.
SELECT knn(format('SELECT id FROM s ORDER BY v <-> %L LIMIT 10', :'q1'), true) AS l2_index,
       knn(format('SELECT id FROM s ORDER BY v <-> %L LIMIT 10', :'q1'), false) AS l2_seqscan;
SELECT qid,
       knn(format('SELECT id FROM s ORDER BY v <-> %L LIMIT 10', qv), true) =
       knn(format('SELECT id FROM s ORDER BY v <-> %L LIMIT 10', qv), false) AS same_top10,
       knn(format('SELECT id FROM s ORDER BY v <-> %L', qv), true) =
       knn(format('SELECT id FROM s ORDER BY v <-> %L', qv), false) AS same_all
FROM q ORDER BY qid;
-- Inner product.
CREATE INDEX s_ip ON s USING gpu_ivfpq (v real_ip_ops) WITH (lists = 8, m = 4);
SELECT knn(format('SELECT id FROM s ORDER BY v <#> %L LIMIT 10', :'q1'), true) AS ip_index,
       knn(format('SELECT id FROM s ORDER BY v <#> %L LIMIT 10', :'q1'), false) AS ip_seqscan;
SELECT qid,
       knn(format('SELECT id FROM s ORDER BY v <#> %L LIMIT 10', qv), true) =
       knn(format('SELECT id FROM s ORDER BY v <#> %L LIMIT 10', qv), false) AS same_top10,
       knn(format('SELECT id FROM s ORDER BY v <#> %L', qv), true) =
       knn(format('SELECT id FROM s ORDER BY v <#> %L', qv), false) AS same_all
FROM q ORDER BY qid;
-- Cosine.
CREATE INDEX s_cos ON s USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 8, m = 4);
SELECT knn(format('SELECT id FROM s ORDER BY v <=> %L LIMIT 10', :'q1'), true) AS cos_index,
       knn(format('SELECT id FROM s ORDER BY v <=> %L LIMIT 10', :'q1'), false) AS cos_seqscan;
SELECT qid,
       knn(format('SELECT id FROM s ORDER BY v <=> %L LIMIT 10', qv), true) =
       knn(format('SELECT id FROM s ORDER BY v <=> %L LIMIT 10', qv), false) AS same_top10,
       knn(format('SELECT id FROM s ORDER BY v <=> %L', qv), true) =
       knn(format('SELECT id FROM s ORDER BY v <=> %L', qv), false) AS same_all
FROM q ORDER BY qid;
-- Each operator picks the index of its operator class.
SET enable_seqscan = off;
SELECT * FROM explain_plan($q$SELECT id FROM s ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM s ORDER BY v <#> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM s ORDER BY v <=> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5$q$) AS "QUERY PLAN";
RESET enable_seqscan;
DROP INDEX s_ip, s_cos;

-- gpu_ivfpq.table_memory = 0: the ADC lookup tables are computed per probed
-- list at query time instead of from the precomputed term. (A backend
-- caches the model of an index when it first uses it and builds the tables
-- at its first list scan on the CPU, so the setting applies to an index
-- loaded afterwards: here, after a REINDEX, which
-- rebuilds the same index from the same rows.) The approximate results are
-- those of the precomputed tables; the exact ones those of a seq scan.
SET gpu_ivfpq.probes = 8;
SET gpu_ivfpq.rerank = 100;
CREATE TEMP TABLE approx_precomputed AS
SELECT qid, knn(format('SELECT id FROM s ORDER BY v <-> %L LIMIT 10', qv), true) AS ids FROM q;
SET gpu_ivfpq.table_memory = 0;
REINDEX INDEX s_l2;
SELECT qid, knn(format('SELECT id FROM s ORDER BY v <-> %L LIMIT 10', qv), true) = a.ids AS same_approx
FROM q JOIN approx_precomputed a USING (qid) ORDER BY qid;
SET gpu_ivfpq.rerank = 1000;
SELECT qid, knn(format('SELECT id FROM s ORDER BY v <-> %L', qv), true) =
            knn(format('SELECT id FROM s ORDER BY v <-> %L', qv), false) AS same_all
FROM q ORDER BY qid;
RESET gpu_ivfpq.table_memory;
REINDEX INDEX s_l2;
DROP TABLE approx_precomputed;

-- The ORDER BY values the index returns are the exact distances.
SET enable_seqscan = off;
SELECT id, round((v <-> :'q1')::numeric, 9) AS dist FROM s ORDER BY v <-> :'q1' LIMIT 5;
RESET enable_seqscan;
SELECT id, round((v <-> :'q1')::numeric, 9) AS dist FROM s ORDER BY v <-> :'q1' LIMIT 5;

--
-- Filtered queries: when the first round of candidates leaves too few rows
-- after the filter, the scan continues (doubling the probed lists and the
-- candidates) until the LIMIT is met, a round has ranked every entry, or
-- gpu_ivfpq.max_scan_tuples candidates were re-ranked. A round that left
-- entries unranked returns only its nearer half. With gpu_ivfpq.strict_order
-- (the default) rows come back in exact distance order across rounds: a row
-- found only by a wider round that sorts before a row already returned is
-- skipped. Without it such rows are returned late and every row comes back.
--
SET gpu_ivfpq.probes = 1;
SET gpu_ivfpq.rerank = 10;
-- 50 rows pass the filter; 20 are asked for and come back.
SELECT count(*) AS n, count(DISTINCT id) AS n_distinct, bool_and(id % 10 = 0) AS all_match
FROM unnest(knn(format('SELECT id FROM s WHERE id %% 10 = 0 ORDER BY v <-> %L LIMIT 20', :'q1'), true)) id;
SELECT qid, cardinality(knn(format('SELECT id FROM s WHERE id %% 10 = 0 ORDER BY v <-> %L LIMIT 20', qv), true)) AS n
FROM q ORDER BY qid;
-- Exact order across rounds: for every query, filtered and not, the
-- distances of the returned rows never decrease, and no row comes twice.
CREATE FUNCTION in_order(query text, qv real[]) RETURNS bool LANGUAGE sql AS $$
	SELECT coalesce(bool_and(d >= prev), true) AND count(*) = count(DISTINCT id)
	FROM (SELECT id, d, lag(d, 1, '-Infinity') OVER (ORDER BY ord) AS prev
		  FROM unnest(knn(format(query, qv), true)) WITH ORDINALITY AS t(id, ord),
			   LATERAL (SELECT s.v <-> qv AS d FROM s WHERE s.id = t.id) x) y
$$;
SELECT qid, in_order('SELECT id FROM s WHERE id %% 10 = 0 ORDER BY v <-> %L', qv) AS filtered,
       in_order('SELECT id FROM s WHERE id %% 7 = 3 ORDER BY v <-> %L LIMIT 15', qv) AS filtered_limit,
       in_order('SELECT id FROM s ORDER BY v <-> %L', qv) AS unfiltered
FROM q ORDER BY qid;
-- The same check fails without strict order (the quantizer here is coarse:
-- later rounds find many rows nearer than returned ones).
SET gpu_ivfpq.strict_order = off;
SELECT bool_and(in_order('SELECT id FROM s ORDER BY v <-> %L', qv)) AS relaxed_in_order FROM q;
RESET gpu_ivfpq.strict_order;
-- Strict order gives up only rows found late: nearly every row still comes.
SELECT cardinality(knn(format('SELECT id FROM s ORDER BY v <-> %L', :'q1'), true)) BETWEEN 450 AND 500 AS most_rows;
-- A rescan after a round that re-ranked from the heap (the NULL query of
-- the first outer row) returns no row twice.
SET enable_seqscan = off;
SET gpu_ivfpq.rerank = 20;
SELECT bool_and(n = n_distinct) AS no_row_twice, min(n) > 0 AS rows_found
FROM (SELECT x.qid, count(*) AS n, count(DISTINCT r.id) AS n_distinct
	  FROM (SELECT 0 AS qid, NULL::real[] AS qv UNION ALL SELECT qid, qv FROM q) x
	  CROSS JOIN LATERAL (SELECT id FROM s ORDER BY v <-> x.qv LIMIT 300) r
	  GROUP BY x.qid) c;
SET gpu_ivfpq.strict_order = off;
SELECT bool_and(n = n_distinct) AS no_row_twice_relaxed
FROM (SELECT x.qid, count(*) AS n, count(DISTINCT r.id) AS n_distinct
	  FROM (SELECT 0 AS qid, NULL::real[] AS qv UNION ALL SELECT qid, qv FROM q) x
	  CROSS JOIN LATERAL (SELECT id FROM s ORDER BY v <-> x.qv LIMIT 300) r
	  GROUP BY x.qid) c;
RESET gpu_ivfpq.strict_order;
SET gpu_ivfpq.rerank = 10;
RESET enable_seqscan;
-- Without strict order: all 50 when no LIMIT, every row when there is no
-- filter, a single far row is found; a filter nothing passes ends after
-- every entry.
SET gpu_ivfpq.strict_order = off;
SELECT cardinality(knn(format('SELECT id FROM s WHERE id %% 10 = 0 ORDER BY v <-> %L', :'q1'), true)) AS n_filtered,
       cardinality(knn(format('SELECT id FROM s ORDER BY v <-> %L', :'q1'), true)) AS n_all;
SELECT knn(format('SELECT id FROM s WHERE id = 123 ORDER BY v <-> %L', :'q1'), true) AS id_123,
       knn(format('SELECT id FROM s WHERE id < 0 ORDER BY v <-> %L', :'q1'), true) AS none;
RESET gpu_ivfpq.strict_order;
-- With exact settings, the filtered query equals the sequential scan.
SET gpu_ivfpq.probes = 8;
SET gpu_ivfpq.rerank = 1000;
SELECT knn(format('SELECT id FROM s WHERE id %% 10 = 0 ORDER BY v <-> %L LIMIT 20', :'q1'), true) =
       knn(format('SELECT id FROM s WHERE id %% 10 = 0 ORDER BY v <-> %L LIMIT 20', :'q1'), false) AS same_filtered;

--
-- gpu_ivfpq.max_scan_tuples bounds the candidates re-ranked: the first round
-- always re-ranks gpu_ivfpq.rerank candidates, and no further round starts
-- once the bound is reached; the last round returns all its rows. With
-- every list probed, rerank = 10 and max_scan_tuples = 50, rounds re-rank
-- 10, 20, 40 and 80 candidates, the first three return their nearer halves:
-- an unfiltered scan returns at most 80 rows (fewer: rows found late are
-- skipped), then stops.
--
SET gpu_ivfpq.probes = 8;
SET gpu_ivfpq.rerank = 10;
SET gpu_ivfpq.max_scan_tuples = 50;
SELECT cardinality(knn(format('SELECT id FROM s ORDER BY v <-> %L', :'q1'), true)) BETWEEN 60 AND 80 AS n_bounded;
SET gpu_ivfpq.max_scan_tuples = 10;
SELECT cardinality(knn(format('SELECT id FROM s ORDER BY v <-> %L', :'q1'), true)) AS n;
-- A bound below rerank: still the first round.
SET gpu_ivfpq.max_scan_tuples = 1;
SELECT cardinality(knn(format('SELECT id FROM s ORDER BY v <-> %L', :'q1'), true)) AS n;
-- So a filtered query gets at most the matching rows among those 10: fewer
-- than the 20 it asks for (how many depends on the quantizer).
SELECT cardinality(knn(format('SELECT id FROM s WHERE id %% 10 = 0 ORDER BY v <-> %L LIMIT 20', :'q1'), true)) <= 10 AS at_most_10;
-- The default bound (20000) covers this table.
RESET gpu_ivfpq.max_scan_tuples;
SELECT cardinality(knn(format('SELECT id FROM s ORDER BY v <-> %L', :'q1'), true)) BETWEEN 450 AND 500 AS most_rows;

--
-- A NULL query vector: all distances are NULL, so any order is correct;
-- the scan returns every indexed row. (A literal NULL is folded away by the
-- planner; a parameter or a sub-select reaches the index.)
--
SET gpu_ivfpq.probes = 1;
SET gpu_ivfpq.rerank = 10;
SET enable_seqscan = off;
SELECT * FROM explain_plan($q$SELECT id FROM s ORDER BY v <-> NULL LIMIT 5$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM s ORDER BY v <-> (SELECT NULL::real[]) LIMIT 5$q$) AS "QUERY PLAN";
SELECT count(*), count(DISTINCT id), bool_and(d IS NULL) AS all_null
FROM (SELECT id, v <-> (SELECT NULL::real[]) AS d FROM s ORDER BY v <-> (SELECT NULL::real[])) x;
SELECT count(*) FROM (SELECT id FROM s ORDER BY v <-> (SELECT NULL::real[]) LIMIT 5) x;
RESET enable_seqscan;

--
-- Prepared statements: the query vector as a parameter, generic and custom
-- plans, different vectors one after the other.
--
SET gpu_ivfpq.probes = 8;
SET gpu_ivfpq.rerank = 1000;
SET enable_seqscan = off;
PREPARE nearest(real[], int) AS SELECT id FROM s ORDER BY v <-> $1 LIMIT $2;
SET plan_cache_mode = force_generic_plan;
EXPLAIN (COSTS OFF) EXECUTE nearest('{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}', 3);
SELECT qv AS q2 FROM q WHERE qid = 2 \gset
-- The sequential scan's answers, for reference.
SELECT knn(format('SELECT id FROM s ORDER BY v <-> %L LIMIT 5', :'q1'), false) AS q1_top5,
       knn(format('SELECT id FROM s ORDER BY v <-> %L LIMIT 5', :'q2'), false) AS q2_top5;
EXECUTE nearest(:'q1', 5);
EXECUTE nearest(:'q2', 5);
EXECUTE nearest(:'q1', 2);
EXECUTE nearest('{1,2,3}', 5);
SET plan_cache_mode = force_custom_plan;
EXPLAIN (COSTS OFF) EXECUTE nearest('{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}', 3);
EXECUTE nearest(:'q2', 5);
EXECUTE nearest(:'q1', 5);
RESET plan_cache_mode;
DEALLOCATE nearest;
-- A NULL parameter in a generic plan reaches the index: 5 rows, any order.
PREPARE nearest_count(real[]) AS SELECT count(*) FROM (SELECT id FROM s ORDER BY v <-> $1 LIMIT 5) x;
SET plan_cache_mode = force_generic_plan;
EXECUTE nearest_count(NULL);
EXECUTE nearest_count(:'q1');
RESET plan_cache_mode;
DEALLOCATE nearest_count;

--
-- Rescans: for each query row, the 3 nearest rows through LATERAL (the
-- index is rescanned with a new query vector for each outer row).
--
SELECT * FROM explain_plan($q$
SELECT q.qid, x.id FROM q CROSS JOIN LATERAL (SELECT id FROM s ORDER BY s.v <-> q.qv LIMIT 3) x$q$) AS "QUERY PLAN";
CREATE TEMP TABLE lateral_index AS
SELECT q.qid, x.id, x.d FROM q CROSS JOIN LATERAL (SELECT id, v <-> q.qv AS d FROM s ORDER BY s.v <-> q.qv LIMIT 3) x;
RESET enable_seqscan;
SET enable_indexscan = off;
CREATE TEMP TABLE lateral_seqscan AS
SELECT q.qid, x.id, x.d FROM q CROSS JOIN LATERAL (SELECT id, v <-> q.qv AS d FROM s ORDER BY s.v <-> q.qv LIMIT 3) x;
RESET enable_indexscan;
SELECT qid, id, round(d::numeric, 6) AS d FROM lateral_index ORDER BY qid, d;
SELECT count(*) AS differences FROM (
	(SELECT * FROM lateral_index EXCEPT SELECT * FROM lateral_seqscan)
	UNION ALL
	(SELECT * FROM lateral_seqscan EXCEPT SELECT * FROM lateral_index)) x;
-- The same through a correlated sub-select, and with a NULL query row among
-- the others (3 rows for each, in any order for the NULL one).
SET enable_seqscan = off;
INSERT INTO q VALUES (6, NULL);
SELECT qid, cardinality(ARRAY(SELECT id FROM s ORDER BY s.v <-> q.qv LIMIT 3)) AS n,
       ARRAY(SELECT id FROM s ORDER BY s.v <-> q.qv LIMIT 3) =
       ARRAY(SELECT id FROM lateral_seqscan l WHERE l.qid = q.qid ORDER BY d) AS same
FROM q ORDER BY qid;
-- A rescan that stops early (LIMIT 1) then a long one (all rows).
SELECT q.qid, (SELECT id FROM s ORDER BY s.v <-> q.qv LIMIT 1) = (SELECT id FROM lateral_seqscan l WHERE l.qid = q.qid ORDER BY d LIMIT 1) AS same_first,
       (SELECT count(*) FROM (SELECT id FROM s ORDER BY s.v <-> q.qv) x) AS n_all
FROM q WHERE qv IS NOT NULL ORDER BY qid;
DELETE FROM q WHERE qid = 6;
RESET enable_seqscan;

--
-- Cursors: fetching in steps continues the same scan; a scroll cursor
-- (the index scans forward only, so it is materialized) can go back; the
-- cursor's snapshot does not see rows inserted after it was opened.
--
SELECT knn('SELECT id FROM s ORDER BY v <-> ''{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}'' LIMIT 6', false) AS seqscan_top6;
SET enable_seqscan = off;
BEGIN;
DECLARE c CURSOR FOR SELECT id FROM s ORDER BY v <-> '{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}';
FETCH 3 FROM c;
INSERT INTO s VALUES (0, '{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}');
FETCH 3 FROM c;
CLOSE c;
-- A new scan sees the new row (id 0, distance 0).
SELECT id FROM s ORDER BY v <-> '{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}' LIMIT 6;
DECLARE sc SCROLL CURSOR FOR SELECT id FROM s ORDER BY v <-> '{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}';
FETCH 3 FROM sc;
FETCH BACKWARD 2 FROM sc;
FETCH ABSOLUTE 6 FROM sc;
CLOSE sc;
DECLARE c2 CURSOR FOR SELECT id FROM s ORDER BY v <-> '{0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0}';
FETCH 1 FROM c2;
FETCH BACKWARD 1 FROM c2;
ROLLBACK;
RESET enable_seqscan;

--
-- A partitioned table: an index per partition, merged in distance order.
--
CREATE TABLE sp (id int, part int, v real[]) PARTITION BY LIST (part);
CREATE TABLE sp0 PARTITION OF sp FOR VALUES IN (0);
CREATE TABLE sp1 PARTITION OF sp FOR VALUES IN (1);
CREATE TABLE sp2 PARTITION OF sp FOR VALUES IN (2);
INSERT INTO sp SELECT id, id % 3, v FROM s;
CREATE INDEX sp_idx ON sp USING gpu_ivfpq (v) WITH (lists = 4, m = 4);
SET gpu_ivfpq.probes = 4;
SET gpu_ivfpq.rerank = 1000;
SET enable_seqscan = off;
SELECT * FROM explain_plan($q$SELECT id FROM sp ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5$q$) AS "QUERY PLAN";
SELECT * FROM explain_plan($q$SELECT id FROM sp WHERE part = 1 ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5$q$) AS "QUERY PLAN";
RESET enable_seqscan;
SELECT qid, knn(format('SELECT id FROM sp ORDER BY v <-> %L LIMIT 10', qv), true) =
            knn(format('SELECT id FROM s ORDER BY v <-> %L LIMIT 10', qv), false) AS same_top10,
            knn(format('SELECT id FROM sp WHERE part = 2 ORDER BY v <-> %L LIMIT 10', qv), true) =
            knn(format('SELECT id FROM s WHERE id %% 3 = 2 ORDER BY v <-> %L LIMIT 10', qv), false) AS same_top10_part2
FROM q ORDER BY qid;
DROP TABLE sp;

RESET gpu_ivfpq.probes;
RESET gpu_ivfpq.rerank;
-- The planner: with vector copies a re-ranked candidate costs an exact
-- distance, not a table fetch, and list pages are read in chain order. A
-- larger rerank or more probes keep the index, which stays far faster than
-- a sequential scan (an earlier cost model chose the sequential scan here).
SELECT setseed(0.3);
CREATE TABLE plan_t AS SELECT i AS id, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 64) WHERE i > 0) AS v
FROM generate_series(1, 30000) i;
CREATE INDEX plan_t_idx ON plan_t USING gpu_ivfpq (v) WITH (lists = 64, m = 8);
ANALYZE plan_t;
SET gpu_ivfpq.probes = 32;
SET gpu_ivfpq.rerank = 1000;
SELECT * FROM explain_plan($q$SELECT id FROM plan_t ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6,1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 10$q$) AS "QUERY PLAN";
RESET gpu_ivfpq.probes;
RESET gpu_ivfpq.rerank;
DROP TABLE plan_t;

-- An unchanged pgvector-style query uses the index at 384, 768, 1536 and
-- 3072 dimensions (pgvector's cost test: 5000 rows, lists = 5, every list
-- probed). From 768 dimensions on the table's vectors are TOASTed and its
-- pages are few, but a sequential scan detoasts every row (measured 6 to 35
-- times slower than the index): neither the index's vector copies (up to
-- 1536 dimensions) nor the re-rank from the table (3072) may make the index
-- look dearer (an earlier cost model chose the sequential scan from 768 on).
\i test/sql/plan_function.inc
SELECT setseed(0.4);
SET client_min_messages = warning;
SELECT make_cost_tables('cost', 'real[]', 'v');
RESET client_min_messages;
SELECT d AS dimensions, plan_of(format('SELECT id FROM cost_%s ORDER BY v <-> %L::real[] LIMIT 10', d,
	ARRAY(SELECT random()::real FROM generate_series(1, d)))) AS plan
FROM unnest(ARRAY[384, 768, 1536, 3072]) d;
-- Without a LIMIT, returning every row takes the scan's later, wider
-- rounds, each a pass over the lists: a sequential scan and a sort are
-- faster (measured 4 to 8 times) and chosen.
SELECT d AS dimensions, plan_of(format('SELECT id FROM cost_%s ORDER BY v <-> %L::real[]', d,
	ARRAY(SELECT random()::real FROM generate_series(1, d)))) AS plan
FROM unnest(ARRAY[384, 768, 1536, 3072]) d;
DROP TABLE cost_384, cost_768, cost_1536, cost_3072;
-- Not where a sequential scan is faster: a small table, and an untrained
-- index (built on an empty table), which re-ranks every row from the table.
CREATE TABLE cost_small AS SELECT i AS id, ARRAY(SELECT random()::real FROM generate_series(1, 16) WHERE i > 0) AS v
FROM generate_series(1, 100) i;
CREATE INDEX cost_small_idx ON cost_small USING gpu_ivfpq (v) WITH (lists = 5);
CREATE TABLE cost_untrained (id int, v real[]);
CREATE INDEX cost_untrained_idx ON cost_untrained USING gpu_ivfpq (v) WITH (lists = 5);
INSERT INTO cost_untrained SELECT i, ARRAY(SELECT random()::real FROM generate_series(1, 16) WHERE i > 0)
FROM generate_series(1, 5000) i;
ANALYZE cost_small, cost_untrained;
SELECT t AS "table", plan_of(format('SELECT id FROM %I ORDER BY v <-> %L::real[] LIMIT 10', t,
	ARRAY(SELECT random()::real FROM generate_series(1, 16)))) AS plan
FROM unnest(ARRAY['cost_small', 'cost_untrained']) t;
DROP TABLE cost_small, cost_untrained;
DROP FUNCTION plan_of(text), make_cost_tables(text, text, text);

-- Two distances to order by: a scan would follow the first alone (and the
-- executor would not sort again), so the index serves neither.
SET enable_seqscan = off;
SELECT * FROM explain_plan($q$SELECT id FROM s ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}',
	v <-> '{6,5,4,3,2,1,0,9,8,7,6,5,4,3,2,1}' LIMIT 5$q$) AS "QUERY PLAN";
RESET enable_seqscan;

DROP FUNCTION in_order(text, real[]);
DROP TABLE s, q;
DROP FUNCTION knn(text, bool), explain_plan(text);
