-- Cosine distance with a zero vector is NaN, and every search sorts NaN
-- after every number, as ORDER BY does: the index scan, batch k-NN and exact
-- search return the same order (distance, then ctid) with NaN rows last.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
CREATE TABLE zv (id int PRIMARY KEY, v real[]);
INSERT INTO zv SELECT i, CASE WHEN i % 20 = 0 THEN '{0,0,0,0}'::real[]
	ELSE ARRAY[sin(i), cos(i), sin(i * 0.3), cos(i * 0.7)]::real[] END
FROM generate_series(1, 400) i;
CREATE INDEX zv_cos ON zv USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 4, m = 2);
SET gpu_ivfpq.probes = 4;
SET gpu_ivfpq.rerank = 1000;
CREATE TABLE zq AS SELECT i AS q, ARRAY[cos(i), sin(i * 2), 0.5, cos(i * 3)]::real[] AS v
FROM generate_series(1, 5) i;

-- The reference: a sequential scan's order, NaN last, ties by ctid.
CREATE TABLE zref AS
SELECT zq.q, row_number() OVER (PARTITION BY zq.q ORDER BY zv.v <=> zq.v, zv.ctid) AS rank, zv.ctid AS tid
FROM zq, zv;

-- Batch k-NN over every row: same rows in the same order.
SELECT count(*) AS batch_rows,
       count(*) FILTER (WHERE b.tid = zref.tid) AS batch_same_order,
       count(*) FILTER (WHERE b.distance = 'NaN') AS batch_nan_rows
FROM gpu_ivfpq_knn_batch('zv_cos', (SELECT array_agg(v ORDER BY q) FROM zq), 400) b
JOIN zref ON zref.q = b.query AND zref.rank = b.rank;

-- Exact search: same.
SELECT count(*) AS exact_rows,
       count(*) FILTER (WHERE e.tid = zref.tid) AS exact_same_order,
       count(*) FILTER (WHERE e.distance = 'NaN') AS exact_nan_rows
FROM gpu_ivfpq_exact_knn('zv', 'v', (SELECT array_agg(v ORDER BY q) FROM zq), 400, 'cosine') e
JOIN zref ON zref.q = e.query AND zref.rank = e.rank;

-- The index scan: same.
SET enable_seqscan = off;
SELECT count(*) AS scan_rows, count(*) FILTER (WHERE s.tid = zref.tid) AS scan_same_order
FROM zq CROSS JOIN LATERAL (SELECT zv.ctid AS tid, row_number() OVER () AS rank
                  FROM (SELECT ctid FROM zv ORDER BY v <=> zq.v LIMIT 400) zv) s
JOIN zref ON zref.q = zq.q AND zref.rank = s.rank;
RESET enable_seqscan;

-- A zero query vector: every distance NaN, rows by ctid.
SELECT count(*) AS zero_query_rows, bool_and(distance = 'NaN') AS all_nan
FROM gpu_ivfpq_knn_batch('zv_cos', '{0,0,0,0}', 10);

-- A scan in rounds (default probes and rerank) where zero vectors' codes
-- outrank real neighbours: a round another may follow returns no NaN row
-- (it sorts after every number, which a later round may still find), so
-- the first 500 rows are the 500 numbers, as the sequential scan's.
RESET gpu_ivfpq.probes;
RESET gpu_ivfpq.rerank;
SELECT setseed(0.11);
CREATE TABLE zr (id int, v real[]);
INSERT INTO zr SELECT i, CASE WHEN i % 3 = 0 THEN '{0,0,0,0}'::real[]
	ELSE ARRAY[random() - 0.5, random() - 0.5, random() - 0.5, random() - 0.5]::real[] END
FROM generate_series(1, 3000) i;
CREATE INDEX zr_cos ON zr USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 8, m = 2);
SET enable_seqscan = off;
SELECT count(*) FILTER (WHERE id % 3 = 0) AS rounds_nan_rows, count(*) AS rounds_rows
FROM (SELECT id FROM zr ORDER BY v <=> '{0.3,0.1,-0.2,0.4}' LIMIT 500) s;
RESET enable_seqscan;
DROP TABLE zr;

DROP TABLE zv, zq, zref;
