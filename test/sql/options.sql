-- Index options (lists, m, nbits), their ranges and defaults, what the
-- build records in the metapage, and the GUCs.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
CREATE EXTENSION IF NOT EXISTS pageinspect;
RESET client_min_messages;

-- Decodes the metapage (block 0; its contents start after the 24-byte page
-- header): dimensions, lists, m, nbits, metric (0 = L2, 1 = inner product,
-- 2 = cosine), trained, and the rows indexed by the build. Little-endian.
CREATE FUNCTION ivfpq_meta(idx regclass,
	OUT dimensions int, OUT lists int, OUT m int, OUT nbits int,
	OUT metric int, OUT trained bool, OUT build_tuples bigint)
LANGUAGE sql AS $$
	WITH p AS (SELECT substr(get_raw_page(idx::text, 0), 25, 56) AS b)
	SELECT get_byte(b, 8) + get_byte(b, 9) * 256 + get_byte(b, 10) * 65536,
	       get_byte(b, 12) + get_byte(b, 13) * 256 + get_byte(b, 14) * 65536,
	       get_byte(b, 16) + get_byte(b, 17) * 256,
	       get_byte(b, 18) + get_byte(b, 19) * 256,
	       get_byte(b, 20),
	       get_byte(b, 21) <> 0,
	       get_byte(b, 48) + get_byte(b, 49) * 256::bigint + get_byte(b, 50) * 65536::bigint
	FROM p
$$;

-- 200 rows of 16 dimensions (deterministic).
CREATE TABLE opt (id int, v real[]);
INSERT INTO opt
SELECT i, ARRAY(SELECT ((i * 37 + j * 101) % 97)::real FROM generate_series(1, 16) j)
FROM generate_series(1, 200) i;

-- lists: 1 .. 65536.
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (lists = 0);
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (lists = -5);
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (lists = 65537);
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (lists = 'many');
-- m: 1 .. 256, and a divisor of the dimension; the error lists the divisors.
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (m = -1);
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (m = 0);
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (m = 257);
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (lists = 4, m = 3);
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (lists = 4, m = 32);
-- nbits: 8 only.
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (nbits = 4);
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (nbits = 16);
-- Unknown options, and table options, are rejected.
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (probes = 10);
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (fillfactor = 50);
-- No index was left behind by the failures.
SELECT count(*) FROM pg_indexes WHERE tablename = 'opt';

-- Defaults: 100 lists, m chosen from the dimension (16 / 8 = 2), nbits 8.
CREATE INDEX opt_default ON opt USING gpu_ivfpq (v);
SELECT reloptions FROM pg_class WHERE relname = 'opt_default';
SELECT * FROM ivfpq_meta('opt_default');
SELECT pg_get_indexdef('opt_default'::regclass);
DROP INDEX opt_default;

-- Explicit values, at the ends of the ranges.
CREATE INDEX opt_explicit ON opt USING gpu_ivfpq (v) WITH (lists = 10, m = 4, nbits = 8);
SELECT reloptions FROM pg_class WHERE relname = 'opt_explicit';
SELECT * FROM ivfpq_meta('opt_explicit');
DROP INDEX opt_explicit;
CREATE INDEX opt_m_dim ON opt USING gpu_ivfpq (v) WITH (lists = 1, m = 16);
SELECT lists, m FROM ivfpq_meta('opt_m_dim');
DROP INDEX opt_m_dim;
CREATE INDEX opt_m1 ON opt USING gpu_ivfpq (v) WITH (lists = 1, m = 1);
SELECT lists, m FROM ivfpq_meta('opt_m1');
DROP INDEX opt_m1;
-- No m: chosen from the dimension (m = 0 is refused above).
CREATE INDEX opt_m0 ON opt USING gpu_ivfpq (v) WITH (lists = 2);
SELECT lists, m FROM ivfpq_meta('opt_m0');
DROP INDEX opt_m0;

-- The metric comes from the operator class.
CREATE INDEX opt_l2 ON opt USING gpu_ivfpq (v real_l2_ops) WITH (lists = 2);
CREATE INDEX opt_ip ON opt USING gpu_ivfpq (v real_ip_ops) WITH (lists = 2);
CREATE INDEX opt_cos ON opt USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 2);
SELECT c.relname, (ivfpq_meta(c.oid)).metric
FROM pg_class c WHERE c.relname IN ('opt_l2', 'opt_ip', 'opt_cos') ORDER BY 1;
DROP INDEX opt_l2, opt_ip, opt_cos;

-- The default m for other dimensions: the largest divisor of the dimension
-- that is at most dimension / 8 (and at most 64), at least 1.
CREATE TABLE opt_dims (d int, v real[]);
INSERT INTO opt_dims
SELECT d, ARRAY(SELECT ((i * 7 + j) % 13)::real FROM generate_series(1, d) j)
FROM unnest(ARRAY[1, 3, 12, 100, 784, 1024]) d, generate_series(1, 3) i;
CREATE FUNCTION default_m(dim int) RETURNS int LANGUAGE plpgsql AS $$
DECLARE
	result int;
BEGIN
	SET LOCAL client_min_messages = warning;
	EXECUTE format('CREATE TEMP TABLE dm AS SELECT v FROM opt_dims WHERE d = %s', dim);
	CREATE INDEX dm_idx ON dm USING gpu_ivfpq (v) WITH (lists = 1);
	SELECT m INTO result FROM ivfpq_meta('dm_idx');
	DROP TABLE dm;
	RETURN result;
END $$;
SELECT d, default_m(d) FROM unnest(ARRAY[1, 3, 12, 100, 784, 1024]) d;
-- The hint lists divisors up to 256 only.
CREATE TEMP TABLE dm AS SELECT v FROM opt_dims WHERE d = 784;
CREATE INDEX ON dm USING gpu_ivfpq (v) WITH (lists = 1, m = 100);
CREATE TEMP TABLE dm12 AS SELECT v FROM opt_dims WHERE d = 12;
CREATE INDEX ON dm12 USING gpu_ivfpq (v) WITH (lists = 1, m = 5);
DROP TABLE dm, dm12, opt_dims;
DROP FUNCTION default_m(int);

-- An index built on an empty real[] table keeps the options for its
-- REINDEX; its first vector sets the dimension, and m is checked against it
-- then, not at the REINDEX: the insert fails, naming the index and what to
-- set, until the option divides the dimension.
CREATE TABLE opt_empty (v real[]);
CREATE INDEX opt_empty_idx ON opt_empty USING gpu_ivfpq (v) WITH (lists = 3, m = 5);
SELECT * FROM ivfpq_meta('opt_empty_idx');
INSERT INTO opt_empty SELECT v FROM opt;
SELECT * FROM ivfpq_meta('opt_empty_idx');
ALTER INDEX opt_empty_idx SET (m = 8);
INSERT INTO opt_empty SELECT v FROM opt;
SELECT * FROM ivfpq_meta('opt_empty_idx');
REINDEX INDEX opt_empty_idx;
SELECT * FROM ivfpq_meta('opt_empty_idx');
-- The same with RESET (m): chosen from the first vector's dimension.
TRUNCATE opt_empty;
ALTER INDEX opt_empty_idx SET (m = 3);
INSERT INTO opt_empty VALUES ('{1,2,3,4}');
ALTER INDEX opt_empty_idx RESET (m);
INSERT INTO opt_empty VALUES ('{1,2,3,4}');
REINDEX INDEX opt_empty_idx;
SELECT dimensions, lists, m, trained FROM ivfpq_meta('opt_empty_idx');
DROP TABLE opt_empty;
-- A table with rows: m is checked at its first row.
CREATE INDEX ON opt USING gpu_ivfpq (v) WITH (lists = 1, m = 6);

-- ALTER INDEX SET/RESET validates the options; they apply at the next build.
CREATE INDEX opt_alter ON opt USING gpu_ivfpq (v) WITH (lists = 5);
ALTER INDEX opt_alter SET (lists = 0);
ALTER INDEX opt_alter SET (m = 0);
ALTER INDEX opt_alter SET (nbits = 7);
ALTER INDEX opt_alter SET (bogus = 1);
ALTER INDEX opt_alter SET (lists = 7, m = 8);
SELECT reloptions FROM pg_class WHERE relname = 'opt_alter';
SELECT lists, m FROM ivfpq_meta('opt_alter');
REINDEX INDEX opt_alter;
SELECT lists, m FROM ivfpq_meta('opt_alter');
ALTER INDEX opt_alter RESET (lists, m);
SELECT reloptions FROM pg_class WHERE relname = 'opt_alter';
REINDEX INDEX opt_alter;
SELECT lists, m FROM ivfpq_meta('opt_alter');
DROP INDEX opt_alter;

-- What the access method cannot do.
CREATE INDEX ON opt USING gpu_ivfpq (id);
CREATE INDEX ON opt USING gpu_ivfpq ((v::float8[]));
CREATE INDEX ON opt USING gpu_ivfpq (v, id, id);
CREATE INDEX ON opt USING gpu_ivfpq (v) INCLUDE (id);
CREATE UNIQUE INDEX ON opt USING gpu_ivfpq (v);
CREATE INDEX ON opt USING gpu_ivfpq (v int4_ops);

-- The GUCs: defaults, units, ranges; the prefix is reserved.
SHOW gpu_ivfpq.probes;
SHOW gpu_ivfpq.rerank;
SHOW gpu_ivfpq.max_scan_tuples;
SHOW gpu_ivfpq.table_memory;
SELECT name, setting, unit, min_val, max_val, context FROM pg_settings
WHERE name LIKE 'gpu_ivfpq.%' AND name NOT LIKE 'gpu_ivfpq.service_emulate%' ORDER BY name;
SET gpu_ivfpq.probes = 0;
SET gpu_ivfpq.probes = 65537;
SET gpu_ivfpq.rerank = 0;
SET gpu_ivfpq.rerank = 1000001;
SET gpu_ivfpq.max_scan_tuples = 0;
-- (How the range of a setting with a unit is worded differs between
-- PostgreSQL versions: the message is shown without it.)
DO $$ BEGIN SET gpu_ivfpq.table_memory = -1;
EXCEPTION WHEN invalid_parameter_value THEN
  RAISE NOTICE 'refused: %', regexp_replace(SQLERRM, ' \([^)]*\)$', '');
END $$;
SET gpu_ivfpq.probes = 'all';
SET gpu_ivfpq.no_such_setting = 1;
SET gpu_ivfpq.placement = 'everywhere';
SET gpu_ivfpq.placement = shard;
SHOW gpu_ivfpq.placement;
ALTER SYSTEM SET gpu_ivfpq.devices = '0,,1';
ALTER SYSTEM SET gpu_ivfpq.devices = 'all';
ALTER SYSTEM SET gpu_ivfpq.devices = '0,1,0';
ALTER SYSTEM SET gpu_ivfpq.devices = '0,';
ALTER SYSTEM SET gpu_ivfpq.devices = '0,5000';
SET gpu_ivfpq.probes = 65536;
SET gpu_ivfpq.rerank = 1000000;
SET gpu_ivfpq.max_scan_tuples = 2147483647;
SET gpu_ivfpq.table_memory = '1GB';
SHOW gpu_ivfpq.table_memory;
SET gpu_ivfpq.table_memory = 0;
SHOW gpu_ivfpq.table_memory;
RESET ALL;
SHOW gpu_ivfpq.probes;

DROP TABLE opt;
DROP FUNCTION ivfpq_meta(regclass);

-- The indexed column is distance-orderable; other properties come from core.
CREATE TABLE prop_t (v real[]);
CREATE INDEX prop_i ON prop_t USING gpu_ivfpq (v);
SELECT pg_index_column_has_property('prop_i'::regclass, 1, 'distance_orderable') AS distance_orderable,
       pg_index_column_has_property('prop_i'::regclass, 1, 'orderable') AS orderable,
       pg_index_has_property('prop_i'::regclass, 'clusterable') AS clusterable;
DROP TABLE prop_t;

-- Placement over several GPUs: an index option, checked, read when a mirror loads.
CREATE TABLE place_t (v real[]);
CREATE INDEX place_bad ON place_t USING gpu_ivfpq (v) WITH (placement = everywhere);
CREATE INDEX place_i ON place_t USING gpu_ivfpq (v) WITH (placement = shard);
ALTER INDEX place_i SET (placement = replicate);
SELECT reloptions FROM pg_class WHERE relname = 'place_i';
ALTER INDEX place_i RESET (placement);
DROP TABLE place_t;

-- ALTER INDEX ... SET: options its next build (REINDEX, VACUUM FULL, a
-- restore) could not use for the vectors it holds are refused at once;
-- an index with no vectors yet takes any (its first row checks them).
CREATE TABLE alt_t (v real[]);
INSERT INTO alt_t SELECT ARRAY[i, i + 1, i + 2, i + 3, i + 4, i + 5, i + 6, i + 7]::real[] FROM generate_series(1, 300) i;
CREATE INDEX alt_i ON alt_t USING gpu_ivfpq (v) WITH (lists = 4);
ALTER INDEX alt_i SET (m = 3);
ALTER INDEX alt_i SET (m = 4);
ALTER INDEX alt_i RENAME TO alt_j;
SELECT reloptions FROM pg_class WHERE relname = 'alt_j';
VACUUM FULL alt_t;
CREATE TABLE alt_wide (v real[]);
INSERT INTO alt_wide SELECT array_fill(i::real, ARRAY[2048]) FROM generate_series(1, 3) i;
CREATE INDEX alt_w ON alt_wide USING gpu_ivfpq (v) WITH (lists = 1, store_vectors = off);
ALTER INDEX alt_w SET (codes = rabitq);
CREATE TABLE alt_empty (v real[]);
CREATE INDEX alt_e ON alt_empty USING gpu_ivfpq (v);
ALTER INDEX alt_e SET (m = 3);
-- An index a failed CREATE INDEX CONCURRENTLY left invalid takes options
-- (its REINDEX checks them, as a build does).
CREATE TABLE alt_bad (v real[]);
INSERT INTO alt_bad SELECT ARRAY[i, 1, 2, 3]::real[] FROM generate_series(1, 100) i;
INSERT INTO alt_bad VALUES ('{1,2,3}');
CREATE INDEX CONCURRENTLY alt_b ON alt_bad USING gpu_ivfpq (v) WITH (lists = 2);
SELECT indisvalid FROM pg_index WHERE indexrelid = 'alt_b'::regclass;
ALTER INDEX alt_b SET (placement = shard);
ALTER INDEX alt_b SET (m = 2);
DELETE FROM alt_bad WHERE array_length(v, 1) = 3;
REINDEX INDEX alt_b;
SELECT indisvalid, reloptions FROM pg_index JOIN pg_class ON oid = indexrelid WHERE indexrelid = 'alt_b'::regclass;
DROP TABLE alt_t, alt_wide, alt_empty, alt_bad;
-- An option the other kind of codes uses, when given: a NOTICE.
CREATE TABLE ign_t (v real[]);
INSERT INTO ign_t SELECT ARRAY[i, i, i, i]::real[] FROM generate_series(1, 100) i;
SET client_min_messages = notice;
CREATE INDEX ign_rq ON ign_t USING gpu_ivfpq (v) WITH (lists = 2, codes = rabitq, store_vectors = on);
CREATE INDEX ign_pq ON ign_t USING gpu_ivfpq (v) WITH (lists = 2, bits = 2);
SET client_min_messages = warning;
DROP TABLE ign_t;
