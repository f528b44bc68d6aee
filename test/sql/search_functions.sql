-- Batch k-NN (gpu_ivfpq_knn_batch) and exact range search (gpu_ivfpq_range):
-- same answers as index scans and sequential scans, for the three operator
-- classes; bad arguments; an untrained index; invisible rows.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
CREATE TABLE sf (id int PRIMARY KEY, v real[]);
INSERT INTO sf SELECT i, ARRAY[sin(i), cos(i), sin(i * 0.3), cos(i * 0.7), sin(i * 1.1), cos(i * 1.3)]::real[]
FROM generate_series(1, 3000) i;
CREATE INDEX sf_l2 ON sf USING gpu_ivfpq (v) WITH (lists = 16, m = 3);
CREATE INDEX sf_ip ON sf USING gpu_ivfpq (v real_ip_ops) WITH (lists = 16, m = 3);
CREATE INDEX sf_cos ON sf USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 16, m = 3);
CREATE TABLE sfq AS SELECT i AS q, ARRAY[cos(i), sin(i * 2), 0.5, cos(i * 3), 0.1, sin(i)]::real[] AS v
FROM generate_series(1, 40) i;

-- Batch k-NN returns what an index scan returns, query by query (same probes
-- and re-rank), for each operator class.
CREATE FUNCTION batch_vs_scan(idx regclass, op text) RETURNS TABLE (same bigint, queries bigint)
LANGUAGE plpgsql AS $$
BEGIN
	SET LOCAL enable_seqscan = off;
	RETURN QUERY EXECUTE format($q$
	WITH b AS (SELECT query, array_agg(sf.id ORDER BY rank) AS ids
	           FROM gpu_ivfpq_knn_batch(%L, (SELECT array_agg(v ORDER BY q) FROM sfq), 10) r
	           JOIN sf ON sf.ctid = r.tid GROUP BY query),
	     s AS (SELECT q AS query, ARRAY(SELECT id FROM sf ORDER BY sf.v %s sfq.v LIMIT 10) AS ids FROM sfq)
	SELECT count(*) FILTER (WHERE b.ids = s.ids), count(*) FROM b JOIN s USING (query)$q$, idx, op);
END $$;
SELECT * FROM batch_vs_scan('sf_l2', '<->');
SELECT * FROM batch_vs_scan('sf_ip', '<#>');
SELECT * FROM batch_vs_scan('sf_cos', '<=>');

-- Output shape: query numbers, ranks, distances in order.
SELECT query, rank, distance = (SELECT v <-> '{1,0,0.5,1,0.1,0}' FROM sf WHERE ctid = r.tid) AS dist_ok
FROM gpu_ivfpq_knn_batch('sf_l2', '{1,0,0.5,1,0.1,0}', 3) r;
-- Rows deleted (and invisible) never appear.
BEGIN;
DELETE FROM sf WHERE id IN (SELECT sf.id FROM sf ORDER BY v <-> '{1,0,0.5,1,0.1,0}' LIMIT 2);
SELECT count(*) AS deleted_rows_returned FROM gpu_ivfpq_knn_batch('sf_l2', '{1,0,0.5,1,0.1,0}', 5) r
WHERE NOT EXISTS (SELECT 1 FROM sf WHERE ctid = r.tid);
ROLLBACK;

-- Most entries of deleted rows (no VACUUM yet): a query whose candidates
-- leave fewer than k rows visible searches again, wider, as an index scan's
-- later rounds do: k rows for every query and every row of the graph.
CREATE TABLE sfd (id int, v real[]) WITH (autovacuum_enabled = off);
INSERT INTO sfd SELECT i, ARRAY[(i % 97) / 97.0, (i % 89) / 89.0, (i % 83) / 83.0, (i % 79) / 79.0]::real[]
FROM generate_series(1, 20000) i;
CREATE INDEX sfd_idx ON sfd USING gpu_ivfpq (v) WITH (lists = 10, m = 2);
DELETE FROM sfd WHERE id % 20 <> 0;
SELECT count(*) AS batch_rows, count(DISTINCT query) AS queries
FROM gpu_ivfpq_knn_batch('sfd_idx', (SELECT array_agg(v) FROM (SELECT v FROM sfd LIMIT 50) s), 10);
SELECT count(*) AS graph_edges, count(DISTINCT src) AS graph_rows FROM gpu_ivfpq_knn_graph('sfd_idx', 10);
DROP TABLE sfd;

-- Range search equals the sequential scan, for several radii and classes.
CREATE FUNCTION range_vs_seq(idx regclass, op text, radius float8) RETURNS TABLE (same bigint, queries bigint, rows_found bigint)
LANGUAGE plpgsql AS $$
BEGIN
	RETURN QUERY EXECUTE format($q$
	WITH r AS (SELECT q, (SELECT array_agg(sf.id ORDER BY sf.id) FROM gpu_ivfpq_range(%L, sfq.v, %s) g JOIN sf ON sf.ctid = g.tid) AS ids FROM sfq),
	     s AS (SELECT q, (SELECT array_agg(id ORDER BY id) FROM sf WHERE sf.v %s sfq.v <= %s) AS ids FROM sfq)
	SELECT count(*) FILTER (WHERE r.ids IS NOT DISTINCT FROM s.ids), count(*), sum(cardinality(s.ids))
	FROM r JOIN s USING (q)$q$, idx, radius, op, radius);
END $$;
SELECT * FROM range_vs_seq('sf_l2', '<->', 0.3);
SELECT * FROM range_vs_seq('sf_l2', '<->', 0.8);
SELECT * FROM range_vs_seq('sf_l2', '<->', 1.5);
SELECT * FROM range_vs_seq('sf_cos', '<=>', 0.02);
SELECT * FROM range_vs_seq('sf_cos', '<=>', 0.2);
SELECT * FROM range_vs_seq('sf_ip', '<#>', -1.5);
SELECT count(*) AS nearest_three FROM gpu_ivfpq_range('sf_l2', '{1,0,0.5,1,0.1,0}', 100, 3);
-- A radius that takes in every row re-ranks in rounds of about work_mem
-- (64kB: 2730 candidates, so two rounds here) and sorts through a tuplesort
-- that spills: the same rows in the same order as the sequential scan,
-- whole and bounded by max_rows.
SET work_mem = '64kB';
SELECT (SELECT array_agg(g.tid ORDER BY o) FROM gpu_ivfpq_range('sf_l2', '{1,0,0.5,1,0.1,0}', 'Infinity') WITH ORDINALITY g(tid, distance, o))
     = (SELECT array_agg(ctid ORDER BY v <-> '{1,0,0.5,1,0.1,0}', ctid) FROM sf) AS range_all_in_order;
SELECT (SELECT array_agg(g.tid ORDER BY o) FROM gpu_ivfpq_range('sf_cos', '{1,0,0.5,1,0.1,0}', 0.5, 700) WITH ORDINALITY g(tid, distance, o))
     = (SELECT array_agg(ctid ORDER BY d, ctid) FROM (SELECT ctid, v <=> '{1,0,0.5,1,0.1,0}' AS d FROM sf
        WHERE v <=> '{1,0,0.5,1,0.1,0}' <= 0.5 ORDER BY 2, 1 LIMIT 700) s) AS range_bounded_in_order;
RESET work_mem;

-- An untrained index (built on an empty table) is searched exactly.
CREATE TABLE sfe (id int, v real[]);
CREATE INDEX sfe_idx ON sfe USING gpu_ivfpq (v) WITH (lists = 4);
INSERT INTO sfe SELECT id, v FROM sf WHERE id <= 200;
SELECT array_agg(sfe.id ORDER BY rank) AS batch_untrained
FROM gpu_ivfpq_knn_batch('sfe_idx', '{1,0,0.5,1,0.1,0}', 5) r JOIN sfe ON sfe.ctid = r.tid;
SELECT array_agg(id) AS exact FROM (SELECT id FROM sfe ORDER BY v <-> '{1,0,0.5,1,0.1,0}' LIMIT 5) s;
SELECT count(*) AS range_untrained FROM gpu_ivfpq_range('sfe_idx', '{1,0,0.5,1,0.1,0}', 1.0);
SELECT count(*) AS seq FROM sfe WHERE v <-> '{1,0,0.5,1,0.1,0}' <= 1.0;

-- The k-NN graph: k other rows for each row, in rank order, agreeing with
-- batch search once each row's own entry is left out.
CREATE TEMP TABLE g AS SELECT * FROM gpu_ivfpq_knn_graph('sf_l2', 5);
SELECT count(*) = 5 * (SELECT count(*) FROM sf) AS five_each, count(*) FILTER (WHERE src = dst) AS self_edges,
       min(rank), max(rank), bool_and(distance >= 0) AS distances_ok
FROM g;
SELECT count(*) AS rows_differing_from_batch FROM (
	SELECT src, array_agg(dst ORDER BY rank) AS d FROM g
	WHERE src IN (SELECT ctid FROM sf WHERE id <= 60) GROUP BY src) x
WHERE d <> ARRAY(SELECT r.tid FROM gpu_ivfpq_knn_batch('sf_l2', (SELECT v FROM sf WHERE ctid = x.src), 6) r
                 WHERE r.tid <> x.src ORDER BY r.rank LIMIT 5);
SELECT count(*) AS graph_of_empty FROM gpu_ivfpq_knn_graph('sfe_idx', 3) WHERE false;
-- Rows updated in place (HOT: a column the index does not hold, room on the
-- page) keep their entries under the chain's root TID; the graph names
-- each row by its ctid (the chain's visible member), as a join needs, and
-- still knows each row as itself (no edge of distance 0).
CREATE TABLE sfh (id int, note int, v real[]) WITH (fillfactor = 40);
INSERT INTO sfh SELECT id, 0, v FROM sf WHERE id <= 300;
CREATE INDEX sfh_idx ON sfh USING gpu_ivfpq (v) WITH (lists = 4, m = 2);
UPDATE sfh SET note = 1 WHERE id <= 100;
UPDATE sfh SET note = 2 WHERE id <= 50;
SELECT count(*) AS edges, count(*) FILTER (WHERE distance = 0) AS zero_distance_edges,
       count(DISTINCT src) AS sources,
       count(*) FILTER (WHERE src NOT IN (SELECT ctid FROM sfh) OR dst NOT IN (SELECT ctid FROM sfh)) AS not_a_ctid
FROM gpu_ivfpq_knn_graph('sfh_idx', 4);
DROP TABLE sfh;

-- Exact brute force over the column (no index) equals a sequential scan.
CREATE FUNCTION exact_vs_seq(metric text, op text) RETURNS TABLE (same bigint, queries bigint)
LANGUAGE plpgsql AS $$
BEGIN
	SET LOCAL enable_indexscan = off;
	RETURN QUERY EXECUTE format($q$
	WITH e AS (SELECT query, array_agg(sf.id ORDER BY rank) AS ids
	           FROM gpu_ivfpq_exact_knn('sf', 'v', (SELECT array_agg(v ORDER BY q) FROM sfq), 7, %L) r
	           JOIN sf ON sf.ctid = r.tid GROUP BY query),
	     s AS (SELECT q AS query, ARRAY(SELECT id FROM sf ORDER BY sf.v %s sfq.v, sf.ctid LIMIT 7) AS ids FROM sfq)
	SELECT count(*) FILTER (WHERE e.ids = s.ids), count(*) FROM e JOIN s USING (query)$q$, metric, op);
END $$;
SELECT * FROM exact_vs_seq('l2', '<->');
SELECT * FROM exact_vs_seq('ip', '<#>');
SELECT * FROM exact_vs_seq('cosine', '<=>');
-- More queries than one block of best hits holds (2396 at k = 1000): one
-- pass over the table per block, every query answered, exactly.
CREATE TABLE sfs AS SELECT * FROM sf WHERE id <= 20;
CREATE TABLE sfb AS SELECT row_number() OVER (ORDER BY id) AS q, v FROM sf WHERE id <= 2500;
WITH e AS (SELECT * FROM gpu_ivfpq_exact_knn('sfs', 'v', (SELECT array_agg(v ORDER BY q) FROM sfb), 1000))
SELECT count(*) AS hits, count(DISTINCT query) AS queries,
       (SELECT array_agg(s.id ORDER BY rank) FROM e JOIN sfs s ON s.ctid = e.tid WHERE query = 2450) =
       (SELECT array_agg(id) FROM (SELECT id FROM sfs ORDER BY v <-> (SELECT v FROM sfb WHERE q = 2450), ctid) x)
       AS second_block_exact
FROM e;
DROP TABLE sfs, sfb;
-- Points far from the origin and close together (map coordinates): float
-- ranking by |q|^2 + |b|^2 - 2 q.b would lose their distances to rounding;
-- the rows are ranked moved to their mean and the result certified, else
-- ranked by exact distances. Many equal rows: ties at the k-th go by ctid.
CREATE TABLE sfgeo AS SELECT i AS id, ARRAY[-122.40 + (i % 60) * 0.0005, 37.70 + (i / 60) * 0.0005]::real[] AS p
FROM generate_series(0, 2999) i;
INSERT INTO sfgeo SELECT 3000 + i, '{-122.38,37.71}' FROM generate_series(1, 40) i;
CREATE TABLE sfgq AS SELECT i AS q, ARRAY[-122.40 + (i * 7 % 60) * 0.000493, 37.70 + (i * 11 % 50) * 0.000511]::real[] AS p
FROM generate_series(1, 25) i;
INSERT INTO sfgq VALUES (26, '{-122.38,37.71}'), (27, '{-122.38,37.7101}');
WITH e AS (SELECT query, array_agg(g.id ORDER BY rank) AS ids
           FROM gpu_ivfpq_exact_knn('sfgeo', 'p', (SELECT array_agg(p ORDER BY q) FROM sfgq), 12) r
           JOIN sfgeo g ON g.ctid = r.tid GROUP BY query),
     s AS (SELECT q AS query, ARRAY(SELECT id FROM sfgeo g ORDER BY g.p <-> sfgq.p, g.ctid LIMIT 12) AS ids FROM sfgq)
SELECT count(*) FILTER (WHERE e.ids = s.ids) AS far_from_origin_same, count(*) FROM e JOIN s USING (query);
DROP TABLE sfgeo, sfgq;
-- Values below the normal float range: their products lose up to FLT_MIN
-- each whatever the norms, so the bound has an absolute term and such data
-- is ranked by exact distances (the float ranking took the 16 rows of one
-- tiny coordinate for nearer than the 20 true nearest).
CREATE TABLE sftiny (id int, kind text, v real[]);
INSERT INTO sftiny SELECT i, 'A', array_fill(((CASE WHEN i % 2 = 0 THEN 1 ELSE -1 END) * 2.66e-23)::real, ARRAY[64])
FROM generate_series(1, 20) i;
INSERT INTO sftiny SELECT 100 + i, 'B1', (SELECT array_agg(CASE WHEN j = ((i - 1) / 2 % 64) + 1
	THEN ((CASE WHEN i % 2 = 0 THEN 1 ELSE -1 END) * sqrt(5e-44))::real ELSE 0::real END ORDER BY j)
	FROM generate_series(1, 64) j) FROM generate_series(1, 16) i;
INSERT INTO sftiny SELECT 200 + i, 'B2', (SELECT array_agg(CASE WHEN j = ((i - 1) / 2 % 64) + 1
	THEN ((CASE WHEN i % 2 = 0 THEN 1 ELSE -1 END) * sqrt(8e-44))::real ELSE 0::real END ORDER BY j)
	FROM generate_series(1, 64) j) FROM generate_series(1, 40) i;
SELECT (SELECT array_agg(t.id ORDER BY r.rank) FROM gpu_ivfpq_exact_knn('sftiny', 'v', array_fill(0::real, ARRAY[64]), 10) r
        JOIN sftiny t ON t.ctid = r.tid) =
       ARRAY(SELECT id FROM sftiny ORDER BY v <-> array_fill(0::real, ARRAY[64]), ctid LIMIT 10) AS tiny_values_exact;
DROP TABLE sftiny;
-- A materialized view not yet populated has no rows to search.
CREATE MATERIALIZED VIEW sfm AS SELECT * FROM sf WITH NO DATA;
SELECT * FROM gpu_ivfpq_exact_knn('sfm', 'v', '{1,0,0.5,1,0.1,0}', 3);
-- Through its index: the same error (the index of an unpopulated view is empty).
CREATE INDEX sfm_idx ON sfm USING gpu_ivfpq (v);
SELECT * FROM gpu_ivfpq_knn_batch('sfm_idx', '{1,0,0.5,1,0.1,0}'::real[], 3);
DROP MATERIALIZED VIEW sfm;

-- Bad arguments.
SELECT * FROM gpu_ivfpq_knn_batch('sf_l2', '{1,2}', 3);
SELECT * FROM gpu_ivfpq_knn_batch('sf_l2', '{1,0,0.5,1,0.1,0}', 0);
SELECT * FROM gpu_ivfpq_knn_batch('sf_l2', '{1,0,0.5,1,0.1,0}', 1001);
SELECT * FROM gpu_ivfpq_knn_batch('sf_l2', '{{{1}}}', 3);
SELECT * FROM gpu_ivfpq_knn_batch('sf_l2', '{1,0,0.5,1,0.1,NULL}', 3);
SELECT * FROM gpu_ivfpq_knn_batch('sf_l2', '{1,0,0.5,1,0.1,NaN}', 3);
SELECT * FROM gpu_ivfpq_knn_batch('sf_l2', '{}', 3);
SELECT * FROM gpu_ivfpq_knn_batch('sf_pkey', '{1,0,0.5,1,0.1,0}', 3);
SELECT * FROM gpu_ivfpq_knn_batch('sf', '{1,0,0.5,1,0.1,0}', 3);
-- The probed lists hold fewer than k rows: the batch search probes more
-- lists, as an index scan's later rounds do (20 rows near the query in one
-- list, 200 far off in the other).
CREATE TABLE sf_two (id int, v real[]);
INSERT INTO sf_two SELECT i, ARRAY[i * 0.001, 0]::real[] FROM generate_series(1, 20) i;
INSERT INTO sf_two SELECT 100 + i, ARRAY[100 + i * 0.001, 0]::real[] FROM generate_series(1, 200) i;
CREATE INDEX sf_two_v ON sf_two USING gpu_ivfpq (v) WITH (lists = 2, m = 2);
SET gpu_ivfpq.probes = 1;
SELECT count(*) AS batch_rows,
       array_agg(t.id ORDER BY b.rank) = (SELECT array_agg(id ORDER BY v <-> '{0,0}', id)
                                           FROM (SELECT id, v FROM sf_two ORDER BY v <-> '{0,0}', id LIMIT 25) x)
         AS same_rows
  FROM gpu_ivfpq_knn_batch('sf_two_v', '{0,0}'::real[], 25) b JOIN sf_two t ON t.ctid = b.tid;
RESET gpu_ivfpq.probes;
DROP TABLE sf_two;
-- A partitioned index holds no entries: the error says so.
CREATE TABLE sf_parts (id int, v real[]) PARTITION BY RANGE (id);
CREATE TABLE sf_part1 PARTITION OF sf_parts FOR VALUES FROM (0) TO (100);
CREATE INDEX sf_parts_v ON sf_parts USING gpu_ivfpq (v);
SELECT * FROM gpu_ivfpq_knn_batch('sf_parts_v', '{1,0,0.5,1,0.1,0}', 3);
SELECT gpu_ivfpq_prewarm('sf_parts_v');
DROP TABLE sf_parts;
SELECT count(*) AS null_queries FROM gpu_ivfpq_knn_batch('sf_l2', NULL, 3);
SELECT * FROM gpu_ivfpq_range('sf_l2', '{1,2}', 1);
SELECT * FROM gpu_ivfpq_range('sf_l2', '{1,0,0.5,1,0.1,0}', -1);
SELECT * FROM gpu_ivfpq_range('sf_l2', '{1,0,0.5,1,0.1,0}', 'NaN');
SELECT * FROM gpu_ivfpq_range('sf_l2', '{1,0,0.5,1,0.1,0}', 1, -5);
SELECT * FROM gpu_ivfpq_range('sf_pkey', '{1,0,0.5,1,0.1,0}', 1);
SELECT * FROM gpu_ivfpq_knn_graph('sf_l2', 0);
SELECT * FROM gpu_ivfpq_knn_graph('sf', 3);
SELECT * FROM gpu_ivfpq_exact_knn('sf', 'nope', '{1,2}', 3);
SELECT * FROM gpu_ivfpq_exact_knn('sf', 'id', '{1,2}', 3);
SELECT * FROM gpu_ivfpq_exact_knn('sf', 'v', '{1,2}', 3);
SELECT * FROM gpu_ivfpq_exact_knn('sf', 'v', '{1,0,0.5,1,0.1,0}', 0);
SELECT * FROM gpu_ivfpq_exact_knn('sf', 'v', '{1,0,0.5,1,0.1,0}', 3, 'hamming');
-- An index that a concurrent build left invalid (marked so here by hand)
-- lacks rows: the functions refuse it, as the planner does.
UPDATE pg_index SET indisvalid = false WHERE indexrelid = 'sf_l2'::regclass;
SELECT * FROM gpu_ivfpq_knn_batch('sf_l2', '{1,0,0.5,1,0.1,0}', 3);
UPDATE pg_index SET indisvalid = true WHERE indexrelid = 'sf_l2'::regclass;

DROP TABLE sf, sfq, sfe, g;
DROP FUNCTION batch_vs_scan(regclass, text), range_vs_seq(regclass, text, float8), exact_vs_seq(text, text);
