-- gpu_metric on the GPU service (the preloaded instance of
-- installcheck-service: two emulated GPUs, or real ones with
-- GPU_IVFPQ_EXPECT_GPU=1). With gpu_ivfpq.device = gpu every search must be
-- answered by the GPU (else an error); its answers equal the CPU engine's
-- for List of Clusters and SSS, range and k-NN, index scans and the batch
-- functions, before and after inserts, deletes and VACUUM (each change
-- makes the next search load a new mirror); the mirrors view lists them.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
\i test/sql/explain_function.inc
SET enable_seqscan = off;
SET enable_bitmapscan = off;

CREATE TABLE svc_words (id serial PRIMARY KEY, word text) WITH (autovacuum_enabled = off);
INSERT INTO svc_words (word)
SELECT a || b || c
FROM unnest(ARRAY['ca', 'sa', 'pe', 'ño', 'lá', 'ti', 'mo', 'rú', 'ce', 'za']) x(a),
     unnest(ARRAY['ca', 'sa', 'pe', 'ño', 'lá', 'ti', 'mo', 'rú', 'ce', 'za']) y(b),
     unnest(ARRAY['', 's', 'ca', 'sa', 'pe', 'ño', 'lá', 'ti']) z(c);
INSERT INTO svc_words (word) VALUES ('cassa'), ('casa'), ('caza'), ('cañón'), (''), (NULL), (repeat('ab', 40));
CREATE TABLE svc_queries (qid int, q text);
INSERT INTO svc_queries VALUES (1, 'casa'), (2, 'cañon'), (3, 'pesati'), (4, ''), (5, 'zamorú'), (6, 'x'),
	(7, repeat('ab', 39));

-- Every answer of one engine: ranges at radii 0..3, the 7 nearest (ORDER BY
-- ... LIMIT), and the batch functions.
CREATE FUNCTION svc_answers(engine text) RETURNS TABLE (kind text, qid int, r int, id int, d int)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
	PERFORM set_config('gpu_ivfpq.device', engine, true);
	FOR rad IN 0..3 LOOP
		RETURN QUERY SELECT 'range', q.qid, rad, w.id, w.word <~> q.q
			FROM svc_queries q, LATERAL (SELECT * FROM svc_words w WHERE w.word <% edit_range(q.q, rad)) w;
		RETURN QUERY SELECT 'range_batch', b.query, rad, w.id, b.distance
			FROM gpu_metric_range_batch('svc_idx', (SELECT array_agg(q ORDER BY qid) FROM svc_queries), rad) b
			JOIN svc_words w ON w.ctid = b.tid;
	END LOOP;
	RETURN QUERY SELECT 'knn', q.qid, n.rank::int, n.id, n.d
		FROM svc_queries q, LATERAL (SELECT w.id, w.word <~> q.q AS d,
			row_number() OVER () AS rank
			FROM (SELECT * FROM svc_words w ORDER BY w.word <~> q.q, w.id LIMIT 7) w) n;
	RETURN QUERY SELECT 'knn_batch', b.query, b.rank, w.id, b.distance
		FROM gpu_metric_knn_batch('svc_idx', (SELECT array_agg(q ORDER BY qid) FROM svc_queries), 7) b
		JOIN svc_words w ON w.ctid = b.tid;
END $$;

-- The GPU's answers (gpu) against the CPU engine's (cpu): rows in one and
-- not the other, and how many each has.
CREATE FUNCTION svc_compare() RETURNS TABLE (gpu_rows bigint, cpu_rows bigint, differ bigint)
LANGUAGE sql AS $$
	WITH g AS (SELECT * FROM svc_answers('gpu')), c AS (SELECT * FROM svc_answers('cpu'))
	SELECT (SELECT count(*) FROM g), (SELECT count(*) FROM c),
	       (SELECT count(*) FROM ((TABLE g EXCEPT ALL TABLE c) UNION ALL (TABLE c EXCEPT ALL TABLE g)) x)
$$;

-- List of Clusters.
CREATE INDEX svc_idx ON svc_words USING gpu_metric (word) WITH (method = lc, bucket = 8);
SELECT gpu_metric_prewarm('svc_idx') AS live_words;
SELECT kind, entries, size_mb > 0 AS has_size, array_length(devices, 1) >= 1 AS on_gpus
FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx';
SELECT * FROM svc_compare();
-- Scans reach the GPU process directly; the views follow within 100 ms.
DO $$
BEGIN
  FOR i IN 1..100 LOOP
    PERFORM 1 FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx' AND queries > 0;
    IF FOUND THEN RETURN; END IF;
    PERFORM pg_sleep(0.1);
  END LOOP;
END $$;
SELECT queries > 0 AS searched FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx';

-- Inserts, deletes and VACUUM: the next search mirrors the index as the
-- pages now hold it (one mirror of the index, of its live words).
INSERT INTO svc_words (word) VALUES ('casas'), ('cosa'), ('pesatis'), ('zamorúu');
SELECT * FROM svc_compare();
DELETE FROM svc_words WHERE id % 5 = 0 OR word = 'casa';
VACUUM svc_words;
SELECT * FROM svc_compare();
SELECT count(*) AS mirrors, min(entries) = (SELECT count(word) FROM svc_words) AS entries_live
FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx';
INSERT INTO svc_words (word) VALUES ('casa'), ('caso');
SELECT * FROM svc_compare();

-- Parallel plans: a scan in a parallel worker (force_parallel_mode) or in
-- the leader of a Gather runs in parallel mode, where no subtransaction may
-- start; it still loads its mirror (a DSM segment) and answers on the GPU
-- (device = gpu errors otherwise), answers larger than the request slot
-- too (in a segment of their own), the same rows as the CPU engine.
INSERT INTO svc_words (word) VALUES ('paralelo');  -- the next search loads a new mirror
SET gpu_ivfpq.device = gpu;
-- (force_parallel_mode is debug_parallel_query from PostgreSQL 16; from 16
-- the planner would sort below the aggregate for its ORDER BY: the same plans
-- on every version without that.)
DO $$ BEGIN PERFORM set_config(name, 'on', false) FROM pg_settings
WHERE name IN ('force_parallel_mode', 'debug_parallel_query');
PERFORM set_config(name, 'off', false) FROM pg_settings WHERE name = 'enable_presorted_aggregate'; END $$;
SELECT * FROM explain_plan($q$SELECT array_agg(id ORDER BY id) FROM svc_words WHERE word <% edit_range('casa', 1)$q$) AS "QUERY PLAN";
SELECT array_agg(id ORDER BY id) AS gpu FROM svc_words WHERE word <% edit_range('casa', 1);
SELECT * FROM explain_plan($q$SELECT id FROM svc_words ORDER BY word <~> 'cañon' LIMIT 4$q$) AS "QUERY PLAN";
SELECT id AS gpu FROM svc_words ORDER BY word <~> 'cañon' LIMIT 4;
SET gpu_ivfpq.device = cpu;
SELECT array_agg(id ORDER BY id) AS cpu FROM svc_words WHERE word <% edit_range('casa', 1);
SELECT id AS cpu FROM svc_words ORDER BY word <~> 'cañon' LIMIT 4;
-- 10,000 words of 4 letters, all within 4 edits of 'abcd': 80 kB of hits.
CREATE TABLE svc_many (id int, word text);
INSERT INTO svc_many SELECT i, translate(lpad(i::text, 4, '0'), '0123456789', 'abcdefghij')
FROM generate_series(0, 9999) i;
CREATE INDEX svc_many_idx ON svc_many USING gpu_metric (word) WITH (method = lc, bucket = 64);
SET gpu_ivfpq.device = gpu;
SELECT count(*) AS gpu, sum(id) AS ids FROM svc_many WHERE word <% edit_range('abcd', 4);
SELECT count(*) AS gpu, sum(id) AS ids FROM svc_many WHERE word <% edit_range('abcd', 2);
SET gpu_ivfpq.device = cpu;
SELECT count(*) AS cpu, sum(id) AS ids FROM svc_many WHERE word <% edit_range('abcd', 2);
-- Beside a Gather (the scans in the leader, in parallel mode).
DO $$ BEGIN PERFORM set_config(name, reset_val, false) FROM pg_settings
WHERE name IN ('force_parallel_mode', 'debug_parallel_query'); END $$;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
INSERT INTO svc_words (word) VALUES ('paralela');
SET gpu_ivfpq.device = gpu;
SELECT * FROM explain_plan($q$
SELECT q.qid, n.ids FROM svc_queries q
CROSS JOIN LATERAL (SELECT array_agg(id) AS ids FROM (SELECT id FROM svc_words w ORDER BY w.word <~> q.q LIMIT 3) s) n
ORDER BY q.qid$q$) AS "QUERY PLAN";
SELECT q.qid, n.ids AS gpu FROM svc_queries q
CROSS JOIN LATERAL (SELECT array_agg(id) AS ids FROM (SELECT id FROM svc_words w ORDER BY w.word <~> q.q LIMIT 3) s) n
ORDER BY q.qid;
SET gpu_ivfpq.device = cpu;
SELECT q.qid, n.ids AS cpu FROM svc_queries q
CROSS JOIN LATERAL (SELECT array_agg(id) AS ids FROM (SELECT id FROM svc_words w ORDER BY w.word <~> q.q LIMIT 3) s) n
ORDER BY q.qid;
RESET max_parallel_workers_per_gather;
RESET min_parallel_table_scan_size;
RESET parallel_tuple_cost;
RESET parallel_setup_cost;
DO $$ BEGIN PERFORM set_config(name, reset_val, false) FROM pg_settings
WHERE name = 'enable_presorted_aggregate'; END $$;
RESET gpu_ivfpq.device;
DROP TABLE svc_many;

-- SSS.
DROP INDEX svc_idx;
CREATE INDEX svc_idx ON svc_words USING gpu_metric (word) WITH (method = sss, alpha = 0.4);
SELECT * FROM svc_compare();
SELECT kind, entries = (SELECT count(word) FROM svc_words) AS entries_live
FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx';
DELETE FROM svc_words WHERE id % 7 = 1;
VACUUM svc_words;
INSERT INTO svc_words (word) VALUES ('sacas'), ('ñoño');
SELECT * FROM svc_compare();

-- gpu_metric_prewarm: a gpu_metric index only, and SELECT on its table.
SELECT gpu_metric_prewarm('svc_words_pkey');
CREATE ROLE svc_metric_nobody;
SET ROLE svc_metric_nobody;
SELECT gpu_metric_prewarm('svc_idx');
RESET ROLE;
DROP ROLE svc_metric_nobody;

-- An index with no words (an empty table, or only NULLs) mirrors as
-- empty: no rows, no warning, and device = gpu serves it.
CREATE TABLE svc_empty (w text);
CREATE INDEX svc_empty_lc ON svc_empty USING gpu_metric (w);
SELECT gpu_metric_prewarm('svc_empty_lc') AS empty_objects;
SET gpu_ivfpq.device = gpu;
SELECT count(*) AS empty_rows FROM gpu_metric_knn_batch('svc_empty_lc', ARRAY['a'], 1);
SELECT count(*) AS empty_range FROM svc_empty WHERE w <% edit_range('a', 1);
INSERT INTO svc_empty VALUES (NULL), (NULL);
CREATE INDEX svc_empty_sss ON svc_empty USING gpu_metric (w) WITH (method = sss);
SELECT count(*) AS nulls_rows FROM gpu_metric_knn_batch('svc_empty_sss', ARRAY['a'], 1);
RESET gpu_ivfpq.device;
DROP TABLE svc_empty;

-- The searches above were served by the GPU: none fell back.
SELECT queries_gpu > 0 AS gpu_served FROM gpu_ivfpq_status;
DROP TABLE svc_words, svc_queries;
DROP FUNCTION svc_compare(), svc_answers(text), explain_plan(text);
