-- Run after the whole suite on an instance that preloads gpu_ivfpq (the
-- "service" pass of scripts/run-tests.sh): the scans above went through the
-- GPU service, and the service's SQL surface behaves.
SET client_min_messages = warning;
SET enable_seqscan = off;  -- tiny tables: make sure the index serves
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
SELECT state LIKE 'running (GPU%' AS gpu_serving, service_pid IS NOT NULL AS has_pid
FROM gpu_ivfpq_status;
SELECT queries_gpu > 0 AS gpu_served, batches > 0 AS batched, mean_batch >= 1 AS mean_ok,
       last_error IS NULL AS no_error
FROM gpu_ivfpq_status;
-- The direct path's stages: a queued search's wait holds its wait for the
-- change log; a batch's GPU work and delivery were timed.
SELECT queued_searches > 0 AS searches_timed,
       mean_queue_wait_us >= mean_log_wait_us AND mean_log_wait_us >= 0
       AND mean_gpu_us > 0 AND mean_deliver_us > 0 AS stages_nest
FROM gpu_ivfpq_status;

CREATE TABLE svc (id int PRIMARY KEY, v real[]);
INSERT INTO svc SELECT i, ARRAY[sin(i), cos(i), sin(2 * i), cos(3 * i)]::real[]
FROM generate_series(1, 2000) i;
CREATE INDEX svc_idx ON svc USING gpu_ivfpq (v) WITH (lists = 8, m = 2);
SELECT gpu_ivfpq_prewarm('svc_idx');
SELECT index, entries FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx';
-- A small index: a copy on every GPU the service uses (the devices view lists them).
SELECT placement, array_length(devices, 1) = (SELECT count(*) FROM gpu_ivfpq_devices WHERE alive) AS on_every_gpu
FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx';
SELECT count(*) > 0 AS gpus, bool_and(memory_used_mb > 0 AND mirrors >= 1 AND memory_used_mb <= memory_budget_mb) AS holding
FROM gpu_ivfpq_devices;

-- gpu_ivfpq.device = gpu: served by the GPU, same rows as the CPU engine.
SET gpu_ivfpq.device = gpu;
SELECT array_agg(id) AS gpu FROM (SELECT id FROM svc ORDER BY v <-> '{0.5,0.5,0.1,0.2}' LIMIT 8) s;
SET gpu_ivfpq.device = cpu;
SELECT array_agg(id) AS cpu FROM (SELECT id FROM svc ORDER BY v <-> '{0.5,0.5,0.1,0.2}' LIMIT 8) s;

-- An index with RaBitQ codes is mirrored too (service_rabitq tests it in
-- full): with device = gpu scans and prewarming succeed, and the GPU's
-- estimates re-ranked from the table give the CPU engine's rows.
CREATE TABLE svc_rq AS SELECT * FROM svc;
CREATE INDEX svc_rq_idx ON svc_rq USING gpu_ivfpq (v) WITH (lists = 8, codes = rabitq);
SET gpu_ivfpq.device = gpu;
SET gpu_ivfpq.probes = 8;
SELECT array_agg(id) AS gpu FROM (SELECT id FROM svc_rq ORDER BY v <-> '{0.5,0.5,0.1,0.2}' LIMIT 8) s;
SELECT gpu_ivfpq_prewarm('svc_rq_idx');
SELECT count(*) AS rabitq_mirrors, bool_and(NOT vectors) AS codes_only FROM gpu_ivfpq_mirrors WHERE index = 'svc_rq_idx';
SET gpu_ivfpq.device = cpu;
SELECT array_agg(id) AS cpu FROM (SELECT id FROM svc_rq ORDER BY v <-> '{0.5,0.5,0.1,0.2}' LIMIT 8) s;
RESET gpu_ivfpq.probes;
DROP TABLE svc_rq;

-- An insert reaches the mirror before the next query.
SET gpu_ivfpq.device = gpu;
INSERT INTO svc VALUES (5000, '{0.5,0.5,0.1,0.2}');
SELECT id, v <-> '{0.5,0.5,0.1,0.2}' AS dist FROM svc ORDER BY v <-> '{0.5,0.5,0.1,0.2}' LIMIT 1;

-- VACUUM removes the dead entries from the mirror in place: the same
-- mirror (its query count goes on), 11 entries fewer, before VACUUM returns.
DELETE FROM svc WHERE id = 5000 OR id <= 10;
VACUUM svc;
SELECT count(*) AS mirrors_after_vacuum, min(entries) AS entries, min(queries) > 0 AS same_mirror
FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx';
SELECT id FROM svc ORDER BY v <-> '{0.5,0.5,0.1,0.2}' LIMIT 1;
SELECT array_agg(id) AS gpu FROM (SELECT id FROM svc ORDER BY v <-> '{0.9,0.1,0.3,0.7}' LIMIT 8) s;
SET gpu_ivfpq.device = cpu;
SELECT array_agg(id) AS cpu FROM (SELECT id FROM svc ORDER BY v <-> '{0.9,0.1,0.3,0.7}' LIMIT 8) s;
SET gpu_ivfpq.device = gpu;
SELECT entries FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx';

-- Rows inserted after the VACUUM (they may reuse the freed TIDs) reach the
-- mirror once each, with their new vectors: as many entries as rows (a
-- removal the mirror missed would leave more), and each new row is the
-- nearest to its own vector on the GPU.
INSERT INTO svc SELECT i, ARRAY[cos(i), sin(i), cos(2 * i), sin(3 * i)]::real[]
FROM generate_series(1, 10) i;
SELECT array_agg((SELECT s.id FROM svc s ORDER BY s.v <-> t.v LIMIT 1) ORDER BY t.id) AS nearest_to_itself
FROM svc t WHERE t.id <= 10;
DO $$
BEGIN
  FOR i IN 1..100 LOOP
    PERFORM 1 FROM gpu_ivfpq_mirrors
    WHERE index = 'svc_idx' AND entries = (SELECT count(*) FROM svc);
    IF FOUND THEN RETURN; END IF;
    PERFORM pg_sleep(0.1);  -- the view is published once a second when idle
  END LOOP;
  RAISE EXCEPTION 'the mirror never held exactly one entry per row';
END $$;

-- Exact k-NN over an indexed column comes from the index's GPU mirror (its
-- queries count as GPU queries, no table chunks are shipped) and equals the
-- table path's answer, dead rows not yet vacuumed included.
DELETE FROM svc WHERE id BETWEEN 100 AND 130;
SET gpu_ivfpq.device = cpu;
CREATE TEMP TABLE ex_cpu AS
SELECT * FROM gpu_ivfpq_exact_knn('svc', 'v', '{{0.5,0.5,0.1,0.2},{0.9,0.1,0.3,0.7},{0,1,0,1}}', 7);
SET gpu_ivfpq.device = auto;
SELECT queries_gpu AS gpu_before FROM gpu_ivfpq_status \gset
CREATE TEMP TABLE ex_gpu AS
SELECT * FROM gpu_ivfpq_exact_knn('svc', 'v', '{{0.5,0.5,0.1,0.2},{0.9,0.1,0.3,0.7},{0,1,0,1}}', 7);
SELECT (SELECT queries_gpu FROM gpu_ivfpq_status) - :gpu_before >= 3 AS from_the_mirror,
       (SELECT count(*) FROM ex_gpu) AS rows,
       (SELECT count(*) FROM (SELECT * FROM ex_cpu EXCEPT SELECT * FROM ex_gpu) a) +
       (SELECT count(*) FROM (SELECT * FROM ex_gpu EXCEPT SELECT * FROM ex_cpu) b) AS differing;
-- Another metric than the index's: the table path.
SELECT count(*) FROM gpu_ivfpq_exact_knn('svc', 'v', '{0.5,0.5,0.1,0.2}', 3, 'cosine');
-- Points far from the origin and close together: the device's float
-- preselection cannot be shown to hold for them (its rounding exceeds their
-- distances), so the call takes the table path, which ranks them moved to
-- their mean: the sequential scan's answer.
CREATE TABLE svgeo AS SELECT i AS id, ARRAY[-122.40 + (i % 60) * 0.0005, 37.70 + (i / 60) * 0.0005]::real[] AS p
FROM generate_series(0, 2999) i;
CREATE INDEX svgeo_idx ON svgeo USING gpu_ivfpq (p) WITH (lists = 8, m = 1);
SELECT gpu_ivfpq_prewarm('svgeo_idx') > 0 AS geo_mirrored;
SELECT array_agg(g.id ORDER BY r.rank) = ARRAY(SELECT id FROM svgeo ORDER BY p <-> '{-122.3753,37.7147}', ctid LIMIT 5) AS geo_exact
FROM gpu_ivfpq_exact_knn('svgeo', 'p', '{-122.3753,37.7147}', 5) r JOIN svgeo g ON g.ctid = r.tid;
DROP TABLE svgeo;
SET gpu_ivfpq.device = gpu;

-- Inserts reached the mirrors as append calls, timed like the rounds.
SELECT append_calls > 0 AS appended, mean_append_us >= mean_append_device_us AS append_stages_nest
FROM gpu_ivfpq_status;

-- A filter column: the GPU applies the pushed-down filter (device = gpu
-- errors if it cannot), equal to the CPU engine's answers; inserts and
-- VACUUM carry the filter values to the mirror.
CREATE TABLE svcf (id int PRIMARY KEY, tenant int, v real[]);
INSERT INTO svcf SELECT i, i % 7, ARRAY[sin(i), cos(i), sin(2 * i), cos(3 * i)]::real[]
FROM generate_series(1, 2000) i;
CREATE INDEX svcf_idx ON svcf USING gpu_ivfpq (v, tenant) WITH (lists = 8, m = 2);
SET gpu_ivfpq.device = gpu;
SELECT array_agg(id) AS gpu FROM (SELECT id FROM svcf WHERE tenant = 3 ORDER BY v <-> '{0.5,0.5,0.1,0.2}' LIMIT 8) s;
SET gpu_ivfpq.device = cpu;
SELECT array_agg(id) AS cpu FROM (SELECT id FROM svcf WHERE tenant = 3 ORDER BY v <-> '{0.5,0.5,0.1,0.2}' LIMIT 8) s;
SET gpu_ivfpq.device = gpu;
INSERT INTO svcf VALUES (5000, 9, '{0.5,0.5,0.1,0.2}'), (5001, 3, '{0.5,0.5,0.1,0.21}');
SELECT id, tenant FROM svcf WHERE tenant = 9 ORDER BY v <-> '{0.5,0.5,0.1,0.2}' LIMIT 3;
SELECT id, tenant FROM svcf WHERE tenant >= 3 AND tenant <= 3 ORDER BY v <-> '{0.5,0.5,0.1,0.2}' LIMIT 1;
DELETE FROM svcf WHERE id = 5001;
VACUUM svcf;
SELECT array_agg(id) AS gpu FROM (SELECT id FROM svcf WHERE tenant < 2 ORDER BY v <-> '{0.9,0.1,0.3,0.7}' LIMIT 8) s;
SET gpu_ivfpq.device = cpu;
SELECT array_agg(id) AS cpu FROM (SELECT id FROM svcf WHERE tenant < 2 ORDER BY v <-> '{0.9,0.1,0.3,0.7}' LIMIT 8) s;
SET gpu_ivfpq.device = gpu;
DO $$
BEGIN
  FOR i IN 1..100 LOOP
    PERFORM 1 FROM gpu_ivfpq_mirrors WHERE index = 'svcf_idx' AND filter_keys AND vectors;
    IF FOUND THEN RETURN; END IF;
    PERFORM pg_sleep(0.1);  -- the view is published once a second when idle
  END LOOP;
  RAISE EXCEPTION 'the mirror of a filter index does not show its filter keys';
END $$;
SELECT filter_keys FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx';
DROP TABLE svcf;

-- More lists than one GPU round probes (2048): a filtered scan whose lists
-- hold few passing rows widens up to that bound and stays on the GPU.
CREATE TABLE svcw (id int, tenant int, v real[]);
INSERT INTO svcw SELECT i, CASE WHEN i % 150 = 0 THEN 1 ELSE 0 END,
       ARRAY[sin(i), cos(i), sin(2 * i), cos(3 * i)]::real[]
FROM generate_series(1, 3000) i;
CREATE INDEX svcw_idx ON svcw USING gpu_ivfpq (v, tenant) WITH (lists = 2100, m = 2);
SET gpu_ivfpq.probes = 8;
SELECT count(*) AS rows, bool_and(tenant = 1) AS all_tenant_one
FROM (SELECT tenant FROM svcw WHERE tenant = 1 ORDER BY v <-> '{0.5,0.5,0.1,0.2}' LIMIT 5) s;
RESET gpu_ivfpq.probes;
DROP TABLE svcw;

-- Parallel plans: a scan in the leader of a Gather, or in a parallel worker
-- (force_parallel_mode), runs in parallel mode, where no subtransaction may
-- start; it still loads the mirror (a DSM segment) and answers on the GPU
-- (device = gpu errors otherwise), the same rows as the CPU engine.
CREATE TABLE svcq (qid int, qv real[]);
INSERT INTO svcq SELECT i, ARRAY[cos(i), sin(i), cos(2 * i), sin(3 * i)]::real[]
FROM generate_series(1, 2000) i;
ANALYZE svcq;
SET enable_seqscan = on;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET max_parallel_workers_per_gather = 2;
-- (From PostgreSQL 16 the planner would sort below the Gather for the
-- aggregate's ORDER BY: the same plan on every version without that.)
DO $$ BEGIN PERFORM set_config(name, 'off', false) FROM pg_settings
WHERE name = 'enable_presorted_aggregate'; END $$;
SET gpu_ivfpq.device = gpu;
REINDEX INDEX svc_idx;  -- no mirror: the first scan loads one
EXPLAIN (COSTS OFF)
SELECT array_agg(n.id ORDER BY q.qid) FROM svcq q
CROSS JOIN LATERAL (SELECT id FROM svc ORDER BY svc.v <-> q.qv LIMIT 1) n WHERE q.qid % 100 = 0;
SELECT array_agg(n.id ORDER BY q.qid) AS gpu FROM svcq q
CROSS JOIN LATERAL (SELECT id FROM svc ORDER BY svc.v <-> q.qv LIMIT 1) n WHERE q.qid % 100 = 0;
SET gpu_ivfpq.device = cpu;
SELECT array_agg(n.id ORDER BY q.qid) AS cpu FROM svcq q
CROSS JOIN LATERAL (SELECT id FROM svc ORDER BY svc.v <-> q.qv LIMIT 1) n WHERE q.qid % 100 = 0;
SET gpu_ivfpq.device = gpu;
-- (force_parallel_mode is debug_parallel_query from PostgreSQL 16.)
DO $$ BEGIN PERFORM set_config(name, 'on', false) FROM pg_settings
WHERE name IN ('force_parallel_mode', 'debug_parallel_query'); END $$;
REINDEX INDEX svc_idx;
EXPLAIN (COSTS OFF) SELECT id FROM svc ORDER BY v <-> '{0.3,0.6,0.2,0.1}' LIMIT 4;
SELECT id AS gpu FROM svc ORDER BY v <-> '{0.3,0.6,0.2,0.1}' LIMIT 4;
SET gpu_ivfpq.device = cpu;
SELECT id AS cpu FROM svc ORDER BY v <-> '{0.3,0.6,0.2,0.1}' LIMIT 4;
SET gpu_ivfpq.device = gpu;
DO $$ BEGIN PERFORM set_config(name, reset_val, false) FROM pg_settings
WHERE name IN ('force_parallel_mode', 'debug_parallel_query'); END $$;
RESET max_parallel_workers_per_gather;
RESET min_parallel_table_scan_size;
RESET parallel_tuple_cost;
RESET parallel_setup_cost;
DO $$ BEGIN PERFORM set_config(name, reset_val, false) FROM pg_settings
WHERE name = 'enable_presorted_aggregate'; END $$;
SET enable_seqscan = off;
DROP TABLE svcq;

-- What the GPU cannot serve is an error with gpu_ivfpq.device = gpu ...
CREATE TABLE wide (v real[]);
INSERT INTO wide SELECT array_fill(i::real, ARRAY[8200]) FROM generate_series(1, 20) i;
SET maintenance_work_mem = '256MB';
CREATE INDEX wide_idx ON wide USING gpu_ivfpq (v) WITH (lists = 2, m = 8);
SET gpu_ivfpq.device = auto;
CREATE INDEX wide_idx ON wide USING gpu_ivfpq (v) WITH (lists = 2, m = 8);
SET gpu_ivfpq.device = gpu;
SELECT 1 FROM wide ORDER BY v <-> array_fill(1::real, ARRAY[8200]) LIMIT 1;
SELECT gpu_ivfpq_prewarm('wide_idx');
-- ... and the CPU engine with auto.
SET gpu_ivfpq.device = auto;
SELECT v[1] FROM wide ORDER BY v <-> array_fill(3::real, ARRAY[8200]) LIMIT 1;
SELECT gpu_ivfpq_prewarm('svc');
-- An index built on an empty table has nothing to mirror yet: the hint says how to train it.
CREATE TABLE untrained (v real[]);
CREATE INDEX untrained_idx ON untrained USING gpu_ivfpq (v);
INSERT INTO untrained VALUES ('{1,2}'), ('{3,4}');
SELECT gpu_ivfpq_prewarm('untrained_idx');
-- Its scans compute every distance on the CPU: with device = gpu, an error that says so.
BEGIN;
SET LOCAL enable_seqscan = off;
SELECT v FROM untrained ORDER BY v <-> '{1,2}' LIMIT 1;
SET LOCAL gpu_ivfpq.device = gpu;
SELECT v FROM untrained ORDER BY v <-> '{1,2}' LIMIT 1;
ROLLBACK;
-- So do the batch functions.
SET gpu_ivfpq.device = gpu;
SELECT count(*) FROM gpu_ivfpq_knn_batch('untrained_idx', '{1,2}'::real[], 1);
SELECT count(*) FROM gpu_ivfpq_knn_graph('untrained_idx', 1);
RESET gpu_ivfpq.device;
DROP TABLE untrained;

-- One scan served first by the GPU, then by the CPU engine (rounds past
-- the GPU's 2048 candidates): the CPU rounds read the list directory only
-- then, and every row comes back once.
CREATE TABLE svcmix AS
  SELECT i AS id, ARRAY[sin(i), cos(i), sin(i * 0.3), cos(i * 0.7)]::real[] AS v
  FROM generate_series(1, 3000) i;
CREATE INDEX svcmix_idx ON svcmix USING gpu_ivfpq (v) WITH (lists = 16, m = 2);
SELECT gpu_ivfpq_prewarm('svcmix_idx');
SET gpu_ivfpq.strict_order = off;
SELECT queries_gpu AS gpu0, queries_cpu AS cpu0 FROM gpu_ivfpq_status \gset
SELECT count(*) AS rows, count(DISTINCT id) AS distinct_rows
FROM (SELECT id FROM svcmix ORDER BY v <-> '{0.1,0.9,0.2,0.4}') s;
SELECT queries_gpu > :gpu0 AS gpu_rounds, queries_cpu > :cpu0 AS cpu_rounds FROM gpu_ivfpq_status;
RESET gpu_ivfpq.strict_order;
DROP TABLE svcmix;

-- A DROP INDEX that rolls back, or whose savepoint does, keeps the mirror.
SELECT count(*) AS mirrors_before FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx';
BEGIN;
DROP INDEX svc_idx;
ROLLBACK;
BEGIN;
SAVEPOINT s;
DROP INDEX svc_idx;
ROLLBACK TO SAVEPOINT s;
COMMIT;
SELECT pg_sleep(0.5);
SELECT count(*) AS mirrors_kept FROM gpu_ivfpq_mirrors WHERE index = 'svc_idx';

-- DROP frees the mirror (once committed; here inside a released savepoint).
BEGIN;
SAVEPOINT s;
DROP INDEX svc_idx;
RELEASE SAVEPOINT s;
COMMIT;
SELECT pg_sleep(0.5);
SELECT count(*) AS mirrors_after_drop FROM gpu_ivfpq_mirrors WHERE indexrelid NOT IN (SELECT oid FROM pg_class);
DROP TABLE svc, wide;

-- DROP DATABASE frees the mirrors of its indexes, of both access methods:
-- the service finds the database gone from pg_database.
SELECT current_database() AS regress_db \gset
CREATE DATABASE svc_dropped_db;
\c svc_dropped_db
SET client_min_messages = warning;
CREATE EXTENSION gpu_ivfpq;
CREATE TABLE t (id int, v real[], w text);
INSERT INTO t SELECT i, ARRAY[sin(i), cos(i), sin(2 * i), cos(3 * i)]::real[], 'w' || i
FROM generate_series(1, 500) i;
CREATE INDEX t_v ON t USING gpu_ivfpq (v) WITH (lists = 4, m = 2);
CREATE INDEX t_w ON t USING gpu_metric (w);
SELECT gpu_ivfpq_prewarm('t_v') AS entries, gpu_metric_prewarm('t_w') AS words;
\c :regress_db
SELECT datid AS dropped_datid FROM gpu_ivfpq_mirrors WHERE datname = 'svc_dropped_db' LIMIT 1 \gset
SELECT kind, count(*) FROM gpu_ivfpq_mirrors WHERE datid = :dropped_datid GROUP BY kind ORDER BY kind;
DROP DATABASE svc_dropped_db;
CREATE FUNCTION svc_mirrors_gone(db oid) RETURNS bool LANGUAGE plpgsql AS $$
BEGIN
  FOR i IN 1..300 LOOP
    IF NOT EXISTS (SELECT 1 FROM gpu_ivfpq_mirrors WHERE datid = db) THEN RETURN true; END IF;
    PERFORM pg_sleep(0.1);
  END LOOP;
  RETURN false;
END $$;
SELECT svc_mirrors_gone(:dropped_datid) AS mirrors_freed;
DROP FUNCTION svc_mirrors_gone(oid);
