-- Indexes with RaBitQ codes (codes = rabitq) served by the GPU service: a
-- mirror of the codes and the model, scans answered by the GPU's estimates
-- and re-ranked from the table. With every list probed and every row
-- re-ranked, gpu_ivfpq.device = gpu answers as device = cpu for each
-- operator class, with a filter column, after inserts (the change log) and
-- DELETE + VACUUM (removals), and through gpu_ivfpq_knn_batch; so do rows
-- wider than a change-log entry's code bytes (300 and 1000 dimensions).
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
RESET client_min_messages;

\i test/sql/knn_function.inc
-- 1200 rows of 24 dimensions around 12 centres, a tenant column, 5 queries.
SELECT setseed(0.41);
CREATE TABLE srq (id int, tenant int, v real[]);
INSERT INTO srq
SELECT i, i % 7, ARRAY(SELECT ((i % 12) * 0.3 + random())::real FROM generate_series(1, 24) WHERE i > 0)
FROM generate_series(1, 1200) i;
CREATE TABLE srqq (qid int, qv real[]);
INSERT INTO srqq
SELECT i, ARRAY(SELECT ((i * 2) * 0.3 + random())::real FROM generate_series(1, 24) WHERE i > 0)
FROM generate_series(1, 5) i;

CREATE INDEX srq_l2 ON srq USING gpu_ivfpq (v) WITH (lists = 8, codes = rabitq);
CREATE INDEX srq_ip ON srq USING gpu_ivfpq (v real_ip_ops) WITH (lists = 8, codes = rabitq, bits = 7);
CREATE INDEX srq_cos ON srq USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 8, codes = rabitq, bits = 1);

-- Mirrored: every entry, no vector copies.
SELECT i AS index, gpu_ivfpq_prewarm(i) AS entries FROM unnest('{srq_l2,srq_ip,srq_cos}'::regclass[]) i;
SELECT index, entries, vectors, filter_keys FROM gpu_ivfpq_mirrors WHERE index LIKE 'srq%' ORDER BY index;

-- The GPU's answers (device = gpu: an error rather than the CPU) equal the
-- CPU engine's, every list probed and every row re-ranked, and a
-- sequential scan's.
CREATE FUNCTION gpu_equals_cpu(op text, filter text DEFAULT 'true', lim int DEFAULT 10)
RETURNS TABLE (qid int, same bool, exact bool) LANGUAGE plpgsql AS $$
DECLARE
	q record;
	sql text;
	gpu int[];
	cpu int[];
BEGIN
	FOR q IN SELECT * FROM srqq ORDER BY 1 LOOP
		sql := format('SELECT id FROM srq WHERE %s ORDER BY v %s %L LIMIT %s', filter, op, q.qv, lim);
		PERFORM set_config('gpu_ivfpq.device', 'gpu', true);
		gpu := knn(sql, true);
		PERFORM set_config('gpu_ivfpq.device', 'cpu', true);
		cpu := knn(sql, true);
		PERFORM set_config('gpu_ivfpq.device', 'gpu', true);
		qid := q.qid;
		same := gpu = cpu;
		exact := gpu = knn(sql, false);
		RETURN NEXT;
	END LOOP;
END $$;
SET gpu_ivfpq.probes = 8;
SET gpu_ivfpq.rerank = 2000;
SELECT queries_gpu AS gpu_before FROM gpu_ivfpq_status \gset
SELECT * FROM gpu_equals_cpu('<->');
SELECT * FROM gpu_equals_cpu('<#>');
SELECT * FROM gpu_equals_cpu('<=>');
-- Those scans were the GPU's: the status view counted them.
SELECT (SELECT queries_gpu FROM gpu_ivfpq_status) - :gpu_before >= 15 AS gpu_served;
-- Past the first round: the scan goes on in distance order.
SET gpu_ivfpq.rerank = 20;
SELECT * FROM gpu_equals_cpu('<->', 'true', 60);
SET gpu_ivfpq.rerank = 2000;

-- Rows inserted after the mirror loaded reach it through the change log:
-- each new row is the nearest to its own vector on the GPU.
SET gpu_ivfpq.device = gpu;
INSERT INTO srq
SELECT 1200 + i, i % 7, ARRAY(SELECT (9 + i + random())::real FROM generate_series(1, 24) WHERE i > 0)
FROM generate_series(1, 20) i;
SELECT count(*) AS found_on_gpu FROM srq s
WHERE s.id > 1200 AND (SELECT t.id FROM srq t ORDER BY t.v <-> s.v LIMIT 1) = s.id;

-- DELETE + VACUUM: the mirrors lose the entries in place (as many entries
-- as rows), and answer as the CPU engine.
DELETE FROM srq WHERE id % 5 = 0;
VACUUM srq;
SELECT index, entries = (SELECT count(*) FROM srq) AS entries_are_rows FROM gpu_ivfpq_mirrors
WHERE index LIKE 'srq%' ORDER BY index;
SELECT * FROM gpu_equals_cpu('<->');
SELECT * FROM gpu_equals_cpu('<=>');

-- gpu_ivfpq_knn_batch on the GPU equals the CPU engine's and the scans'.
CREATE FUNCTION batch_ids(idx text) RETURNS TABLE (query int, ids int[]) LANGUAGE sql AS $$
	SELECT query, array_agg(srq.id ORDER BY rank)
	FROM gpu_ivfpq_knn_batch(idx::regclass, (SELECT array_agg(qv ORDER BY qid) FROM srqq), 10) r
	JOIN srq ON srq.ctid = r.tid GROUP BY query ORDER BY query
$$;
CREATE TEMP TABLE batch_gpu AS SELECT * FROM batch_ids('srq_ip');
SET gpu_ivfpq.device = cpu;
CREATE TEMP TABLE batch_cpu AS SELECT * FROM batch_ids('srq_ip');
SET gpu_ivfpq.device = gpu;
SELECT count(*) FILTER (WHERE g.ids = c.ids) AS same_as_cpu,
       count(*) FILTER (WHERE g.ids = ARRAY(SELECT id FROM srq ORDER BY v <#> q.qv, id LIMIT 10)) AS same_as_seq
FROM batch_gpu g JOIN batch_cpu c USING (query) JOIN srqq q ON q.qid = g.query;

-- A filter column: the mirror keeps the keys; filtered answers equal the CPU's.
DROP INDEX srq_l2, srq_ip, srq_cos;
CREATE INDEX srq_tenant ON srq USING gpu_ivfpq (v, tenant) WITH (lists = 8, codes = rabitq, bits = 3);
SELECT gpu_ivfpq_prewarm('srq_tenant') = (SELECT count(*) FROM srq) AS mirrored;
SELECT filter_keys, vectors FROM gpu_ivfpq_mirrors WHERE index = 'srq_tenant';
SELECT * FROM gpu_equals_cpu('<->', 'tenant = 3');
SELECT * FROM gpu_equals_cpu('<->', 'tenant BETWEEN 2 AND 4');
RESET gpu_ivfpq.probes;
RESET gpu_ivfpq.rerank;

-- Rows wider than the 128 code bytes a change-log entry holds: 300
-- dimensions at 4 bits (160 code bytes and 12 of factors) and 1000 at 8
-- (1036 bytes). Mirrored like any other; rows inserted after the mirror
-- loaded reach it through the change log, their codes in its vector ring;
-- DELETE + VACUUM removes entries in place; answers equal the CPU engine's.
CREATE FUNCTION wide_equals_cpu(tbl text, qids int[]) RETURNS TABLE (qid int, same bool, exact bool)
LANGUAGE plpgsql AS $$
DECLARE
	qv real[];
	sql text;
	gpu int[];
	cpu int[];
BEGIN
	FOREACH qid IN ARRAY qids LOOP
		EXECUTE format('SELECT v FROM %I WHERE id = $1', tbl) INTO qv USING qid;
		sql := format('SELECT id FROM %I ORDER BY v <-> %L LIMIT 10', tbl, qv);
		PERFORM set_config('gpu_ivfpq.device', 'gpu', true);
		gpu := knn(sql, true);
		PERFORM set_config('gpu_ivfpq.device', 'cpu', true);
		cpu := knn(sql, true);
		PERFORM set_config('gpu_ivfpq.device', 'gpu', true);
		same := gpu = cpu;
		exact := gpu = knn(sql, false);
		RETURN NEXT;
	END LOOP;
END $$;
CREATE TABLE srq_wide (id int, v real[]);
INSERT INTO srq_wide
SELECT i, ARRAY(SELECT ((i % 6) + random())::real FROM generate_series(1, 300) WHERE i > 0)
FROM generate_series(1, 400) i;
CREATE INDEX srq_wide_idx ON srq_wide USING gpu_ivfpq (v) WITH (lists = 4, codes = rabitq, bits = 4);
CREATE TABLE srq_wider (id int, v real[]);
INSERT INTO srq_wider
SELECT i, ARRAY(SELECT ((i % 4) + random())::real FROM generate_series(1, 1000) WHERE i > 0)
FROM generate_series(1, 150) i;
CREATE INDEX srq_wider_idx ON srq_wider USING gpu_ivfpq (v) WITH (lists = 2, codes = rabitq, bits = 8);
SELECT i AS index, gpu_ivfpq_prewarm(i) AS entries FROM unnest('{srq_wide_idx,srq_wider_idx}'::regclass[]) i;
SELECT index, entries, vectors FROM gpu_ivfpq_mirrors WHERE index LIKE 'srq_wide%' ORDER BY index;
SET gpu_ivfpq.probes = 4;
SET gpu_ivfpq.rerank = 2000;
SELECT * FROM wide_equals_cpu('srq_wide', '{3,50,222}');
SELECT * FROM wide_equals_cpu('srq_wider', '{1,77}');

-- Inserts: committed once the mirrors took them (appends to the GPU's
-- mirrors). With one candidate re-ranked, each new row is the nearest to
-- its own vector only if the GPU has its code.
SELECT append_calls AS appends_before FROM gpu_ivfpq_status \gset
INSERT INTO srq_wide
SELECT 400 + i, ARRAY(SELECT (9 + i + random())::real FROM generate_series(1, 300) WHERE i > 0)
FROM generate_series(1, 20) i;
INSERT INTO srq_wider
SELECT 150 + i, ARRAY(SELECT (7 + i + random())::real FROM generate_series(1, 1000) WHERE i > 0)
FROM generate_series(1, 10) i;
SELECT (SELECT append_calls FROM gpu_ivfpq_status) > :appends_before AS appended_on_gpu;
SET gpu_ivfpq.device = gpu;
SET gpu_ivfpq.rerank = 1;
SET enable_seqscan = off;
SELECT count(*) AS found_on_gpu FROM srq_wide s
WHERE s.id > 400 AND (SELECT t.id FROM srq_wide t ORDER BY t.v <-> s.v LIMIT 1) = s.id;
SELECT count(*) AS found_on_gpu FROM srq_wider s
WHERE s.id > 150 AND (SELECT t.id FROM srq_wider t ORDER BY t.v <-> s.v LIMIT 1) = s.id;
RESET enable_seqscan;
SET gpu_ivfpq.rerank = 2000;
SELECT * FROM wide_equals_cpu('srq_wide', '{3,405,420}');
SELECT * FROM wide_equals_cpu('srq_wider', '{1,152,160}');

-- DELETE + VACUUM: as many entries as rows, answers as the CPU engine's.
-- The mirrors counted every GPU query since the prewarm (3 + 20 + 3 and
-- 2 + 10 + 3): the inserts did not make them reload from the pages.
DELETE FROM srq_wide WHERE id % 3 = 0;
DELETE FROM srq_wider WHERE id % 3 = 0;
VACUUM srq_wide, srq_wider;
SELECT index, entries = CASE index WHEN 'srq_wide_idx' THEN (SELECT count(*) FROM srq_wide)
                                   ELSE (SELECT count(*) FROM srq_wider) END AS entries_are_rows,
       queries
FROM gpu_ivfpq_mirrors WHERE index LIKE 'srq_wide%' ORDER BY index;
SELECT * FROM wide_equals_cpu('srq_wide', '{4,50,404}');
SELECT * FROM wide_equals_cpu('srq_wider', '{1,77,160}');
RESET gpu_ivfpq.probes;
RESET gpu_ivfpq.rerank;
RESET gpu_ivfpq.device;

-- A build through the service (which assigns and encodes every row) writes
-- the pages a build on the CPU engine writes, byte for byte past each page
-- header (its LSN and checksum) but for the metapage's build_id (a cache
-- key, new at every build): the same training, lists, codes and factors.
-- (So on the emulated GPU; a real GPU trains its own centroids.) The files
-- are read after a checkpoint (no pageinspect needed).
CREATE TABLE srq_pages (id int, v real[]);
INSERT INTO srq_pages
SELECT i, ARRAY(SELECT (((i * 7 + j * 13) % 29) * 0.37 + j * 0.01)::real FROM generate_series(1, 20) j)
FROM generate_series(1, 2500) i;
CREATE FUNCTION same_pages(a regclass, b regclass) RETURNS bool LANGUAGE sql AS $$
	SELECT length(fa) = length(fb) AND length(fa) % 8192 = 0 AND (SELECT bool_and(CASE WHEN blk = 0
		THEN substr(fa, 25, 24) = substr(fb, 25, 24) AND substr(fa, 53, 8140) = substr(fb, 53, 8140)
		ELSE substr(fa, blk * 8192 + 25, 8168) = substr(fb, blk * 8192 + 25, 8168) END)
		FROM generate_series(0, length(fa) / 8192 - 1) blk)
	FROM (SELECT pg_read_binary_file(pg_relation_filepath(a)) AS fa,
	             pg_read_binary_file(pg_relation_filepath(b)) AS fb) f
$$;
-- device = gpu: the build trains and encodes on the service or fails (a
-- fallback to the CPU would also say so in a WARNING).
SET gpu_ivfpq.device = gpu;
CREATE INDEX srq_pages_service ON srq_pages USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 6, codes = rabitq, bits = 5);
SET gpu_ivfpq.device = cpu;
CREATE INDEX srq_pages_cpu ON srq_pages USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 6, codes = rabitq, bits = 5);
RESET gpu_ivfpq.device;
CHECKPOINT;
SELECT (SELECT device NOT LIKE 'CPU emulation%' FROM gpu_ivfpq_status) OR same_pages('srq_pages_service', 'srq_pages_cpu')
	AS same_pages_as_cpu;
DROP TABLE srq_pages;
DROP FUNCTION same_pages(regclass, regclass);

DROP TABLE srq, srqq, srq_wide, srq_wider;
DROP FUNCTION gpu_equals_cpu(text, text, int);
DROP FUNCTION batch_ids(text);
DROP FUNCTION wide_equals_cpu(text, int[]);
DROP FUNCTION knn(text, bool);
