-- gpu_ivfpq_check: sound indexes pass (each operator class, untrained,
-- partial and expression indexes, after DML and VACUUM, with and without
-- heapallindexed); what is not a gpu_ivfpq index, and a caller without
-- SELECT on the table, are refused. test/t/008_index_check.pl corrupts
-- indexes and checks that each corruption is reported.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;

SELECT setseed(0.42);
CREATE TABLE chk (id int, tag text, v real[]) WITH (autovacuum_enabled = off, fillfactor = 60);
INSERT INTO chk
SELECT i, 'a', ARRAY(SELECT (random() * 4 - 2)::real FROM generate_series(1, 8) WHERE i > 0)
FROM generate_series(1, 2000) i;
INSERT INTO chk VALUES (2001, 'null', NULL);

-- One index per operator class, and more lists than some tables have rows for.
CREATE INDEX chk_l2 ON chk USING gpu_ivfpq (v) WITH (lists = 8, m = 4);
CREATE INDEX chk_ip ON chk USING gpu_ivfpq (v real_ip_ops) WITH (lists = 5, m = 2);
CREATE INDEX chk_cos ON chk USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 3, m = 8);
-- A partial index and an expression index: heapallindexed reads the table as a build does.
CREATE INDEX chk_part ON chk USING gpu_ivfpq (v) WITH (lists = 4, m = 4) WHERE id % 2 = 0;
CREATE INDEX chk_expr ON chk USING gpu_ivfpq ((v[1:4])) WITH (lists = 4, m = 2);

SELECT gpu_ivfpq_check('chk_l2') AS l2, gpu_ivfpq_check('chk_ip') AS ip,
	gpu_ivfpq_check('chk_cos') AS cosine;
SELECT indexrelid::regclass AS index, gpu_ivfpq_check(indexrelid, true) AS all_rows_indexed
FROM pg_index WHERE indrelid = 'chk'::regclass ORDER BY indexrelid::regclass::text;

-- An untrained index (built on an empty table), before and after inserts.
CREATE TABLE chk_empty (v real[]);
CREATE INDEX chk_empty_idx ON chk_empty USING gpu_ivfpq (v) WITH (lists = 16);
SELECT gpu_ivfpq_check('chk_empty_idx', true) AS untrained_empty;
INSERT INTO chk_empty SELECT ARRAY[i, i + 1, i + 2]::real[] FROM generate_series(1, 1500) i;
INSERT INTO chk_empty VALUES (NULL);
SELECT gpu_ivfpq_check('chk_empty_idx', true) AS untrained_with_rows;

-- DML: HOT updates (the index holds the HOT chain's root TID), non-HOT
-- updates, deletes, VACUUM compacting the lists, inserts reusing the space.
BEGIN;
UPDATE chk SET tag = 'b' WHERE id % 3 = 0;
SELECT n_tup_hot_upd > 0 AS some_updates_were_hot FROM pg_stat_xact_user_tables WHERE relname = 'chk';
COMMIT;
UPDATE chk SET v = v[2:8] || v[1:1] WHERE id % 7 = 0;
SELECT gpu_ivfpq_check('chk_l2', true) AS after_updates;
DELETE FROM chk WHERE id % 4 = 1;
SELECT gpu_ivfpq_check('chk_l2', true) AS after_delete;
VACUUM chk;
SELECT indexrelid::regclass AS index, gpu_ivfpq_check(indexrelid, true) AS after_vacuum
FROM pg_index WHERE indrelid = 'chk'::regclass ORDER BY indexrelid::regclass::text;
INSERT INTO chk
SELECT i, 'c', ARRAY(SELECT (random() * 4 - 2)::real FROM generate_series(1, 8) WHERE i > 0)
FROM generate_series(3001, 3600) i;
SELECT indexrelid::regclass AS index, gpu_ivfpq_check(indexrelid, true) AS after_reinsert
FROM pg_index WHERE indrelid = 'chk'::regclass ORDER BY indexrelid::regclass::text;
-- Inside a transaction that changed the table: its own rows are visible, and indexed.
BEGIN;
DELETE FROM chk WHERE id < 100;
INSERT INTO chk VALUES (9999, 'tx', '{1,2,3,4,5,6,7,8}');
SELECT gpu_ivfpq_check('chk_l2', true) AS in_transaction;
ROLLBACK;

-- An unlogged table's index, and NULL arguments (the function is strict).
CREATE UNLOGGED TABLE chk_unlogged AS SELECT v FROM chk;
CREATE INDEX chk_unlogged_idx ON chk_unlogged USING gpu_ivfpq (v) WITH (lists = 4, m = 4);
SELECT gpu_ivfpq_check('chk_unlogged_idx', true) AS unlogged;
SELECT gpu_ivfpq_check(NULL) IS NULL AS null_index, gpu_ivfpq_check('chk_l2', NULL) IS NULL AS null_flag;

-- Not a gpu_ivfpq index: refused with the index's name.
CREATE INDEX chk_btree ON chk (id);
SELECT gpu_ivfpq_check('chk_btree');
SELECT gpu_ivfpq_check('chk');

-- An invalid index (a CREATE INDEX CONCURRENTLY that failed) is refused.
CREATE FUNCTION chk_fail(v real[]) RETURNS real[] IMMUTABLE LANGUAGE plpgsql AS $$
BEGIN
	IF v[1] > 1.9 THEN
		RAISE EXCEPTION 'chk_fail refuses this vector';
	END IF;
	RETURN v;
END $$;
CREATE INDEX CONCURRENTLY chk_invalid ON chk USING gpu_ivfpq (chk_fail(v)) WITH (lists = 4, m = 4);
SELECT gpu_ivfpq_check('chk_invalid');
DROP INDEX chk_invalid;

-- The caller needs SELECT on the table, as for pg_prewarm.
DROP ROLE IF EXISTS gpu_ivfpq_checker;
CREATE ROLE gpu_ivfpq_checker;
SET ROLE gpu_ivfpq_checker;
SELECT gpu_ivfpq_check('chk_l2');
SELECT gpu_ivfpq_check('chk_l2', true);
RESET ROLE;
GRANT SELECT ON chk TO gpu_ivfpq_checker;
SET ROLE gpu_ivfpq_checker;
SELECT gpu_ivfpq_check('chk_l2', true) AS with_select;
RESET ROLE;

DROP TABLE chk, chk_empty, chk_unlogged;
DROP ROLE gpu_ivfpq_checker;
DROP FUNCTION chk_fail(real[]);
