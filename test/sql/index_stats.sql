-- Index scans are counted in pg_stat_user_indexes like any index's.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
CREATE TABLE st (id int, v real[]);
INSERT INTO st SELECT i, ARRAY[i, i % 7, i % 3]::real[] FROM generate_series(1, 500) i;
CREATE INDEX st_v ON st USING gpu_ivfpq (v) WITH (lists = 4, m = 1);
SET enable_seqscan = off;
SELECT id FROM st ORDER BY v <-> '{3,3,0}' LIMIT 1;
SELECT id FROM st ORDER BY v <-> '{9,2,0}' LIMIT 1;
RESET enable_seqscan;
SELECT pg_stat_force_next_flush();
SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelid = 'st_v'::regclass;
DROP TABLE st;
