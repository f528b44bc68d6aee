-- Index scans read list pages through the backend's buffer hints (am.h,
-- GpuIvfpqBufferHints: the shared buffer that last held each block). The
-- answers stay those of a sequential scan while the hints go stale: lists
-- grown by inserts past the blocks hinted so far, pages emptied by VACUUM,
-- a REINDEX and a TRUNCATE (new files, the same block numbers), a
-- temporary table (local buffers: no hints). The rows' vectors are all
-- different, so the order is the distances' alone. Every list is probed and every entry
-- re-ranked, so an index scan must return exactly the sequential scan's rows.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
RESET client_min_messages;

\i test/sql/knn_function.inc
SELECT setseed(0.17);
CREATE TABLE h (id int, v real[]) WITH (autovacuum_enabled = off);
INSERT INTO h
SELECT i, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 32) WHERE i > 0)
FROM generate_series(1, 1500) i;
CREATE TABLE hq (qid int, qv real[]);
INSERT INTO hq
SELECT i, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 32) WHERE i > 0)
FROM generate_series(1, 5) i;
CREATE INDEX h_idx ON h USING gpu_ivfpq (v) WITH (lists = 4, m = 8);
SET gpu_ivfpq.probes = 4;
SET gpu_ivfpq.rerank = 10000;

-- The queries whose index scan differs from the sequential scan (none expected).
CREATE FUNCTION h_mismatches(tab text) RETURNS int[] LANGUAGE sql AS $$
	SELECT coalesce(array_agg(qid ORDER BY qid), '{}') FROM hq
	WHERE knn(format('SELECT id FROM %I ORDER BY v <-> %L::real[] LIMIT 10', tab, qv), true)
	   IS DISTINCT FROM knn(format('SELECT id FROM %I ORDER BY v <-> %L::real[] LIMIT 10', tab, qv), false)
$$;

SELECT h_mismatches('h') AS fresh;
-- Twice as many rows: the lists' chains grow into new blocks.
INSERT INTO h
SELECT i, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 32) WHERE i > 0)
FROM generate_series(1501, 3000) i;
SELECT h_mismatches('h') AS grown;
DELETE FROM h WHERE id % 3 = 0;
VACUUM h;
SELECT h_mismatches('h') AS vacuumed;
REINDEX INDEX h_idx;
SELECT h_mismatches('h') AS reindexed;
TRUNCATE h;
INSERT INTO h
SELECT i, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 32) WHERE i > 0)
FROM generate_series(1, 800) i;
SELECT h_mismatches('h') AS truncated;
REINDEX INDEX h_idx;
SELECT h_mismatches('h') AS retrained;

-- Pages read through hints count in pg_statio_all_indexes as ReadBuffer's
-- hits do: a scan through hints (the second) counts the blocks of one
-- without them (the first after a change of the index's pg_class row, which
-- resets its relcache entry and its hints; the model stays cached).
CREATE FUNCTION h_blocks() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_stat_clear_snapshot();
	RETURN (SELECT idx_blks_read + idx_blks_hit FROM pg_statio_all_indexes WHERE indexrelid = 'h_idx'::regclass);
END $$;
SELECT qv AS hq1 FROM hq WHERE qid = 1 \gset
SET enable_seqscan = off;
SELECT count(*) FROM (SELECT id FROM h ORDER BY v <-> :'hq1' LIMIT 10) s;
SELECT pg_stat_force_next_flush();
ALTER INDEX h_idx RENAME TO h_idx_renamed;
ALTER INDEX h_idx_renamed RENAME TO h_idx;
SELECT h_blocks() AS b0 \gset
SELECT count(*) FROM (SELECT id FROM h ORDER BY v <-> :'hq1' LIMIT 10) s;
SELECT pg_stat_force_next_flush();
SELECT h_blocks() AS b1 \gset
SELECT count(*) FROM (SELECT id FROM h ORDER BY v <-> :'hq1' LIMIT 10) s;
SELECT pg_stat_force_next_flush();
SELECT h_blocks() AS b2 \gset
SELECT :b1 - :b0 > 0 AS counted, :b2 - :b1 = :b1 - :b0 AS hinted_counted_alike;
RESET enable_seqscan;

-- A temporary table's index lives in local buffers.
CREATE TEMP TABLE ht AS SELECT * FROM h;
CREATE INDEX ht_idx ON ht USING gpu_ivfpq (v) WITH (lists = 4, m = 8);
SELECT h_mismatches('ht') AS temporary;
INSERT INTO ht
SELECT i, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 32) WHERE i > 0)
FROM generate_series(801, 2400) i;
SELECT h_mismatches('ht') AS temporary_grown;

DROP TABLE h, hq, ht;
DROP FUNCTION h_mismatches(text), h_blocks(), knn(text, bool);
