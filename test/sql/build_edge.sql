-- Edge cases of building and maintaining the index: NULLs, empty tables,
-- fewer rows than lists, wrong dimensions, identical and duplicate vectors,
-- TRUNCATE, REINDEX (CONCURRENTLY), DROP INDEX, unlogged and temp tables,
-- expression and partial indexes, memory limits.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
RESET client_min_messages;

\i test/sql/knn_function.inc
\i test/sql/explain_function.inc
-- Exact settings: every list probed, every candidate re-ranked.
SET gpu_ivfpq.probes = 65536;
SET gpu_ivfpq.rerank = 1000000;

--
-- NULL embeddings are not indexed and never returned by index scans.
--
CREATE TABLE nulls (id int, v real[]) WITH (autovacuum_enabled = off);
INSERT INTO nulls SELECT i, CASE WHEN i % 3 = 0 THEN NULL ELSE ARRAY[i, i % 5]::real[] END
FROM generate_series(1, 30) i;
CREATE INDEX nulls_idx ON nulls USING gpu_ivfpq (v) WITH (lists = 2);
SELECT knn('SELECT id FROM nulls ORDER BY v <-> ''{0,0}''', true) AS index_ids;
-- A sequential scan also returns the 10 rows with NULL distances (sorted
-- last); the index has no such rows.
SELECT knn('SELECT id FROM nulls ORDER BY v <-> ''{0,0}''', true) =
       knn('SELECT id FROM nulls WHERE v IS NOT NULL ORDER BY v <-> ''{0,0}''', false) AS same_non_null,
       cardinality(knn('SELECT id FROM nulls ORDER BY v <-> ''{0,0}''', false)) AS seqscan_rows;
SELECT knn('SELECT id FROM nulls ORDER BY v <-> ''{0,0}'' LIMIT 5', true) =
       knn('SELECT id FROM nulls ORDER BY v <-> ''{0,0}'' LIMIT 5', false) AS same_top5;
-- NULLs inserted later are skipped too; updating a NULL to a vector indexes it.
INSERT INTO nulls VALUES (100, NULL);
UPDATE nulls SET v = '{0,0}' WHERE id = 3;
SELECT knn('SELECT id FROM nulls ORDER BY v <-> ''{0,0}'' LIMIT 3', true) AS index_ids;
-- VACUUM counts only the indexed rows.
VACUUM nulls;
SELECT reltuples FROM pg_class WHERE relname = 'nulls_idx';
DROP TABLE nulls;

--
-- CREATE INDEX records the table's row count (NULLs included) and the
-- index's entry count (NULLs excluded) in pg_class.
--
CREATE TABLE stats_t (v real[]) WITH (autovacuum_enabled = off);
INSERT INTO stats_t SELECT ARRAY[i, i % 7]::real[] FROM generate_series(1, 500) i;
INSERT INTO stats_t SELECT NULL FROM generate_series(1, 20);
ANALYZE stats_t;
CREATE INDEX stats_idx ON stats_t USING gpu_ivfpq (v) WITH (lists = 4);
SELECT relname, reltuples FROM pg_class WHERE relname IN ('stats_t', 'stats_idx') ORDER BY 1;
REINDEX INDEX stats_idx;
SELECT relname, reltuples FROM pg_class WHERE relname IN ('stats_t', 'stats_idx') ORDER BY 1;
TRUNCATE stats_t;
INSERT INTO stats_t SELECT NULL FROM generate_series(1, 30);
REINDEX INDEX stats_idx;
-- (The table's figure after a REINDEX that follows TRUNCATE is the core's
-- choice, which differs between versions: only the index's is checked.)
SELECT relname, reltuples FROM pg_class WHERE relname = 'stats_idx';
DROP TABLE stats_t;

--
-- A table with only NULLs, or no rows: an untrained index (NOTICE); rows
-- inserted later are stored unquantized and every scan is exact.
--
CREATE TABLE empty_t (id int, v real[]);
CREATE INDEX empty_idx ON empty_t USING gpu_ivfpq (v) WITH (lists = 10);
SELECT knn('SELECT id FROM empty_t ORDER BY v <-> ''{1,2,3}'' LIMIT 5', true) AS no_rows;
-- Any query dimension is accepted while the index has none.
SELECT knn('SELECT id FROM empty_t ORDER BY v <-> ''{1}'' LIMIT 5', true) AS no_rows;
SELECT setseed(0.1);
INSERT INTO empty_t
SELECT i, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 3) WHERE i > 0)
FROM generate_series(1, 200) i;
-- Exact even with one probe and a tiny rerank: nothing is quantized.
SET gpu_ivfpq.probes = 1;
SET gpu_ivfpq.rerank = 1;
SELECT knn('SELECT id FROM empty_t ORDER BY v <-> ''{5,5,5}'' LIMIT 10', true) AS index_ids;
SELECT knn('SELECT id FROM empty_t ORDER BY v <-> ''{5,5,5}'' LIMIT 10', true) =
       knn('SELECT id FROM empty_t ORDER BY v <-> ''{5,5,5}'' LIMIT 10', false) AS same_top10;
SELECT knn('SELECT id FROM empty_t ORDER BY v <-> ''{0,10,0}''', true) =
       knn('SELECT id FROM empty_t ORDER BY v <-> ''{0,10,0}''', false) AS same_all;
SET gpu_ivfpq.probes = 65536;
SET gpu_ivfpq.rerank = 1000000;
-- The first insert fixed the dimension.
INSERT INTO empty_t VALUES (0, '{1,2}');
-- REINDEX trains the quantizers now that there are rows (no NOTICE).
REINDEX INDEX empty_idx;
SELECT knn('SELECT id FROM empty_t ORDER BY v <-> ''{5,5,5}'' LIMIT 10', true) =
       knn('SELECT id FROM empty_t ORDER BY v <-> ''{5,5,5}'' LIMIT 10', false) AS same_top10;
DROP TABLE empty_t;

CREATE TABLE only_nulls (id int, v real[]);
INSERT INTO only_nulls SELECT i, NULL FROM generate_series(1, 10) i;
CREATE INDEX ON only_nulls USING gpu_ivfpq (v);
INSERT INTO only_nulls VALUES (11, '{3,4}'), (12, '{1,1}');
SELECT knn('SELECT id FROM only_nulls ORDER BY v <-> ''{0,0}''', true) AS index_ids;
DROP TABLE only_nulls;

-- The dimension is fixed by the first insert, even one that rolls back
-- (the metapage is not transactional).
CREATE TABLE dim_rollback (id int, v real[]);
CREATE INDEX dim_rollback_idx ON dim_rollback USING gpu_ivfpq (v);
BEGIN;
INSERT INTO dim_rollback VALUES (1, '{1,2,3}');
ROLLBACK;
INSERT INTO dim_rollback VALUES (2, '{1,2}');
INSERT INTO dim_rollback VALUES (3, '{1,2,4}');
SELECT knn('SELECT id FROM dim_rollback ORDER BY v <-> ''{0,0,0}''', true) AS index_ids;
DROP TABLE dim_rollback;

--
-- Fewer rows than lists: NOTICE, and the index works (some lists stay empty).
--
CREATE TABLE few (id int, v real[]);
INSERT INTO few SELECT i, ARRAY[i, (i * 7) % 11, (i * 3) % 5, 1]::real[] FROM generate_series(1, 20) i;
CREATE INDEX few_idx ON few USING gpu_ivfpq (v) WITH (lists = 50);
SELECT knn('SELECT id FROM few ORDER BY v <-> ''{10.3,5.1,2.2,1}''', true) AS index_ids;
SELECT knn('SELECT id FROM few ORDER BY v <-> ''{10.3,5.1,2.2,1}''', true) =
       knn('SELECT id FROM few ORDER BY v <-> ''{10.3,5.1,2.2,1}''', false) AS same_all;
-- With few probes the scan continues into more lists until it has the rows.
SET gpu_ivfpq.probes = 1;
SET gpu_ivfpq.rerank = 1;
SELECT count(*) FROM unnest(knn('SELECT id FROM few ORDER BY v <-> ''{10.3,5.1,2.2,1}'' LIMIT 15', true));
SET gpu_ivfpq.probes = 65536;
SET gpu_ivfpq.rerank = 1000000;
-- A single row, a single list.
CREATE TABLE one_row (id int, v real[]);
INSERT INTO one_row VALUES (1, '{1,2,3,4,5,6,7,8}');
CREATE INDEX ON one_row USING gpu_ivfpq (v) WITH (lists = 1);
SELECT knn('SELECT id FROM one_row ORDER BY v <-> ''{0,0,0,0,0,0,0,0}''', true) AS index_ids;
INSERT INTO one_row VALUES (2, '{0,0,0,0,0,0,0,1}');
SELECT knn('SELECT id FROM one_row ORDER BY v <-> ''{0,0,0,0,0,0,0,0}''', true) AS index_ids;
-- The most lists, for 100 rows.
CREATE TABLE many_lists (id int, v real[]);
INSERT INTO many_lists SELECT i, ARRAY[i, -i]::real[] FROM generate_series(1, 100) i;
CREATE INDEX ON many_lists USING gpu_ivfpq (v) WITH (lists = 65536);
SET gpu_ivfpq.probes = 10;
SET gpu_ivfpq.rerank = 100;
SELECT cardinality(knn('SELECT id FROM many_lists ORDER BY v <-> ''{50.2,-50.1}'' LIMIT 3', true)) AS n3,
       cardinality(knn('SELECT id FROM many_lists ORDER BY v <-> ''{50.2,-50.1}''', true)) AS n_all;
SET gpu_ivfpq.probes = 65536;
SET gpu_ivfpq.rerank = 1000000;
SELECT knn('SELECT id FROM many_lists ORDER BY v <-> ''{50.2,-50.1}''', true) =
       knn('SELECT id FROM many_lists ORDER BY v <-> ''{50.2,-50.1}''', false) AS same_all;
DROP TABLE few, one_row, many_lists;

--
-- Wrong dimensions: an error naming both dimensions, at insert, at build
-- time and for the query vector; invalid vectors are rejected.
--
CREATE TABLE dims (id int, v real[]);
INSERT INTO dims SELECT i, ARRAY[i, -i, i * 2, 0]::real[] FROM generate_series(1, 100) i;
CREATE INDEX dims_idx ON dims USING gpu_ivfpq (v) WITH (lists = 4);
INSERT INTO dims VALUES (1000, '{1,2,3}');
INSERT INTO dims VALUES (1000, '{1,2,3,4,5}');
UPDATE dims SET v = '{1,2}' WHERE id = 1;
INSERT INTO dims VALUES (1000, '{{1,2},{3,4}}');
INSERT INTO dims VALUES (1000, '{}');
INSERT INTO dims VALUES (1000, '{1,2,NULL,4}');
INSERT INTO dims VALUES (1000, '{1,2,NaN,4}');
INSERT INTO dims VALUES (1000, '{1,2,3,Infinity}');
-- Nothing of the failed statements is visible.
SELECT count(*) FROM dims;
SELECT knn('SELECT id FROM dims ORDER BY v <-> ''{0,0,0,0}'' LIMIT 3', true) AS index_ids;
-- Query vectors of the wrong dimension, or invalid, through the index.
SET enable_seqscan = off;
SELECT id FROM dims ORDER BY v <-> '{1,2,3}' LIMIT 1;
SELECT id FROM dims ORDER BY v <-> '{1,2,3,4,5}' LIMIT 1;
SELECT id FROM dims ORDER BY v <-> '{{1,2},{3,4}}' LIMIT 1;
SELECT id FROM dims ORDER BY v <-> '{1,NaN,3,4}' LIMIT 1;
SELECT id FROM dims ORDER BY v <-> '{1,NULL,3,4}' LIMIT 1;
SELECT id FROM dims ORDER BY v <-> '{}' LIMIT 1;
RESET enable_seqscan;
-- Building over rows of different dimensions fails.
CREATE TABLE mixed (v real[]);
INSERT INTO mixed VALUES ('{1,2}'), ('{3,4}'), ('{1,2,3}');
CREATE INDEX ON mixed USING gpu_ivfpq (v) WITH (lists = 1);
-- ... and so does building over NaN or infinite values.
CREATE TABLE nan_t (v real[]);
INSERT INTO nan_t VALUES ('{1,2}'), ('{NaN,4}');
CREATE INDEX ON nan_t USING gpu_ivfpq (v) WITH (lists = 1);
TRUNCATE nan_t;
INSERT INTO nan_t VALUES ('{1,2}'), ('{3,-Infinity}');
CREATE INDEX ON nan_t USING gpu_ivfpq (v) WITH (lists = 1);
-- A vector of more than 16000 dimensions cannot be indexed.
CREATE TABLE wide (id int, v real[]);
INSERT INTO wide SELECT 0, array_fill(1::real, ARRAY[16001]);
CREATE INDEX ON wide USING gpu_ivfpq (v) WITH (lists = 1);
TRUNCATE wide;
CREATE INDEX wide_idx ON wide USING gpu_ivfpq (v) WITH (lists = 1);
INSERT INTO wide SELECT 0, array_fill(1::real, ARRAY[16001]);
-- 16000 dimensions are fine (and TOASTed).
INSERT INTO wide SELECT i, array_fill(i::real, ARRAY[16000]) FROM generate_series(1, 3) i;
SELECT count(*) FROM wide;
SELECT knn('SELECT id FROM wide ORDER BY v <-> array_fill(2.9::real, ARRAY[16000]) LIMIT 3', true) AS index_ids;
SELECT round((v <-> array_fill(2.9::real, ARRAY[16000]))::numeric, 3) AS dist
FROM wide ORDER BY v <-> array_fill(2.9::real, ARRAY[16000]) LIMIT 3;
DROP TABLE dims, mixed, nan_t, wide;

--
-- All-identical vectors: every row is at the same distance; ties come back
-- in TID order, and the scan continues until all rows are returned.
--
CREATE TABLE same (id int, v real[]);
INSERT INTO same SELECT i, '{1,2,3,4}' FROM generate_series(1, 300) i;
CREATE INDEX same_idx ON same USING gpu_ivfpq (v) WITH (lists = 10);
SELECT knn('SELECT id FROM same ORDER BY v <-> ''{0,0,0,0}'' LIMIT 10', true) AS index_ids;
SET gpu_ivfpq.probes = 1;
SET gpu_ivfpq.rerank = 5;
SELECT count(*), count(DISTINCT id) FROM unnest(knn('SELECT id FROM same ORDER BY v <-> ''{0,0,0,0}''', true)) id;
SET gpu_ivfpq.probes = 65536;
SET gpu_ivfpq.rerank = 1000000;
-- Inner product and cosine over identical vectors (cosine of a zero vector
-- is NaN: such rows are returned after all others).
CREATE INDEX same_ip ON same USING gpu_ivfpq (v real_ip_ops) WITH (lists = 3);
CREATE INDEX same_cos ON same USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 3);
SELECT knn('SELECT id FROM same ORDER BY v <#> ''{1,1,1,1}'' LIMIT 3', true) AS ip_ids;
INSERT INTO same VALUES (0, '{0,0,0,0}');
SELECT knn('SELECT id FROM same ORDER BY v <=> ''{1,1,1,1}'' LIMIT 3', true) AS cos_ids;
SELECT (knn('SELECT id FROM same ORDER BY v <=> ''{1,1,1,1}''', true))[301] AS cos_last;
DROP TABLE same;
-- Identical vectors except for one row.
CREATE TABLE same2 (id int, v real[]);
INSERT INTO same2 SELECT i, CASE WHEN i = 77 THEN '{5,5}'::real[] ELSE '{1,1}'::real[] END FROM generate_series(1, 500) i;
CREATE INDEX ON same2 USING gpu_ivfpq (v) WITH (lists = 8);
SET gpu_ivfpq.probes = 1;
SET gpu_ivfpq.rerank = 10;
-- The odd row is found first; which (1,1) copy comes second depends on
-- the quantizer, so only the count is shown.
SELECT (knn('SELECT id FROM same2 ORDER BY v <-> ''{6,6}'' LIMIT 2', true))[1] AS first_id,
       cardinality(knn('SELECT id FROM same2 ORDER BY v <-> ''{6,6}'' LIMIT 2', true)) AS n;
SET gpu_ivfpq.probes = 65536;
SET gpu_ivfpq.rerank = 1000000;
DROP TABLE same2;

--
-- Duplicate vectors: every copy is returned, ties in TID order.
--
CREATE TABLE dup (id int, v real[]);
INSERT INTO dup SELECT i, ARRAY[i % 50, (i % 50) * 2]::real[] FROM generate_series(1, 200) i;
CREATE INDEX dup_idx ON dup USING gpu_ivfpq (v) WITH (lists = 7);
SELECT knn('SELECT id FROM dup ORDER BY v <-> ''{10,20}'' LIMIT 8', true) AS index_ids;
SELECT knn('SELECT id FROM dup ORDER BY v <-> ''{10.4,20.8}'' LIMIT 8', true) AS index_ids;
DROP TABLE dup;

--
-- TRUNCATE, REINDEX, REINDEX CONCURRENTLY, DROP INDEX.
--
SELECT setseed(0.2);
CREATE TABLE items (id int PRIMARY KEY, v real[]);
INSERT INTO items
SELECT i, ARRAY(SELECT (random() * 2 - 1)::real FROM generate_series(1, 8) WHERE i > 0)
FROM generate_series(1, 400) i;
CREATE INDEX items_idx ON items USING gpu_ivfpq (v) WITH (lists = 12, m = 4);
SELECT knn('SELECT id FROM items ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 10', true) AS index_ids;
SELECT knn('SELECT id FROM items ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 10', false) AS seqscan_ids;
SELECT knn('SELECT id FROM items ORDER BY v <-> ''{1,1,1,1,-1,-1,-1,-1}''', true) =
       knn('SELECT id FROM items ORDER BY v <-> ''{1,1,1,1,-1,-1,-1,-1}''', false) AS same_all;
-- REINDEX: same results.
REINDEX INDEX items_idx;
SELECT knn('SELECT id FROM items ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 10', true) AS index_ids;
REINDEX TABLE items;
SELECT knn('SELECT id FROM items ORDER BY v <-> ''{1,1,1,1,-1,-1,-1,-1}''', true) =
       knn('SELECT id FROM items ORDER BY v <-> ''{1,1,1,1,-1,-1,-1,-1}''', false) AS same_all;
-- REINDEX CONCURRENTLY, with a change of options in between.
ALTER INDEX items_idx SET (lists = 5, m = 2);
REINDEX INDEX CONCURRENTLY items_idx;
SELECT indexrelid::regclass, indisvalid, indisready FROM pg_index WHERE indrelid = 'items'::regclass ORDER BY 1;
SELECT knn('SELECT id FROM items ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 10', true) AS index_ids;
SELECT knn('SELECT id FROM items ORDER BY v <-> ''{1,1,1,1,-1,-1,-1,-1}''', true) =
       knn('SELECT id FROM items ORDER BY v <-> ''{1,1,1,1,-1,-1,-1,-1}''', false) AS same_all;
-- CREATE INDEX CONCURRENTLY.
CREATE INDEX CONCURRENTLY items_ip_idx ON items USING gpu_ivfpq (v real_ip_ops) WITH (lists = 6);
SELECT knn('SELECT id FROM items ORDER BY v <#> ''{1,0,0,0,0,0,0,1}''', true) =
       knn('SELECT id FROM items ORDER BY v <#> ''{1,0,0,0,0,0,0,1}''', false) AS same_all_ip;
DROP INDEX CONCURRENTLY items_ip_idx;
-- TRUNCATE empties the index (it becomes untrained: NOTICE); inserts work.
TRUNCATE items;
SELECT knn('SELECT id FROM items ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 10', true) AS no_rows;
INSERT INTO items VALUES (1, '{1,1,1,1,1,1,1,1}'), (2, '{0,0,0,0,0,0,0,0}'), (3, '{0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5}');
SELECT knn('SELECT id FROM items ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 10', true) AS index_ids;
-- TRUNCATE in a transaction that rolls back keeps the old index.
BEGIN;
TRUNCATE items;
ROLLBACK;
SELECT knn('SELECT id FROM items ORDER BY v <-> ''{1,1,1,1,1,1,1,1}'' LIMIT 10', true) AS index_ids;
-- DROP INDEX: a rolled-back drop keeps the index; afterwards a seq scan.
BEGIN;
DROP INDEX items_idx;
ROLLBACK;
SELECT knn('SELECT id FROM items ORDER BY v <-> ''{1,1,1,1,1,1,1,1}'' LIMIT 10', true) AS index_ids;
DROP INDEX items_idx;
SET enable_seqscan = off;
SELECT * FROM explain_plan($q$SELECT id FROM items ORDER BY v <-> '{1,1,1,1,1,1,1,1}' LIMIT 10$q$) AS "QUERY PLAN";
RESET enable_seqscan;
DROP TABLE items;

-- A new table, index and TRUNCATE in one transaction (the index is rebuilt
-- in place, with a new build id), then REINDEX: no stale model is used.
BEGIN;
CREATE TABLE tx (id int, v real[]);
INSERT INTO tx SELECT i, ARRAY[i, 0]::real[] FROM generate_series(1, 50) i;
CREATE INDEX tx_idx ON tx USING gpu_ivfpq (v) WITH (lists = 4);
SELECT knn('SELECT id FROM tx ORDER BY v <-> ''{10,0}'' LIMIT 3', true) AS index_ids;
TRUNCATE tx;
INSERT INTO tx SELECT i, ARRAY[0, i]::real[] FROM generate_series(1, 50) i;
REINDEX INDEX tx_idx;
SELECT knn('SELECT id FROM tx ORDER BY v <-> ''{0,20}'' LIMIT 3', true) AS index_ids;
COMMIT;
DROP TABLE tx;

--
-- Unlogged and temporary tables.
--
CREATE UNLOGGED TABLE unlogged_t (id int, v real[]);
INSERT INTO unlogged_t SELECT i, ARRAY[i, 100 - i, i % 10]::real[] FROM generate_series(1, 100) i;
CREATE INDEX unlogged_idx ON unlogged_t USING gpu_ivfpq (v) WITH (lists = 4);
SELECT relpersistence FROM pg_class WHERE relname = 'unlogged_idx';
-- The init fork (an empty untrained index) is two pages.
SELECT pg_relation_size('unlogged_idx', 'init') / current_setting('block_size')::int AS init_pages;
SELECT knn('SELECT id FROM unlogged_t ORDER BY v <-> ''{10,90,0}'' LIMIT 3', true) AS index_ids;
INSERT INTO unlogged_t VALUES (101, '{10,90,1}');
SELECT knn('SELECT id FROM unlogged_t ORDER BY v <-> ''{10,90,0}'' LIMIT 3', true) AS index_ids;
REINDEX INDEX unlogged_idx;
SELECT knn('SELECT id FROM unlogged_t ORDER BY v <-> ''{10,90,0}'' LIMIT 3', true) AS index_ids;
ALTER TABLE unlogged_t SET LOGGED;
SELECT relpersistence FROM pg_class WHERE relname = 'unlogged_idx';
SELECT knn('SELECT id FROM unlogged_t ORDER BY v <-> ''{10,90,0}'' LIMIT 3', true) AS index_ids;
ALTER TABLE unlogged_t SET UNLOGGED;
SELECT knn('SELECT id FROM unlogged_t ORDER BY v <-> ''{10,90,0}'' LIMIT 3', true) AS index_ids;
DROP TABLE unlogged_t;
-- An unlogged table created empty.
CREATE UNLOGGED TABLE unlogged_empty (id int, v real[]);
CREATE INDEX ON unlogged_empty USING gpu_ivfpq (v);
INSERT INTO unlogged_empty VALUES (1, '{1,1}'), (2, '{2,2}');
SELECT knn('SELECT id FROM unlogged_empty ORDER BY v <-> ''{2,2}''', true) AS index_ids;
DROP TABLE unlogged_empty;
CREATE TEMP TABLE temp_t (id int, v real[]);
INSERT INTO temp_t SELECT i, ARRAY[i, -i]::real[] FROM generate_series(1, 100) i;
CREATE INDEX ON temp_t USING gpu_ivfpq (v) WITH (lists = 5);
SELECT knn('SELECT id FROM temp_t ORDER BY v <-> ''{50,-50}'' LIMIT 3', true) AS index_ids;
INSERT INTO temp_t VALUES (0, '{50,-50}');
SELECT knn('SELECT id FROM temp_t ORDER BY v <-> ''{50,-50}'' LIMIT 3', true) AS index_ids;
DROP TABLE temp_t;
-- A temporary table emptied at every commit (ON COMMIT DELETE ROWS) has its
-- index rebuilt then: the NOTICE about a table without vectors comes in the
-- transaction that creates the index (here twice: its commit empties the
-- table too), not again at later commits.
CREATE TEMP TABLE temp_oc (id int, v real[]) ON COMMIT DELETE ROWS;
CREATE INDEX temp_oc_v ON temp_oc USING gpu_ivfpq (v);
BEGIN;
INSERT INTO temp_oc SELECT i, ARRAY[i, -i]::real[] FROM generate_series(1, 10) i;
SELECT knn('SELECT id FROM temp_oc ORDER BY v <-> ''{5,-5}'' LIMIT 3', true) AS index_ids;
COMMIT;
BEGIN;
INSERT INTO temp_oc VALUES (7, '{7,-7}');
SELECT knn('SELECT id FROM temp_oc ORDER BY v <-> ''{5,-5}'' LIMIT 3', true) AS index_ids;
COMMIT;
SELECT count(*) AS rows_after_commit FROM temp_oc;
DROP TABLE temp_oc;
-- A concurrent build on an empty table says so too (its build runs in a
-- transaction after the one that created the index).
CREATE TABLE empty_c (id int, v real[]);
CREATE INDEX CONCURRENTLY empty_c_v ON empty_c USING gpu_ivfpq (v);
REINDEX INDEX CONCURRENTLY empty_c_v;
DROP TABLE empty_c;

--
-- Expression and partial indexes.
--
CREATE TABLE expr (id int, a real, b real);
INSERT INTO expr SELECT i, i, i % 10 FROM generate_series(1, 100) i;
CREATE INDEX expr_idx ON expr USING gpu_ivfpq ((ARRAY[a, b])) WITH (lists = 4);
SELECT knn('SELECT id FROM expr ORDER BY ARRAY[a, b] <-> ''{20.2,3.1}'' LIMIT 4', true) AS index_ids;
SELECT knn('SELECT id FROM expr ORDER BY ARRAY[a, b] <-> ''{20.2,3.1}'' LIMIT 4', false) AS seqscan_ids;
DROP INDEX expr_idx;
CREATE TABLE part (id int, v real[]);
INSERT INTO part SELECT i, ARRAY[i, i]::real[] FROM generate_series(1, 100) i;
CREATE INDEX part_idx ON part USING gpu_ivfpq (v) WITH (lists = 4) WHERE id % 2 = 0;
SELECT knn('SELECT id FROM part WHERE id % 2 = 0 ORDER BY v <-> ''{50.1,50.1}'' LIMIT 4', true) AS index_ids;
-- A query without the partial index's predicate cannot use it.
SELECT knn('SELECT id FROM part ORDER BY v <-> ''{50.1,50.1}'' LIMIT 4', false) AS seqscan_ids;
INSERT INTO part VALUES (1000, '{51,51}'), (1001, '{51,51}');
SELECT knn('SELECT id FROM part WHERE id % 2 = 0 ORDER BY v <-> ''{50.1,50.1}'' LIMIT 4', true) AS index_ids;
DROP TABLE expr, part;

--
-- maintenance_work_mem bounds the build's memory.
--
-- What a build needs comes from the rows there are: a few rows of many
-- dimensions build in little memory (the training sample is no larger than
-- the rows, the encoding buffers no larger than a batch of them); a table
-- with more rows than the sample may hold in memory, too few to train the
-- lists, is refused, with the figures.
SET gpu_ivfpq.rerank = 10;
CREATE TABLE big_dim (v real[]);
INSERT INTO big_dim SELECT array_fill(i::real, ARRAY[784]) FROM generate_series(1, 10) i;
SET maintenance_work_mem = '1MB';
CREATE INDEX big_dim_small ON big_dim USING gpu_ivfpq (v) WITH (lists = 1);
SELECT count(*) FROM gpu_ivfpq_knn_batch('big_dim_small', ARRAY[array_fill(3::real, ARRAY[784])], 3);
DROP INDEX big_dim_small;
INSERT INTO big_dim SELECT array_fill(i::real, ARRAY[784]) FROM generate_series(11, 300) i;
CREATE INDEX ON big_dim USING gpu_ivfpq (v) WITH (lists = 30);
RESET maintenance_work_mem;
CREATE INDEX big_dim_idx ON big_dim USING gpu_ivfpq (v) WITH (lists = 30);
-- The list centroids' memory follows the options, not the rows: 65536
-- lists of 784 dimensions need about 400 MB whatever the table holds.
SET maintenance_work_mem = '64MB';
CREATE INDEX ON big_dim USING gpu_ivfpq (v) WITH (lists = 65536, store_vectors = off);
RESET maintenance_work_mem;
DROP TABLE big_dim;
-- One row of 2000 dimensions at 5MB, with the default 100 lists.
CREATE TABLE one_row (v real[]);
INSERT INTO one_row SELECT array_fill(1::real, ARRAY[2000]);
SET maintenance_work_mem = '5MB';
CREATE INDEX one_row_idx ON one_row USING gpu_ivfpq (v);
RESET maintenance_work_mem;
-- The largest rerank asks for no more candidates than the index can hold
-- (no allocation of rerank x dimension floats).
SET gpu_ivfpq.rerank = 1000000;
SELECT query, rank, distance FROM gpu_ivfpq_knn_batch('one_row_idx', ARRAY[array_fill(1::real, ARRAY[2000])], 1);
SET client_min_messages = warning;
SELECT count(*) FROM gpu_ivfpq_knn_graph('one_row_idx', 1);
RESET client_min_messages;
SET enable_seqscan = off;
SELECT v <-> array_fill(1::real, ARRAY[2000]) AS distance FROM one_row ORDER BY v <-> array_fill(1::real, ARRAY[2000]) LIMIT 1;
RESET enable_seqscan;
DROP TABLE one_row;
RESET gpu_ivfpq.rerank;

--
-- A build keeps the rows of its first pass while they fit a quarter of
-- maintenance_work_mem and encodes them from memory, else it reads the table
-- again; with little memory it also writes the lists in several flushes,
-- each one linking new pages from every list's last page. Every way, the
-- index holds each row once and the exact settings give the sequential
-- scan's answers.
CREATE TABLE passes (id int, v real[]) WITH (autovacuum_enabled = off);
INSERT INTO passes SELECT i, ARRAY[sin(i), cos(i * 1.3), sin(i * 0.7), cos(i * 0.11)]::real[]
FROM generate_series(1, 40000) i;
SET maintenance_work_mem = '64MB';
CREATE INDEX passes_once ON passes USING gpu_ivfpq (v) WITH (lists = 16);
SELECT gpu_ivfpq_check('passes_once', true);
SELECT knn('SELECT id FROM passes ORDER BY v <-> ''{0.5,0.5,0,-0.5}'' LIMIT 20', true) =
       knn('SELECT id FROM passes ORDER BY v <-> ''{0.5,0.5,0,-0.5}'' LIMIT 20', false) AS once_exact;
DROP INDEX passes_once;
SET maintenance_work_mem = '1MB';
CREATE INDEX passes_twice ON passes USING gpu_ivfpq (v) WITH (lists = 16);
SELECT gpu_ivfpq_check('passes_twice', true);
SELECT knn('SELECT id FROM passes ORDER BY v <-> ''{0.5,0.5,0,-0.5}'' LIMIT 20', true) =
       knn('SELECT id FROM passes ORDER BY v <-> ''{0.5,0.5,0,-0.5}'' LIMIT 20', false) AS twice_exact;
RESET maintenance_work_mem;
DROP TABLE passes;

--
-- Large tables are read over parallel workers (as many as
-- max_parallel_maintenance_workers and the table's size allow). Rows that
-- fit in memory are then sampled and encoded in TID order, so the index is
-- the one a serial read builds; rows that do not are sampled and encoded as
-- they come. Either way every row is indexed once, and a vector a worker
-- cannot index fails the build with the worker's error.
CREATE TABLE par (id int, v real[], t int) WITH (autovacuum_enabled = off);
INSERT INTO par SELECT i, ARRAY[sin(i), cos(i * 1.3), sin(i * 0.7), cos(i * 0.11),
                                sin(i * 0.3), cos(i * 0.05), sin(i * 1.7), cos(i * 2.1)]::real[], i % 5
FROM generate_series(1, 100000) i;
SET min_parallel_table_scan_size = 0;
SET maintenance_work_mem = '256MB';  -- room for two workers (32MB a participant)
SET max_parallel_maintenance_workers = 0;
CREATE INDEX par_serial ON par USING gpu_ivfpq (v, t) WITH (lists = 32, m = 1);
SET max_parallel_maintenance_workers = 2;
CREATE INDEX par_parallel ON par USING gpu_ivfpq (v, t) WITH (lists = 32, m = 1);
SELECT gpu_ivfpq_check('par_parallel', true);
-- Approximate settings: the two indexes give the same candidates.
SET gpu_ivfpq.probes = 1;
SET gpu_ivfpq.rerank = 10;
WITH q AS (SELECT array_agg(v ORDER BY id) AS a FROM par WHERE id % 2000 = 0)
SELECT (SELECT array_agg(b ORDER BY query, rank) FROM gpu_ivfpq_knn_batch('par_serial', (SELECT a FROM q), 10) b) =
       (SELECT array_agg(b ORDER BY query, rank) FROM gpu_ivfpq_knn_batch('par_parallel', (SELECT a FROM q), 10) b)
       AS same_index;
SET gpu_ivfpq.probes = 65536;
SET gpu_ivfpq.rerank = 1000000;
DROP INDEX par_serial;
SELECT knn('SELECT id FROM par WHERE t = 3 ORDER BY v <-> ''{0.5,0.5,0,-0.5,0,0,0,0}'' LIMIT 20', true) =
       knn('SELECT id FROM par WHERE t = 3 ORDER BY v <-> ''{0.5,0.5,0,-0.5,0,0,0,0}'' LIMIT 20', false)
       AS parallel_exact;
DROP INDEX par_parallel;
-- Rows too many for a quarter of maintenance_work_mem: read twice, in parallel.
CREATE TABLE par_wide (id int, v real[]) WITH (autovacuum_enabled = off);
INSERT INTO par_wide SELECT i, array(SELECT sin(i * 0.01 * j) FROM generate_series(1, 256) j)::real[]
FROM generate_series(1, 20000) i;
SET maintenance_work_mem = '64MB';
CREATE INDEX par_wide_idx ON par_wide USING gpu_ivfpq (v) WITH (lists = 16, m = 16);
SELECT gpu_ivfpq_check('par_wide_idx', true);
SELECT knn('SELECT id FROM par_wide ORDER BY v <-> (SELECT v FROM par_wide WHERE id = 777) LIMIT 10', true) =
       knn('SELECT id FROM par_wide ORDER BY v <-> (SELECT v FROM par_wide WHERE id = 777) LIMIT 10', false)
       AS twice_parallel_exact;
DROP INDEX par_wide_idx;
-- A worker's error is the build's.
UPDATE par SET v[3] = 'NaN' WHERE id = 9999;
CREATE INDEX par_bad ON par USING gpu_ivfpq (v) WITH (lists = 32, m = 1);
-- A vector wider than any index takes, read by a worker: the same error
-- as a serial build's, checked before the worker copies it.
UPDATE par SET v = array_fill(0.5::real, ARRAY[100000]) WHERE id = 9999;
CREATE INDEX par_bad ON par USING gpu_ivfpq (v) WITH (lists = 32, m = 1);
RESET maintenance_work_mem;
RESET max_parallel_maintenance_workers;
RESET min_parallel_table_scan_size;
DROP TABLE par, par_wide;

DROP FUNCTION knn(text, bool), explain_plan(text);
