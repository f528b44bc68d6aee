-- pgvector's vector and halfvec columns through gpu_ivfpq_pgvector, in a
-- database of their own (its search function overloads make untyped
-- literals ambiguous for the other tests). The same rows are stored as
-- real[], vector and halfvec; the halfvec values also as real[] (hr), since
-- a halfvec holds its values rounded to half precision. Index scans with
-- pgvector's own operators equal those on real[] and, with every list
-- probed, sequential scans; so do the search functions. Needs pgvector: the
-- Makefile runs this test only where it is installed.
SET client_min_messages = warning;
\set test_db :DBNAME
CREATE DATABASE gpu_ivfpq_pgvector;
\c gpu_ivfpq_pgvector
SET client_min_messages = warning;
CREATE EXTENSION vector;
CREATE EXTENSION gpu_ivfpq;
CREATE EXTENSION gpu_ivfpq_pgvector;
\i test/sql/knn_function.inc

CREATE TABLE pv (id int PRIMARY KEY, tenant int, r real[], v vector(6), h halfvec(6), hr real[]);
INSERT INTO pv (id, tenant, r)
SELECT i, i % 5, ARRAY[sin(i), cos(i), sin(i * 0.3), cos(i * 0.7), sin(i * 1.1), cos(i * 1.3)]::real[]
FROM generate_series(1, 3000) i;
UPDATE pv SET v = r::vector, h = r::halfvec;
UPDATE pv SET hr = h::real[];
-- The queries, in each type.
CREATE TABLE pq AS
SELECT i AS q, r, r::vector AS v, r::halfvec AS h, r::halfvec::real[] AS hr
FROM (SELECT i, ARRAY[cos(i), sin(i * 2), 0.5, cos(i * 3), 0.1, sin(i)]::real[] AS r
      FROM generate_series(1, 40) i) s;

-- One index per column and operator class; pgvector's operator class names.
CREATE INDEX pv_r_l2 ON pv USING gpu_ivfpq (r real_l2_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_r_ip ON pv USING gpu_ivfpq (r real_ip_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_r_cos ON pv USING gpu_ivfpq (r real_cosine_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_v_l2 ON pv USING gpu_ivfpq (v vector_l2_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_v_ip ON pv USING gpu_ivfpq (v vector_ip_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_v_cos ON pv USING gpu_ivfpq (v vector_cosine_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_h_l2 ON pv USING gpu_ivfpq (h halfvec_l2_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_h_ip ON pv USING gpu_ivfpq (h halfvec_ip_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_h_cos ON pv USING gpu_ivfpq (h halfvec_cosine_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_hr_l2 ON pv USING gpu_ivfpq (hr real_l2_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_hr_ip ON pv USING gpu_ivfpq (hr real_ip_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_hr_cos ON pv USING gpu_ivfpq (hr real_cosine_ops) WITH (lists = 16, m = 3);
-- The default operator classes are the Euclidean ones, as for real[].
CREATE INDEX pv_v_default ON pv USING gpu_ivfpq (v) WITH (lists = 16, m = 3);
SELECT c.relname, o.opcname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_opclass o ON o.oid = i.indclass[0] WHERE c.relname IN ('pv_v_default', 'pv_h_l2') ORDER BY 1;
DROP INDEX pv_v_default;
ANALYZE pv;
SELECT coalesce(queries_gpu, 0) AS gpu_queries_before FROM gpu_ivfpq_status \gset

-- An unchanged pgvector query uses the index: ORDER BY embedding <-> $1 LIMIT k.
PREPARE nearest(vector) AS SELECT id FROM pv ORDER BY v <-> $1 LIMIT 10;
EXPLAIN (COSTS OFF) EXECUTE nearest('[1,0,0.5,1,0.1,0]');
PREPARE nearest_half(halfvec) AS SELECT id FROM pv ORDER BY h <=> $1 LIMIT 10;
EXPLAIN (COSTS OFF) EXECUTE nearest_half('[1,0,0.5,1,0.1,0]');

-- Index scans: the vector column's answers are the real[] column's, query by
-- query and operator class (same floats, same quantizers, same rows), and
-- the halfvec column's are those of its values as real[].
CREATE FUNCTION same_answers(col text, ref text, op text, qcol text, qref text, k int DEFAULT 10)
RETURNS TABLE (same bigint, queries bigint) LANGUAGE plpgsql AS $$
BEGIN
	RETURN QUERY EXECUTE format($q$
	SELECT count(*) FILTER (WHERE
	         knn(format('SELECT id FROM pv ORDER BY %1$I %3$s %%L::%6$s LIMIT %5$s', pq.%4$I), true) =
	         knn(format('SELECT id FROM pv ORDER BY %2$I %3$s %%L::real[] LIMIT %5$s', pq.%7$I), true)),
	       count(*) FROM pq$q$,
		col, ref, op, qcol, k, CASE qcol WHEN 'v' THEN 'vector' ELSE 'halfvec' END, qref);
END $$;
SELECT 'vector <->' AS class, * FROM same_answers('v', 'r', '<->', 'v', 'r');
SELECT 'vector <#>' AS class, * FROM same_answers('v', 'r', '<#>', 'v', 'r');
SELECT 'vector <=>' AS class, * FROM same_answers('v', 'r', '<=>', 'v', 'r');
SELECT 'halfvec <->' AS class, * FROM same_answers('h', 'hr', '<->', 'h', 'hr');
SELECT 'halfvec <#>' AS class, * FROM same_answers('h', 'hr', '<#>', 'h', 'hr');
SELECT 'halfvec <=>' AS class, * FROM same_answers('h', 'hr', '<=>', 'h', 'hr');
-- Filtered k-NN (a second, integer key column) on a vector column.
CREATE INDEX pv_v_tenant ON pv USING gpu_ivfpq (v, tenant) WITH (lists = 16, m = 3);
CREATE INDEX pv_r_tenant ON pv USING gpu_ivfpq (r, tenant) WITH (lists = 16, m = 3);
SELECT count(*) FILTER (WHERE
         knn(format('SELECT id FROM pv WHERE tenant = 2 ORDER BY v <-> %L::vector LIMIT 10', v), true) =
         knn(format('SELECT id FROM pv WHERE tenant = 2 ORDER BY r <-> %L::real[] LIMIT 10', r), true)) AS same,
       count(*) AS queries
FROM pq;
DROP INDEX pv_v_tenant, pv_r_tenant;

-- Every list probed: the index scan with pgvector's operator equals the
-- sequential scan with the same operator (distances as pgvector computes
-- them, in the select list).
SET gpu_ivfpq.probes = 16;
SET gpu_ivfpq.rerank = 400;
CREATE FUNCTION same_as_seqscan(col text, op text, qcol text) RETURNS TABLE (same bigint, queries bigint)
LANGUAGE plpgsql AS $$
BEGIN
	RETURN QUERY EXECUTE format($q$
	SELECT count(*) FILTER (WHERE
	         knn(format('SELECT id FROM pv ORDER BY %1$I %2$s %%L::%3$s LIMIT 10', pq.%1$I), true) =
	         knn(format('SELECT id FROM pv ORDER BY %1$I %2$s %%L::%3$s LIMIT 10', pq.%1$I), false)),
	       count(*) FROM pq$q$,
		col, op, CASE qcol WHEN 'v' THEN 'vector' ELSE 'halfvec' END);
END $$;
SELECT 'vector <->' AS class, * FROM same_as_seqscan('v', '<->', 'v');
SELECT 'vector <#>' AS class, * FROM same_as_seqscan('v', '<#>', 'v');
SELECT 'vector <=>' AS class, * FROM same_as_seqscan('v', '<=>', 'v');
SELECT 'halfvec <->' AS class, * FROM same_as_seqscan('h', '<->', 'h');
SELECT 'halfvec <#>' AS class, * FROM same_as_seqscan('h', '<#>', 'h');
SELECT 'halfvec <=>' AS class, * FROM same_as_seqscan('h', '<=>', 'h');
-- RaBitQ codes on pgvector's types: the same answers too (the PQ indexes
-- rebuilt as they were afterwards).
DROP INDEX pv_v_l2, pv_h_cos;
CREATE INDEX pv_v_rq ON pv USING gpu_ivfpq (v vector_l2_ops) WITH (lists = 16, codes = rabitq, bits = 3);
CREATE INDEX pv_h_rq ON pv USING gpu_ivfpq (h halfvec_cosine_ops) WITH (lists = 16, codes = rabitq);
SELECT 'vector <->, rabitq' AS class, * FROM same_as_seqscan('v', '<->', 'v');
SELECT 'halfvec <=>, rabitq' AS class, * FROM same_as_seqscan('h', '<=>', 'h');
DROP INDEX pv_v_rq, pv_h_rq;
CREATE INDEX pv_v_l2 ON pv USING gpu_ivfpq (v vector_l2_ops) WITH (lists = 16, m = 3);
CREATE INDEX pv_h_cos ON pv USING gpu_ivfpq (h halfvec_cosine_ops) WITH (lists = 16, m = 3);
-- The values the executor sees are pgvector's: <#> is the negative inner
-- product, <=> one minus the cosine similarity.
SET enable_seqscan = off;
SELECT id, round((v <#> '[1,0,0.5,1,0.1,0]')::numeric, 5) AS neg_ip,
       round((-(SELECT sum(a * b) FROM unnest(r, '{1,0,0.5,1,0.1,0}'::real[]) t(a, b)))::numeric, 5) AS by_hand
FROM pv ORDER BY v <#> '[1,0,0.5,1,0.1,0]' LIMIT 3;
SELECT id, round((h <=> '[1,0,0.5,1,0.1,0]')::numeric, 5) AS cosine_distance
FROM pv ORDER BY h <=> '[1,0,0.5,1,0.1,0]' LIMIT 3;
RESET enable_seqscan;
RESET gpu_ivfpq.probes;
RESET gpu_ivfpq.rerank;
-- gpu_ivfpq ranks by the exact distance in double precision (as for real[],
-- on the CPU and the GPU alike); pgvector's operators sum in single
-- precision. Same sign and meaning, equal to single-precision rounding:
CREATE FUNCTION agrees_with_operator(idx text, op text, col text) RETURNS TABLE (agree bool, results bigint)
LANGUAGE plpgsql AS $$
BEGIN
	RETURN QUERY EXECUTE format($q$
	SELECT bool_and(abs(r.distance - (pv.%3$I %2$s pq.%3$I)) <= 1e-6 * greatest(1, abs(r.distance))), count(*)
	FROM pq, gpu_ivfpq_knn_batch(%1$L, pq.%3$I, 10) r JOIN pv ON pv.ctid = r.tid$q$, idx, op, col);
END $$;
SELECT 'vector <->' AS class, * FROM agrees_with_operator('pv_v_l2', '<->', 'v');
SELECT 'vector <#>' AS class, * FROM agrees_with_operator('pv_v_ip', '<#>', 'v');
SELECT 'vector <=>' AS class, * FROM agrees_with_operator('pv_v_cos', '<=>', 'v');
SELECT 'halfvec <->' AS class, * FROM agrees_with_operator('pv_h_l2', '<->', 'h');
SELECT 'halfvec <#>' AS class, * FROM agrees_with_operator('pv_h_ip', '<#>', 'h');
SELECT 'halfvec <=>' AS class, * FROM agrees_with_operator('pv_h_cos', '<=>', 'h');

-- The search functions on vector and halfvec indexes, with vector and
-- halfvec queries, return what they return on real[] (rows and distances).
CREATE FUNCTION same_batch(idx text, ref text, qcol text, qref text) RETURNS TABLE (same bool, results bigint)
LANGUAGE plpgsql AS $$
BEGIN
	RETURN QUERY EXECUTE format($q$
	WITH a AS (SELECT * FROM gpu_ivfpq_knn_batch(%1$L, (SELECT array_agg(%3$I ORDER BY q) FROM pq), 10)),
	     b AS (SELECT * FROM gpu_ivfpq_knn_batch(%2$L, (SELECT array_agg(%4$I ORDER BY q) FROM pq), 10))
	SELECT NOT EXISTS (SELECT * FROM a EXCEPT SELECT * FROM b) AND NOT EXISTS (SELECT * FROM b EXCEPT SELECT * FROM a),
	       (SELECT count(*) FROM a)$q$, idx, ref, qcol, qref);
END $$;
SELECT 'knn_batch vector <->' AS f, * FROM same_batch('pv_v_l2', 'pv_r_l2', 'v', 'r');
SELECT 'knn_batch vector <#>' AS f, * FROM same_batch('pv_v_ip', 'pv_r_ip', 'v', 'r');
SELECT 'knn_batch vector <=>' AS f, * FROM same_batch('pv_v_cos', 'pv_r_cos', 'v', 'r');
SELECT 'knn_batch halfvec <->' AS f, * FROM same_batch('pv_h_l2', 'pv_hr_l2', 'h', 'hr');
SELECT 'knn_batch halfvec <#>' AS f, * FROM same_batch('pv_h_ip', 'pv_hr_ip', 'h', 'hr');
SELECT 'knn_batch halfvec <=>' AS f, * FROM same_batch('pv_h_cos', 'pv_hr_cos', 'h', 'hr');
-- Query and index types may differ: the index stores float4 either way.
SELECT 'knn_batch real[] queries, vector index' AS f, * FROM same_batch('pv_v_l2', 'pv_r_l2', 'r', 'r');
SELECT 'knn_batch halfvec queries, real[] index' AS f, * FROM same_batch('pv_hr_cos', 'pv_hr_cos', 'h', 'hr');
-- One query (not an array) of each type.
SELECT array_agg(tid ORDER BY rank) = (SELECT array_agg(tid ORDER BY rank)
         FROM gpu_ivfpq_knn_batch('pv_r_l2', '{1,0,0.5,1,0.1,0}'::real[], 5)) AS one_vector_query
FROM gpu_ivfpq_knn_batch('pv_v_l2', '[1,0,0.5,1,0.1,0]'::vector, 5);
SELECT array_agg(tid ORDER BY rank) = (SELECT array_agg(tid ORDER BY rank)
         FROM gpu_ivfpq_knn_batch('pv_hr_l2', '[1,0,0.5,1,0.1,0]'::halfvec::real[], 5)) AS one_halfvec_query
FROM gpu_ivfpq_knn_batch('pv_h_l2', '[1,0,0.5,1,0.1,0]'::halfvec, 5);

-- Exact k-NN over a vector or halfvec column (no index used) equals exact
-- k-NN over the same values as real[], and the sequential scan.
CREATE FUNCTION same_exact(col text, ref text, qcol text, qref text, metric text) RETURNS TABLE (same bool, results bigint)
LANGUAGE plpgsql AS $$
BEGIN
	RETURN QUERY EXECUTE format($q$
	WITH a AS (SELECT * FROM gpu_ivfpq_exact_knn('pv', %1$L, (SELECT array_agg(%3$I ORDER BY q) FROM pq), 7, %5$L)),
	     b AS (SELECT * FROM gpu_ivfpq_exact_knn('pv', %2$L, (SELECT array_agg(%4$I ORDER BY q) FROM pq), 7, %5$L))
	SELECT NOT EXISTS (SELECT * FROM a EXCEPT SELECT * FROM b) AND NOT EXISTS (SELECT * FROM b EXCEPT SELECT * FROM a),
	       (SELECT count(*) FROM a)$q$, col, ref, qcol, qref, metric);
END $$;
SELECT 'exact vector l2' AS f, * FROM same_exact('v', 'r', 'v', 'r', 'l2');
SELECT 'exact vector ip' AS f, * FROM same_exact('v', 'r', 'v', 'r', 'ip');
SELECT 'exact vector cosine' AS f, * FROM same_exact('v', 'r', 'v', 'r', 'cosine');
SELECT 'exact halfvec l2' AS f, * FROM same_exact('h', 'hr', 'h', 'hr', 'l2');
SELECT 'exact halfvec ip' AS f, * FROM same_exact('h', 'hr', 'h', 'hr', 'ip');
SELECT 'exact halfvec cosine' AS f, * FROM same_exact('h', 'hr', 'h', 'hr', 'cosine');
SET enable_indexscan = off;
SELECT count(*) FILTER (WHERE e.ids = s.ids) AS exact_equals_seqscan, count(*) AS queries
FROM (SELECT query, array_agg(pv.id ORDER BY rank) AS ids
      FROM gpu_ivfpq_exact_knn('pv', 'v', (SELECT array_agg(v ORDER BY q) FROM pq), 7, 'cosine') r
      JOIN pv ON pv.ctid = r.tid GROUP BY query) e
JOIN (SELECT q AS query, ARRAY(SELECT id FROM pv ORDER BY pv.v <=> pq.v, pv.ctid LIMIT 7) AS ids FROM pq) s USING (query);
RESET enable_indexscan;

-- Range search and the k-NN graph.
SELECT count(*) FILTER (WHERE a IS NOT DISTINCT FROM b) AS same_ranges, count(*) AS queries, sum(cardinality(a)) AS rows_found
FROM (SELECT (SELECT array_agg(tid ORDER BY distance, tid) FROM gpu_ivfpq_range('pv_v_l2', pq.v, 0.8)) AS a,
             (SELECT array_agg(tid ORDER BY distance, tid) FROM gpu_ivfpq_range('pv_r_l2', pq.r, 0.8)) AS b
      FROM pq) x;
SELECT count(*) FILTER (WHERE a IS NOT DISTINCT FROM b) AS same_ranges, count(*) AS queries, sum(cardinality(a)) AS rows_found
FROM (SELECT (SELECT array_agg(tid ORDER BY distance, tid) FROM gpu_ivfpq_range('pv_h_cos', pq.h, 0.05)) AS a,
             (SELECT array_agg(tid ORDER BY distance, tid) FROM gpu_ivfpq_range('pv_hr_cos', pq.hr, 0.05)) AS b
      FROM pq) x;
SELECT count(*) AS graph_edges,
       count(*) FILTER (WHERE (src, rank, dst, distance) NOT IN
                        (SELECT * FROM gpu_ivfpq_knn_graph('pv_r_ip', 4))) AS differing
FROM gpu_ivfpq_knn_graph('pv_v_ip', 4);

-- Inserts and deletes after the build; VACUUM; the index checker.
INSERT INTO pv (id, tenant, r, v, h, hr)
SELECT i, 0, r, r::vector, r::halfvec, r::halfvec::real[] FROM (
	SELECT i, ARRAY[cos(i), sin(i), 0.25, sin(i * 0.5), 0.3, cos(i * 0.2)]::real[] AS r
	FROM generate_series(3001, 3300) i) s;
DELETE FROM pv WHERE id % 7 = 0;
VACUUM pv;
SELECT 'vector <-> after DML' AS class, * FROM same_answers('v', 'r', '<->', 'v', 'r');
SELECT 'halfvec <=> after DML' AS class, * FROM same_answers('h', 'hr', '<=>', 'h', 'hr');
SELECT gpu_ivfpq_check('pv_v_l2', heapallindexed => true), gpu_ivfpq_check('pv_h_cos', heapallindexed => true);

-- Zero vectors: a cosine distance of NaN, after every number, in index and
-- sequential scans alike.
CREATE TABLE pz (id int, v vector(3));
INSERT INTO pz VALUES (1, '[0,0,0]'), (2, '[1,0,0]'), (3, '[0,1,0]'), (4, '[0,0,0]'), (5, '[1,1,0]');
CREATE INDEX ON pz USING gpu_ivfpq (v vector_cosine_ops) WITH (lists = 1);
SELECT knn($$SELECT id FROM pz ORDER BY v <=> '[1,0.1,0]' LIMIT 5$$, true) AS index_scan,
       knn($$SELECT id FROM pz ORDER BY v <=> '[1,0.1,0]', id LIMIT 5$$, false) AS seq_scan;

-- A vector(n) or halfvec(n) column declares its dimension: m is checked
-- against it at CREATE INDEX, on an empty table too (not at its REINDEX).
CREATE TABLE pdim (v vector(3), h halfvec(6));
CREATE INDEX ON pdim USING gpu_ivfpq (v) WITH (m = 2);
CREATE INDEX ON pdim USING gpu_ivfpq (h halfvec_l2_ops) WITH (m = 4);
CREATE INDEX pdim_v ON pdim USING gpu_ivfpq (v) WITH (m = 3);
CREATE INDEX pdim_h ON pdim USING gpu_ivfpq (h halfvec_l2_ops) WITH (m = 2);
CREATE INDEX ON pdim USING gpu_ivfpq (((v::real[])::vector(4))) WITH (m = 3);
INSERT INTO pdim VALUES ('[1,2,3]', '[1,2,3,4,5,6]');
REINDEX TABLE pdim;
DROP TABLE pdim;
-- Components near the float range: pgvector's operators sum in single
-- precision and return Infinity where the squares overflow; gpu_ivfpq ranks
-- by the double-precision distance (real[]'s <->), an order that refines
-- pgvector's. With every list probed an index scan returns the rows in the
-- order of a sequential scan by that distance; with the default settings a
-- row is found by its own vector.
CREATE TABLE pl (id int, v vector(4));
INSERT INTO pl SELECT i, ARRAY[sin(i), cos(i), sin(i * 0.3), cos(i * 0.7)]::real[]::vector
FROM generate_series(1, 200) i;
INSERT INTO pl VALUES (201, '[2e19,0,0,0]'), (202, '[1e20,0,0,0]'), (203, '[3e38,0,0,0]'),
	(204, '[-3e38,3e38,-3e38,3e38]');
CREATE INDEX pl_l2 ON pl USING gpu_ivfpq (v vector_l2_ops) WITH (lists = 4, m = 2);
SELECT v <-> '[1e20,0,0,0]' AS pgvector_distance, v::real[] <-> '{1e20,0,0,0}' AS gpu_ivfpq_distance
FROM pl WHERE id = 201;
SET gpu_ivfpq.probes = 4;
SET gpu_ivfpq.rerank = 1000;
SELECT q, knn(format('SELECT id FROM pl ORDER BY v <-> %L::vector LIMIT 300', q), true) =
          knn(format('SELECT id FROM pl ORDER BY v::real[] <-> %L::real[], ctid LIMIT 300', q::vector::real[]), false)
          AS same_as_seqscan
FROM unnest(ARRAY['[1,0,0,0]', '[2e19,0,0,0]', '[1e20,0,0,0]', '[3e38,0,0,0]']) q;
RESET gpu_ivfpq.probes;
RESET gpu_ivfpq.rerank;
SET enable_seqscan = off;
SELECT id, (SELECT l.id FROM pl l ORDER BY l.v <-> pl.v LIMIT 1) = id AS found_first FROM pl WHERE id > 200 ORDER BY id;
RESET enable_seqscan;

-- Where the GPU service runs (the preloaded pass of the suite), it served
-- these scans; elsewhere there is nothing to check.
SELECT state NOT LIKE 'running (GPU%' OR queries_gpu > :gpu_queries_before AS served_by_the_service_if_running
FROM gpu_ivfpq_status;

-- Bad input: errors with their SQLSTATE, never a crash.
CREATE FUNCTION sqlstate_of(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
	EXECUTE stmt;
	RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
	RETURN SQLSTATE || ': ' || SQLERRM;
END $$;
CREATE TABLE pbad (id int, v vector, h halfvec, s sparsevec(3), t text);
INSERT INTO pbad VALUES (1, '[1,2,3]', '[1,2,3]', '{1:1}/3', 'x');
CREATE INDEX pbad_v ON pbad USING gpu_ivfpq (v) WITH (lists = 1);
CREATE INDEX pbad_h ON pbad USING gpu_ivfpq (h halfvec_ip_ops) WITH (lists = 1);
-- A query of another dimension than the index's (the index reads it first).
SET enable_seqscan = off;
SELECT sqlstate_of($$SELECT id FROM pbad ORDER BY v <-> '[1,2]' LIMIT 1$$) AS wrong_query_dimension;
SELECT sqlstate_of($$SELECT id FROM pbad ORDER BY h <#> '[1,2,3,4]' LIMIT 1$$) AS wrong_halfvec_query_dimension;
RESET enable_seqscan;
-- A row of another dimension than the index's (a vector column without typmod).
SELECT sqlstate_of($$INSERT INTO pbad (v) VALUES ('[1,2,3,4]')$$) AS wrong_row_dimension;
SELECT sqlstate_of($$INSERT INTO pbad (h) VALUES ('[1,2]')$$) AS wrong_halfvec_dimension;
-- Types gpu_ivfpq has no operator class for, or that do not match the class.
SELECT sqlstate_of($$CREATE INDEX ON pbad USING gpu_ivfpq (s)$$) AS sparsevec_column;
SELECT sqlstate_of($$CREATE INDEX ON pbad USING gpu_ivfpq (v halfvec_l2_ops)$$) AS class_of_another_type;
-- The search functions.
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_knn_batch('pbad_v', ARRAY['[1,2,3]', '[1,2]']::vector[], 1)$$) AS mixed_dimensions;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_knn_batch('pbad_v', ARRAY['[1,2]']::vector[], 1)$$) AS batch_wrong_dimension;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_knn_batch('pbad_v', ARRAY[]::vector[], 1)$$) AS no_queries;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_knn_batch('pbad_v', ARRAY['[1,2,3]', NULL]::vector[], 1)$$) AS null_query;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_knn_batch('pbad_v', ARRAY[ARRAY['[1,2,3]'::vector]], 1)$$) AS query_matrix;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_range('pbad_h', '[1,2]'::halfvec, 1)$$) AS range_wrong_dimension;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_exact_knn('pbad', 't', '[1,2,3]'::vector, 1)$$) AS text_column;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_exact_knn('pbad', 's', '[1,2,3]'::vector, 1)$$) AS sparsevec_column;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_exact_knn('pbad', 'h', '[1,2]'::halfvec, 1)$$) AS exact_wrong_dimension;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_exact_knn('pbad', 'v', '[1,2,3]'::vector, 1, 'manhattan')$$) AS unknown_metric;
-- An untyped literal matches both the real[] and the vector functions: a cast says which.
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_knn_batch('pbad_v', '{1,2,3}', 1)$$) AS untyped_query;
SELECT count(*) AS typed_query FROM gpu_ivfpq_knn_batch('pbad_v', '{1,2,3}'::real[], 1);
-- The overloads check privileges as gpu_ivfpq's own functions do.
CREATE ROLE gpu_ivfpq_pgvector_reader;
GRANT SELECT (v) ON pbad TO gpu_ivfpq_pgvector_reader;
SET ROLE gpu_ivfpq_pgvector_reader;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_knn_batch('pbad_v', '[1,2,3]'::vector, 1)$$) AS batch_without_select;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_exact_knn('pbad', 'v', ARRAY['[1,2,3]'::vector], 1)$$) AS exact_without_select;
SELECT sqlstate_of($$SELECT * FROM gpu_ivfpq_range('pbad_h', '[1,2,3]'::halfvec, 1)$$) AS range_without_select;
RESET ROLE;
REVOKE ALL ON pbad FROM gpu_ivfpq_pgvector_reader;
DROP ROLE gpu_ivfpq_pgvector_reader;
-- pgvector cannot be dropped from under the operator classes and indexes.
SELECT sqlstate_of($$DROP EXTENSION vector$$) AS drop_vector;

-- An unchanged pgvector query uses the index at 384, 768, 1536 and 3072
-- dimensions, as on real[] columns (scan_basic): pgvector's cost test, 5000
-- rows and lists = 5. From 768 dimensions on the vectors are TOASTed.
\i test/sql/plan_function.inc
SELECT setseed(0.4);
SET client_min_messages = warning;
SELECT make_cost_tables('pcost', 'vector(%s)', 'v vector_l2_ops');
RESET client_min_messages;
SELECT d AS dimensions, plan_of(format('SELECT id FROM pcost_%s ORDER BY v <-> %L::vector LIMIT 10', d,
	ARRAY(SELECT random()::real FROM generate_series(1, d))::vector)) AS plan
FROM unnest(ARRAY[384, 768, 1536, 3072]) d;
DROP TABLE pcost_384, pcost_768, pcost_1536, pcost_3072;
DROP FUNCTION plan_of(text), make_cost_tables(text, text, text);

-- The companion extension's objects.
\dx+ gpu_ivfpq_pgvector

-- Dropping the tables frees their indexes' GPU mirrors (those of a dropped
-- database would stay until evicted).
DROP TABLE pv, pq, pz, pl, pbad;
\c :test_db
SET client_min_messages = warning;
DROP DATABASE gpu_ivfpq_pgvector;
