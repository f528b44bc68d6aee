-- Components near the float range (about 1e19 and more: their squares
-- overflow float, in which the quantizers rank). Every finite value is
-- accepted; rows whose approximate distance overflows still compete, and
-- results are ordered by the exact distance (double precision), so with
-- every list probed and every entry re-ranked an index scan, batch k-NN and
-- range search return what a sequential scan does, on the CPU engine and
-- through the GPU service. A query too long to rank approximately re-ranks
-- every entry: a row is found by its own vector with the default settings.
-- No continued scan asks for more candidates than the index holds.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
\i test/sql/knn_function.inc
CREATE TABLE lv (id int PRIMARY KEY, r real[]);
INSERT INTO lv SELECT i, ARRAY[sin(i) * 10, cos(i) * 10, sin(i * 0.3) * 10, cos(i * 0.7) * 10]::real[]
FROM generate_series(1, 600) i;
-- A cluster up to the float range (its mean and residuals overflow float),
-- and single rows from 2e19 to the largest float, of either sign.
INSERT INTO lv SELECT 700 + i, ARRAY[i * 1e37, -i * 1e37, 3.4e38 - i * 1e36, i]::real[]
FROM generate_series(1, 30) i;
INSERT INTO lv VALUES (801, '{2e19,0,0,0}'), (802, '{1e20,0,0,0}'), (803, '{3e38,0,0,0}'),
	(804, '{-3e38,3e38,-3e38,3e38}'), (805, '{1e20,1e20,1e20,1e20}'), (806, '{-2e19,5,5,5}'),
	(807, '{3.4028235e38,-3.4028235e38,1,1}'), (808, '{1e18,-1e18,1e18,0}');
CREATE INDEX lv_l2 ON lv USING gpu_ivfpq (r) WITH (lists = 8, m = 2);
CREATE INDEX lv_ip ON lv USING gpu_ivfpq (r real_ip_ops) WITH (lists = 8, m = 2);
CREATE INDEX lv_cos ON lv USING gpu_ivfpq (r real_cosine_ops) WITH (lists = 8, m = 2);
SELECT gpu_ivfpq_check('lv_l2'), gpu_ivfpq_check('lv_ip'), gpu_ivfpq_check('lv_cos');
CREATE TABLE lq (q int, v real[]);
INSERT INTO lq VALUES (1, '{1,0,0,0}'), (2, '{2e19,0,0,0}'), (3, '{1e20,0,0,0}'), (4, '{3e38,0,0,0}'),
	(5, '{-3e38,3e38,-3e38,3e38}'), (6, '{5,-3,2e19,1}'), (7, '{1e37,-1e37,3.4e38,0}');

-- Every list probed, every entry re-ranked (within the GPU's bound, so that
-- the GPU service serves the scans where it runs).
SET gpu_ivfpq.probes = 8;
SET gpu_ivfpq.rerank = 1000;
CREATE FUNCTION same_as_seqscan(op text) RETURNS TABLE (same bigint, queries bigint) LANGUAGE plpgsql AS $$
BEGIN
	RETURN QUERY EXECUTE format($q$
	SELECT count(*) FILTER (WHERE
	         knn(format('SELECT id FROM lv ORDER BY r %1$s %%L::real[] LIMIT 1000', v), true) =
	         knn(format('SELECT id FROM lv ORDER BY r %1$s %%L::real[], ctid LIMIT 1000', v), false)),
	       count(*) FROM lq$q$, op);
END $$;
SELECT 'l2' AS class, * FROM same_as_seqscan('<->');
SELECT 'ip' AS class, * FROM same_as_seqscan('<#>');
SELECT 'cosine' AS class, * FROM same_as_seqscan('<=>');
-- The CPU engine alone.
SET gpu_ivfpq.device = cpu;
SELECT 'l2' AS class, * FROM same_as_seqscan('<->');
SELECT 'ip' AS class, * FROM same_as_seqscan('<#>');
SELECT 'cosine' AS class, * FROM same_as_seqscan('<=>');
RESET gpu_ivfpq.device;

-- A filter column, pushed down: the rows that pass, in the sequential
-- scan's order, from the service and from the CPU engine.
CREATE INDEX lv_l2_id ON lv USING gpu_ivfpq (r, id) WITH (lists = 8, m = 2);
CREATE FUNCTION same_filtered() RETURNS TABLE (same bigint, queries bigint) LANGUAGE sql AS $$
	SELECT count(*) FILTER (WHERE
	         knn(format('SELECT id FROM lv WHERE id > 590 ORDER BY r <-> %L::real[] LIMIT 100', v), true) =
	         knn(format('SELECT id FROM lv WHERE id > 590 ORDER BY r <-> %L::real[], ctid LIMIT 100', v), false)),
	       count(*) FROM lq $$;
SELECT * FROM same_filtered();
SET gpu_ivfpq.device = cpu;
SELECT * FROM same_filtered();
RESET gpu_ivfpq.device;
DROP INDEX lv_l2_id;
DROP FUNCTION same_filtered();

-- Batch k-NN over every row: the sequential scan's order.
CREATE TABLE lref AS
SELECT lq.q, row_number() OVER (PARTITION BY lq.q ORDER BY lv.r <-> lq.v, lv.ctid) AS rank, lv.ctid AS tid
FROM lq, lv;
SELECT count(*) AS batch_rows, count(*) FILTER (WHERE b.tid = lref.tid) AS batch_same_order
FROM gpu_ivfpq_knn_batch('lv_l2', (SELECT array_agg(v ORDER BY q) FROM lq), 1000) b
JOIN lref ON lref.q = b.query AND lref.rank = b.rank;
SET gpu_ivfpq.device = cpu;
SELECT count(*) AS batch_rows, count(*) FILTER (WHERE b.tid = lref.tid) AS batch_same_order
FROM gpu_ivfpq_knn_batch('lv_l2', (SELECT array_agg(v ORDER BY q) FROM lq), 1000) b
JOIN lref ON lref.q = b.query AND lref.rank = b.rank;
RESET gpu_ivfpq.device;
-- Exact k-NN: the same order.
SELECT count(*) AS exact_rows, count(*) FILTER (WHERE e.tid = lref.tid) AS exact_same_order
FROM gpu_ivfpq_exact_knn('lv', 'r', (SELECT array_agg(v ORDER BY q) FROM lq), 1000) e
JOIN lref ON lref.q = e.query AND lref.rank = e.rank;

-- Range search: radius Infinity returns every row; a finite radius the rows
-- a sequential scan finds within it.
SELECT q, (SELECT count(*) FROM gpu_ivfpq_range('lv_l2', v, 'Infinity')) AS infinite_radius,
       (SELECT count(*) FROM gpu_ivfpq_range('lv_l2', v, 1e20)) AS within_1e20,
       (SELECT count(*) FROM lv WHERE r <-> lq.v <= 1e20) AS seqscan_1e20
FROM lq ORDER BY q;
SELECT q, (SELECT count(*) FROM gpu_ivfpq_range('lv_cos', v, 'Infinity')) AS infinite_radius,
       (SELECT count(*) FROM gpu_ivfpq_range('lv_cos', v, 0.5)) AS within_half,
       (SELECT count(*) FROM lv WHERE r <=> lq.v <= 0.5) AS seqscan_half
FROM lq ORDER BY q;

-- With the default settings each row past the float range is found by its
-- own vector (and so is one whose squares still fit), first.
RESET gpu_ivfpq.probes;
RESET gpu_ivfpq.rerank;
SET enable_seqscan = off;
SELECT id, (SELECT l.id FROM lv l ORDER BY l.r <-> lv.r LIMIT 1) = id AS found_first
FROM lv WHERE id > 800 ORDER BY id;
SELECT count(*) FILTER (WHERE (SELECT l.id FROM lv l ORDER BY l.r <-> lv.r LIMIT 1) = id) AS found_first,
       count(*) AS rows
FROM lv WHERE id BETWEEN 701 AND 730;
SELECT b.query, lv.id FROM gpu_ivfpq_knn_batch('lv_l2', (SELECT array_agg(r ORDER BY id) FROM lv WHERE id > 800), 1) b
JOIN lv ON lv.ctid = b.tid ORDER BY b.query;
-- The quantizers are trained on the rows they can rank: the others do not
-- pull the centroids of the ordinary rows out of the float range, which are
-- found by their own vectors from two lists and twenty candidates.
SET gpu_ivfpq.probes = 2;
SET gpu_ivfpq.rerank = 20;
SELECT count(*) FILTER (WHERE (SELECT l.id FROM lv l ORDER BY l.r <-> lv.r LIMIT 1) = id) AS found_first,
       count(*) AS rows
FROM lv WHERE id <= 600;

-- A scan whose rounds keep growing (one list, one candidate, no bound on
-- the candidates re-ranked, rows found late returned late) stops when it
-- has ranked every entry: each row once, no allocation past the index.
SET gpu_ivfpq.probes = 1;
SET gpu_ivfpq.rerank = 1;
SET gpu_ivfpq.max_scan_tuples = 2147483647;
SET gpu_ivfpq.strict_order = off;
SELECT q, count(*) AS rows, count(DISTINCT id) AS distinct_rows
FROM lq CROSS JOIN LATERAL (SELECT id FROM lv ORDER BY r <-> lq.v) s GROUP BY q ORDER BY q;
SET gpu_ivfpq.device = cpu;
SELECT q, count(*) AS rows, count(DISTINCT id) AS distinct_rows
FROM lq CROSS JOIN LATERAL (SELECT id FROM lv ORDER BY r <-> lq.v) s GROUP BY q ORDER BY q;
RESET gpu_ivfpq.device;
RESET gpu_ivfpq.probes;
RESET gpu_ivfpq.rerank;
RESET gpu_ivfpq.max_scan_tuples;
RESET gpu_ivfpq.strict_order;
RESET enable_seqscan;

-- REINDEX trains again on the same rows: the same answers.
REINDEX INDEX lv_l2;
SELECT gpu_ivfpq_check('lv_l2');
SET gpu_ivfpq.probes = 8;
SET gpu_ivfpq.rerank = 1000;
SELECT 'l2 after REINDEX' AS class, * FROM same_as_seqscan('<->');
RESET gpu_ivfpq.probes;
RESET gpu_ivfpq.rerank;

DROP TABLE lv, lq, lref;
DROP FUNCTION same_as_seqscan(text), knn(text, bool);
