-- The settings follow PostgreSQL's conventions: SET LOCAL gpu_ivfpq.* holds
-- for the transaction only and is undone by COMMIT and ROLLBACK, also when
-- it comes before anything loaded the library in the session (a placeholder
-- that the library's settings take over); the settings that spend shared
-- resources cannot be set in a session at all.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
-- Two clusters far apart, one list each: a batch search that probes one
-- list, and may not go on to more (max_scan_tuples below its candidates),
-- finds the 10 rows of the nearer cluster; probing both finds 20.
CREATE TABLE st (id int, v real[]);
INSERT INTO st SELECT i, ARRAY[(i % 2) * 100 + i * 0.01, (i % 2) * 100 - i * 0.01]::real[]
FROM generate_series(1, 20) i;
CREATE INDEX st_idx ON st USING gpu_ivfpq (v) WITH (lists = 2, m = 1);

-- A new session: unless preloaded, the library is not loaded yet.
\c
SET client_min_messages = warning;
BEGIN;
SET LOCAL gpu_ivfpq.probes = 1;
SET LOCAL gpu_ivfpq.max_scan_tuples = 10;
SET LOCAL gpu_ivfpq.rerank = 30;
SET LOCAL gpu_ivfpq.device = cpu;
SHOW gpu_ivfpq.probes;
SELECT count(*) AS rows_from_one_list FROM gpu_ivfpq_knn_batch('st_idx', '{0,0}', 20);
SHOW gpu_ivfpq.rerank;
SHOW gpu_ivfpq.device;
COMMIT;
SHOW gpu_ivfpq.probes;
SHOW gpu_ivfpq.rerank;
SHOW gpu_ivfpq.device;
SELECT count(*) AS rows_from_both_lists FROM gpu_ivfpq_knn_batch('st_idx', '{0,0}', 20);

-- ROLLBACK undoes SET LOCAL too, and a session value set before it stays.
SET gpu_ivfpq.probes = 2;
BEGIN;
SET LOCAL gpu_ivfpq.probes = 1;
SET LOCAL gpu_ivfpq.max_scan_tuples = 50;
SET LOCAL gpu_ivfpq.strict_order = off;
SET LOCAL gpu_ivfpq.table_memory = '1MB';
SELECT current_setting('gpu_ivfpq.probes') AS probes, current_setting('gpu_ivfpq.max_scan_tuples') AS max_scan_tuples,
       current_setting('gpu_ivfpq.strict_order') AS strict_order, current_setting('gpu_ivfpq.table_memory') AS table_memory;
SELECT count(*) AS rows_from_one_list FROM gpu_ivfpq_knn_batch('st_idx', '{0,0}', 20);
ROLLBACK;
SELECT current_setting('gpu_ivfpq.probes') AS probes, current_setting('gpu_ivfpq.max_scan_tuples') AS max_scan_tuples,
       current_setting('gpu_ivfpq.strict_order') AS strict_order, current_setting('gpu_ivfpq.table_memory') AS table_memory;
RESET gpu_ivfpq.probes;
SHOW gpu_ivfpq.probes;

-- A function's own SET clause holds while it runs.
CREATE FUNCTION one_list_count() RETURNS bigint LANGUAGE sql SET gpu_ivfpq.probes = 1 SET gpu_ivfpq.max_scan_tuples = 10
AS $$ SELECT count(*) FROM gpu_ivfpq_knn_batch('st_idx', '{0,0}', 20) $$;
SELECT one_list_count(), current_setting('gpu_ivfpq.probes') AS probes_after;

-- Out of range values and server-wide settings are refused, naming the setting.
\set VERBOSITY terse
BEGIN;
SET LOCAL gpu_ivfpq.probes = 0;
ROLLBACK;
BEGIN;
SET LOCAL gpu_ivfpq.batch_size = 8;
ROLLBACK;
SET gpu_ivfpq.no_such_setting = 1;
\set VERBOSITY default

DROP FUNCTION one_list_count();
DROP TABLE st;
