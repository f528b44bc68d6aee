-- Who may call what: the functions that read a table check SELECT on it (or
-- on its vector column) and refuse tables whose row-level security applies
-- to the caller; index scans go through the executor and apply the
-- policies; the status views are for pg_monitor.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
CREATE TABLE secret (id int, owner text, v real[], w real[]);
INSERT INTO secret SELECT i, CASE WHEN i % 2 = 0 THEN 'alice' ELSE 'bob' END,
	ARRAY[i % 10, i % 7, i % 3, i % 5]::real[], ARRAY[i % 4, i % 6, i % 8, i % 9]::real[]
FROM generate_series(1, 200) i;
CREATE INDEX secret_v ON secret USING gpu_ivfpq (v) WITH (lists = 4, m = 2);
DROP ROLE IF EXISTS gpu_ivfpq_nobody;
DROP ROLE IF EXISTS gpu_ivfpq_monitor;
CREATE ROLE gpu_ivfpq_nobody;
CREATE ROLE gpu_ivfpq_monitor IN ROLE pg_monitor;

-- Without SELECT: every reading function is refused, like the table itself.
SET ROLE gpu_ivfpq_nobody;
SELECT count(*) FROM secret;
SELECT * FROM gpu_ivfpq_exact_knn('secret', 'v', ARRAY[ARRAY[5,10,0,1]]::real[], 3);
SELECT * FROM gpu_ivfpq_range('secret_v', '{5,10,0,1}'::real[], 100);
SELECT * FROM gpu_ivfpq_knn_batch('secret_v', ARRAY[ARRAY[5,10,0,1]]::real[], 3);
SELECT * FROM gpu_ivfpq_knn_graph('secret_v', 2);
SELECT gpu_ivfpq_prewarm('secret_v');
-- Monitoring is not for everyone either.
SELECT count(*) FROM gpu_ivfpq_status;
SELECT count(*) FROM gpu_ivfpq_status();
SELECT count(*) FROM gpu_ivfpq_mirrors;
RESET ROLE;

-- SELECT on the vector column alone is not enough: the functions return
-- row identifiers (ctid), which column privileges never expose, and through
-- a partial index they would tell which rows match its predicate.
GRANT SELECT (v) ON secret TO gpu_ivfpq_nobody;
SET ROLE gpu_ivfpq_nobody;
SELECT count(*) FROM gpu_ivfpq_exact_knn('secret', 'v', ARRAY[ARRAY[5,10,0,1]]::real[], 3);
SELECT count(*) FROM gpu_ivfpq_knn_batch('secret_v', ARRAY[ARRAY[5,10,0,1]]::real[], 3);
SELECT count(*) FROM gpu_ivfpq_range('secret_v', '{5,10,0,1}'::real[], 8);
RESET ROLE;

-- Views and partitioned tables cannot be searched (exactly) at all.
CREATE VIEW secret_view AS SELECT v FROM secret;
SELECT * FROM gpu_ivfpq_exact_knn('secret_view', 'v', ARRAY[ARRAY[5,10,0,1]]::real[], 3);
DROP VIEW secret_view;

-- Row-level security: the functions refuse, index scans apply the policy.
GRANT SELECT ON secret TO gpu_ivfpq_nobody;
ALTER TABLE secret ENABLE ROW LEVEL SECURITY;
CREATE POLICY only_alice ON secret FOR SELECT USING (owner = 'alice');
SET ROLE gpu_ivfpq_nobody;
SELECT * FROM gpu_ivfpq_exact_knn('secret', 'v', ARRAY[ARRAY[5,10,0,1]]::real[], 3);
SELECT * FROM gpu_ivfpq_range('secret_v', '{5,10,0,1}'::real[], 100);
SELECT * FROM gpu_ivfpq_knn_batch('secret_v', ARRAY[ARRAY[5,10,0,1]]::real[], 3);
SELECT * FROM gpu_ivfpq_knn_graph('secret_v', 2);
-- With row_security off the functions refuse too (no silent bypass).
SET row_security = off;
SELECT count(*) FROM gpu_ivfpq_knn_batch('secret_v', ARRAY[ARRAY[5,10,0,1]]::real[], 3);
RESET row_security;
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM secret ORDER BY v <-> '{5,10,0,1}' LIMIT 5;
SELECT count(*) AS rows_seen, count(*) FILTER (WHERE owner <> 'alice') AS other_owners
FROM (SELECT owner FROM secret ORDER BY v <-> '{5,10,0,1}' LIMIT 50) s;
RESET enable_seqscan;
RESET ROLE;
-- The owner (policies do not apply to it) still may.
SELECT count(*) AS owner_rows FROM gpu_ivfpq_knn_batch('secret_v', ARRAY[ARRAY[5,10,0,1]]::real[], 3);

-- pg_monitor members read the status views.
SET ROLE gpu_ivfpq_monitor;
SELECT count(*) AS status_rows FROM gpu_ivfpq_status;
SELECT count(*) >= 0 AS mirrors_readable FROM gpu_ivfpq_mirrors;
RESET ROLE;

-- An index's expression is its table owner's code: the checker's read of
-- the table runs it as the owner, restricted, not as whoever runs the
-- check (here a superuser).
CREATE TABLE owned (id int, v real[]);
INSERT INTO owned SELECT i, ARRAY[sin(i), cos(i), sin(i * 0.3), cos(i * 0.7)]::real[] FROM generate_series(1, 500) i;
ALTER TABLE owned OWNER TO gpu_ivfpq_nobody;
CREATE FUNCTION owner_only(x real[]) RETURNS real[] IMMUTABLE LANGUAGE plpgsql AS
$$BEGIN IF current_user <> 'gpu_ivfpq_nobody' THEN RAISE EXCEPTION 'ran as %', current_user; END IF; RETURN x; END$$;
CREATE INDEX owned_v ON owned USING gpu_ivfpq (owner_only(v)) WITH (lists = 4, m = 2);
SELECT gpu_ivfpq_check('owned_v', true) AS checked_as_owner;
DROP TABLE owned;
DROP FUNCTION owner_only(real[]);

-- It runs with search_path "pg_catalog, pg_temp": a caller who may read the
-- table cannot have its own objects stand in for those the owner's
-- functions name (here abs(), through a schema first on its path), which
-- would run the caller's code as the owner.
CREATE FUNCTION absv(x real[]) RETURNS real[] IMMUTABLE LANGUAGE plpgsql AS
$$BEGIN RETURN ARRAY[abs(x[1]), abs(x[2]), abs(x[3]), abs(x[4])]::real[]; END$$;
CREATE TABLE pathed (id int, v real[]);
INSERT INTO pathed SELECT i, ARRAY[sin(i), cos(i), sin(i * 0.3), cos(i * 0.7)]::real[] FROM generate_series(1, 500) i;
CREATE INDEX pathed_v ON pathed USING gpu_ivfpq (absv(v)) WITH (lists = 4, m = 2);
GRANT SELECT ON pathed TO gpu_ivfpq_nobody;
CREATE SCHEMA nobody_schema AUTHORIZATION gpu_ivfpq_nobody;
SET ROLE gpu_ivfpq_nobody;
CREATE FUNCTION nobody_schema.abs(real) RETURNS real LANGUAGE plpgsql AS
$$BEGIN RAISE EXCEPTION 'the caller''s abs() ran as %', current_user; END$$;
SET search_path = nobody_schema, pg_catalog, public;
SELECT count(*) AS range_rows FROM gpu_ivfpq_range('public.pathed_v', '{.5,.5,.5,.5}', 'Infinity');
SELECT count(*) AS graph_rows FROM gpu_ivfpq_knn_graph('public.pathed_v', 2);
RESET search_path;
RESET ROLE;
DROP SCHEMA nobody_schema CASCADE;
DROP TABLE pathed;
DROP FUNCTION absv(real[]);

DROP TABLE secret;
DROP ROLE gpu_ivfpq_nobody;
DROP ROLE gpu_ivfpq_monitor;
