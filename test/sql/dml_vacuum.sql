-- DML on an indexed table: UPDATE, DELETE, rolled-back inserts, VACUUM
-- removing dead entries, and inserts reusing the space VACUUM freed.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
RESET client_min_messages;

\i test/sql/knn_function.inc
-- same_as_seqscan(query): the index scan returns what the sequential scan does.
CREATE FUNCTION same_as_seqscan(query text) RETURNS bool LANGUAGE sql AS $$
	SELECT knn(query, true) = knn(query, false)
$$;

-- Exact settings: every list probed, every candidate re-ranked.
SET gpu_ivfpq.probes = 65536;
SET gpu_ivfpq.rerank = 1000000;

-- 3000 rows of 8 dimensions in 2 lists: each list is a chain of several
-- pages (582 entries of 14 bytes fit on a page). Autovacuum is off so
-- that VACUUM runs only where the test says.
SELECT setseed(0.7);
CREATE TABLE t (id int, tag text, v real[]) WITH (autovacuum_enabled = off);
INSERT INTO t
SELECT i, 'x', ARRAY(SELECT (random() * 4 - 2)::real FROM generate_series(1, 8) WHERE i > 0)
FROM generate_series(1, 3000) i;
-- The vectors of the rows, to insert them again later.
CREATE TABLE t_saved WITH (autovacuum_enabled = off) AS SELECT id, v FROM t;
CREATE INDEX t_idx ON t USING gpu_ivfpq (v) WITH (lists = 2, m = 8);
SELECT pg_relation_size('t_idx') AS size0 \gset
SELECT same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 20') AS same_top20,
       same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{1,-1,1,-1,1,-1,1,-1}''') AS same_all;

--
-- UPDATE.
--
-- Of another column (a HOT update: no new index entry, the index entry
-- leads to the new row version).
UPDATE t SET tag = 'hot' WHERE id = 5;
SET enable_seqscan = off;
SELECT id, tag FROM t ORDER BY v <-> (SELECT v FROM t_saved WHERE id = 5) LIMIT 1;
-- Of the embedding: the row is found at its new place, not at the old one.
UPDATE t SET v = '{9,9,9,9,9,9,9,9}' WHERE id = 7;
SELECT id FROM t ORDER BY v <-> '{9,9,9,9,9,9,9,9}' LIMIT 1;
SELECT id FROM t ORDER BY v <-> (SELECT v FROM t_saved WHERE id = 7) LIMIT 1;
SELECT count(*) FROM (SELECT id FROM t ORDER BY v <-> '{0,0,0,0,0,0,0,0}') x WHERE id = 7;
RESET enable_seqscan;
-- Of many embeddings (mirrored), then back.
UPDATE t SET v = ARRAY(SELECT -x FROM unnest(v) x) WHERE id % 4 = 0;
SELECT same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5}''') AS same_all;
UPDATE t SET v = s.v FROM t_saved s WHERE s.id = t.id AND t.id % 4 = 0;
SELECT same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{0.5,0.5,0.5,0.5,0.5,0.5,0.5,0.5}''') AS same_all;
-- To NULL (no longer returned by the index) and back.
UPDATE t SET v = NULL WHERE id = 9;
SELECT 9 = ANY (knn('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}''', true)) AS found_9;
UPDATE t SET v = s.v FROM t_saved s WHERE s.id = t.id AND t.id IN (7, 9);
SELECT 9 = ANY (knn('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}''', true)) AS found_9;
SELECT same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}''') AS same_all;
-- A wrong dimension in an UPDATE fails and changes nothing.
UPDATE t SET v = '{1,2,3}' WHERE id = 10;
SELECT v = (SELECT v FROM t_saved WHERE id = 10) AS unchanged FROM t WHERE id = 10;

--
-- DELETE and rolled-back INSERT: the rows are not returned, before and
-- after VACUUM; VACUUM removes their entries.
--
DELETE FROM t WHERE id % 10 = 1;
SELECT count(*) AS rows_left FROM t;
SELECT cardinality(knn('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}''', true)) AS index_rows,
       same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}''') AS same_all;
BEGIN;
INSERT INTO t SELECT 10000 + i, 'aborted', '{0,0,0,0,0,0,0,0}' FROM generate_series(1, 50) i;
-- Visible inside the transaction ...
SELECT count(*) FROM unnest(knn('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 60', true)) id WHERE id > 10000;
ROLLBACK;
-- ... not after the rollback.
SELECT count(*) FROM unnest(knn('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}''', true)) id WHERE id > 10000;
-- Deleted in this transaction: no longer returned by this transaction.
BEGIN;
DELETE FROM t WHERE id = (SELECT (knn('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 1', true))[1]);
SELECT same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 5') AS same_top5;
ROLLBACK;
-- The updates and deletes left dead entries; VACUUM removes them: the index
-- then holds as many entries as the table has rows (reltuples of the index
-- is the count of its entries after VACUUM).
VACUUM t;
SELECT (SELECT reltuples FROM pg_class WHERE relname = 't_idx') AS index_entries,
       (SELECT count(*) FROM t) AS table_rows;
SELECT same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}''') AS same_all;
-- The index grew with the new row versions of the UPDATEs.
SELECT pg_relation_size('t_idx') > :size0 AS grew;

--
-- DELETE + VACUUM + INSERT of the same rows, several times: the index stays
-- correct and does not grow (inserts fill the space VACUUM freed).
--
-- The 300 rows deleted above go back into the space of their entries.
SELECT pg_relation_size('t_idx') AS size1 \gset
INSERT INTO t SELECT id, 'x', v FROM t_saved WHERE id % 10 = 1;
SELECT pg_relation_size('t_idx') = :size1 AS same_size;
-- A contiguous range of rows.
DELETE FROM t WHERE id > 1500;
VACUUM t;
INSERT INTO t SELECT id, 'x', v FROM t_saved WHERE id > 1500;
SELECT pg_relation_size('t_idx') = :size1 AS same_size,
       same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{-1,0,1,0,-1,0,1,0}''') AS same_all;
-- Every other row (free space on every page of every list).
DELETE FROM t WHERE id % 2 = 0;
VACUUM t;
INSERT INTO t SELECT id, 'x', v FROM t_saved WHERE id % 2 = 0;
SELECT pg_relation_size('t_idx') = :size1 AS same_size,
       same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{-1,0,1,0,-1,0,1,0}''') AS same_all;
-- Every row, twice.
DELETE FROM t;
VACUUM t;
SELECT (SELECT reltuples FROM pg_class WHERE relname = 't_idx') AS index_entries,
       knn('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}''', true) AS no_rows;
INSERT INTO t SELECT id, 'x', v FROM t_saved;
DELETE FROM t;
VACUUM t;
INSERT INTO t SELECT id, 'x', v FROM t_saved;
SELECT pg_relation_size('t_idx') = :size1 AS same_size,
       same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{2,2,2,2,-2,-2,-2,-2}''') AS same_all;
-- VACUUM without dead rows changes nothing.
VACUUM t;
SELECT (SELECT reltuples FROM pg_class WHERE relname = 't_idx') AS index_entries,
       pg_relation_size('t_idx') = :size1 AS same_size;
-- 6000 more rows (shifted copies): more than the index has room for, it grows.
INSERT INTO t SELECT id + 3000, 'x', ARRAY(SELECT x + 0.001 FROM unnest(v) x) FROM t_saved;
INSERT INTO t SELECT id + 6000, 'x', ARRAY(SELECT x + 0.002 FROM unnest(v) x) FROM t_saved;
SELECT pg_relation_size('t_idx') > :size1 AS grew,
       same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{2,2,2,2,-2,-2,-2,-2}''') AS same_all;
-- VACUUM with INDEX_CLEANUP OFF leaves the index alone; the dead rows stay
-- invisible all the same.
DELETE FROM t WHERE id > 3000;
VACUUM (INDEX_CLEANUP OFF) t;
SELECT cardinality(knn('SELECT id FROM t ORDER BY v <-> ''{0,0,0,0,0,0,0,0}''', true)) AS index_rows;
VACUUM (INDEX_CLEANUP ON) t;
SELECT (SELECT reltuples FROM pg_class WHERE relname = 't_idx') AS index_entries;
-- VACUUM FULL rebuilds the index (same size for the same rows).
VACUUM FULL t;
SELECT pg_relation_size('t_idx') = :size0 AS same_size,
       same_as_seqscan('SELECT id FROM t ORDER BY v <-> ''{2,2,2,2,-2,-2,-2,-2}''') AS same_all;
-- CLUSTER cannot use this index.
CLUSTER t USING t_idx;
DROP TABLE t, t_saved;

--
-- The same on an untrained index (built on an empty table): entries
-- without codes, in one list.
--
CREATE TABLE u (id int, v real[]) WITH (autovacuum_enabled = off);
CREATE INDEX u_idx ON u USING gpu_ivfpq (v);
INSERT INTO u SELECT i, ARRAY[i % 37, i % 41, i % 43, i]::real[] FROM generate_series(1, 3000) i;
SELECT pg_relation_size('u_idx') AS usize0 \gset
DELETE FROM u WHERE id % 3 = 0;
VACUUM u;
SELECT (SELECT reltuples FROM pg_class WHERE relname = 'u_idx') AS index_entries;
INSERT INTO u SELECT i, ARRAY[i % 37, i % 41, i % 43, i]::real[] FROM generate_series(1, 3000) i WHERE i % 3 = 0;
SELECT pg_relation_size('u_idx') = :usize0 AS same_size,
       same_as_seqscan('SELECT id FROM u ORDER BY v <-> ''{10.31,20.77,30.13,1234.57}''') AS same_all;
DROP TABLE u;

--
-- Entries of rows the scan cannot see (inserts rolled back, before VACUUM)
-- come first from the vector copies; the executor drops them, and they must
-- not hold back the live rows a wider round finds nearer (strict order).
--
SELECT setseed(0.7);
CREATE TABLE r1 (id int, v real[]) WITH (autovacuum_enabled = off);
INSERT INTO r1 SELECT i, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 8) WHERE i > 0)
FROM generate_series(1, 2000) i;
CREATE INDEX r1_v ON r1 USING gpu_ivfpq (v) WITH (lists = 16, m = 4);
BEGIN; INSERT INTO r1 SELECT 10000 + i, ARRAY[i * 0.01, 0, 0, 0, 0, 0, 0, 0]::real[] FROM generate_series(1, 50) i; ROLLBACK;
BEGIN; INSERT INTO r1 SELECT 10000 + i, ARRAY[i * 0.01, 0, 0, 0, 0, 0, 0, 0]::real[] FROM generate_series(1, 50) i; ROLLBACK;
BEGIN; INSERT INTO r1 SELECT 10000 + i, ARRAY[i * 0.01, 0, 0, 0, 0, 0, 0, 0]::real[] FROM generate_series(1, 50) i; ROLLBACK;
INSERT INTO r1 SELECT 10000 + i, ARRAY[i * 0.01, 0, 0, 0, 0, 0, 0, 0]::real[] FROM generate_series(1, 50) i;
SELECT knn('SELECT id FROM r1 ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 3', true) AS after_aborted_inserts,
       knn('SELECT id FROM r1 ORDER BY v <-> ''{0,0,0,0,0,0,0,0}'' LIMIT 3', false) AS seqscan;
DROP TABLE r1;

--
-- Entries the snapshot cannot see do not count against
-- gpu_ivfpq.max_scan_tuples: 3000 rolled-back inserts nearer the query
-- than every live row end no scan (or batch search) before it finds them,
-- with and without vector copies and with RaBitQ codes.
--
CREATE TABLE r2 (id int, v real[]) WITH (autovacuum_enabled = off);
INSERT INTO r2 SELECT i, ARRAY[i % 97, i % 89, i % 83, i % 79]::real[] FROM generate_series(1, 1000) i;
CREATE INDEX r2_copies ON r2 USING gpu_ivfpq (v) WITH (lists = 4, m = 2);
CREATE INDEX r2_heap ON r2 USING gpu_ivfpq (v) WITH (lists = 4, m = 2, store_vectors = off);
CREATE INDEX r2_rabitq ON r2 USING gpu_ivfpq (v) WITH (lists = 4, codes = rabitq);
BEGIN;
INSERT INTO r2 SELECT 0, array_fill((200 + g * 0.00001)::real, ARRAY[4]) FROM generate_series(1, 3000) g;
ROLLBACK;
SET gpu_ivfpq.probes = 4;
SET gpu_ivfpq.max_scan_tuples = 500;
SELECT knn('SELECT id FROM r2 ORDER BY v <-> ''{200,200,200,200}'' LIMIT 5', false) AS seqscan;
UPDATE pg_index SET indisvalid = false WHERE indexrelid IN ('r2_heap'::regclass, 'r2_rabitq'::regclass);
SELECT knn('SELECT id FROM r2 ORDER BY v <-> ''{200,200,200,200}'' LIMIT 5', true) AS copies;
UPDATE pg_index SET indisvalid = (indexrelid = 'r2_heap'::regclass) WHERE indrelid = 'r2'::regclass;
SELECT knn('SELECT id FROM r2 ORDER BY v <-> ''{200,200,200,200}'' LIMIT 5', true) AS from_heap;
UPDATE pg_index SET indisvalid = (indexrelid = 'r2_rabitq'::regclass) WHERE indrelid = 'r2'::regclass;
SELECT knn('SELECT id FROM r2 ORDER BY v <-> ''{200,200,200,200}'' LIMIT 5', true) AS rabitq;
UPDATE pg_index SET indisvalid = true WHERE indrelid = 'r2'::regclass;
SELECT i, (SELECT array_agg(r.id ORDER BY b.rank) FROM gpu_ivfpq_knn_batch(i, '{200,200,200,200}'::real[], 5) b
           JOIN r2 r ON r.ctid = b.tid) AS batch
  FROM unnest(ARRAY['r2_copies', 'r2_heap', 'r2_rabitq']::regclass[]) i;
RESET gpu_ivfpq.probes;
RESET gpu_ivfpq.max_scan_tuples;
DROP TABLE r2;

DROP FUNCTION same_as_seqscan(text);
DROP FUNCTION knn(text, bool);
