-- Filter columns: an index on (vector, integer) applies WHERE col <op>
-- constant to the entries before ranking. With every list probed the
-- answers equal a sequential scan's for =, <, <=, >, >=, BETWEEN, across
-- smallint, integer and bigint constants; NULL filter values; inserts,
-- VACUUM and the index checker; which filters are not pushed down; and the
-- column rules.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
RESET client_min_messages;

\i test/sql/knn_function.inc
-- 600 rows of 16 dimensions, a tenant column (0..9, and NULL for every
-- 50th row), a bigint column with its extremes, and 3 query vectors.
SELECT setseed(0.17);
CREATE TABLE ft (id int, tenant int, big bigint, v real[]);
INSERT INTO ft
SELECT i, CASE WHEN i % 50 = 0 THEN NULL ELSE (i * 7) % 10 END,
       CASE WHEN i % 97 = 0 THEN -9223372036854775808 WHEN i % 89 = 0 THEN 9223372036854775807
            ELSE i - 300 END,
       ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 16) WHERE i > 0)
FROM generate_series(1, 600) i;
CREATE TABLE fq (qid int, qv real[]);
INSERT INTO fq
SELECT i, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 16) WHERE i > 0)
FROM generate_series(1, 3) i;
SELECT qv AS q1 FROM fq WHERE qid = 1 \gset

CREATE INDEX ft_tenant ON ft USING gpu_ivfpq (v, tenant) WITH (lists = 8, m = 4);
ANALYZE ft;
-- Every list and enough candidates: the index's answers are exact.
SET gpu_ivfpq.probes = 8;
SET gpu_ivfpq.rerank = 600;

-- The filter is an index condition (pushed down), not a Filter above the scan.
SET enable_seqscan = off;
EXPLAIN (COSTS OFF) SELECT id FROM ft WHERE tenant = 3 ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5;
EXPLAIN (COSTS OFF) SELECT id FROM ft WHERE tenant BETWEEN 2 AND 4 ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5;
EXPLAIN (COSTS OFF) SELECT id FROM ft WHERE tenant = 3::bigint ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5;
-- Not pushed down: other operators and columns stay a Filter.
EXPLAIN (COSTS OFF) SELECT id FROM ft WHERE tenant <> 3 ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5;
EXPLAIN (COSTS OFF) SELECT id FROM ft WHERE tenant IS NULL ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5;
EXPLAIN (COSTS OFF) SELECT id FROM ft WHERE id % 3 = 0 ORDER BY v <-> '{1,2,3,4,5,6,7,8,9,0,1,2,3,4,5,6}' LIMIT 5;
RESET enable_seqscan;

-- Index answers equal sequential ones, per query and filter.
CREATE TABLE filters (f text);
INSERT INTO filters VALUES
	('tenant = 3'), ('tenant = 3::smallint'), ('tenant = 3::bigint'), ('tenant < 2'),
	('tenant <= 2'), ('tenant > 7'), ('tenant >= 7'), ('tenant BETWEEN 4 AND 5'),
	('tenant > 2 AND tenant < 5 AND tenant <> 3'), ('tenant = 3 AND id % 2 = 0'),
	('tenant >= -2147483648'), ('tenant < 9223372036854775807'), ('tenant > -9223372036854775808');
SELECT f.f, q.qid,
       knn(format('SELECT id FROM ft WHERE %s ORDER BY v <-> %L LIMIT 12', f.f, q.qv), true) =
       knn(format('SELECT id FROM ft WHERE %s ORDER BY v <-> %L LIMIT 12', f.f, q.qv), false) AS same
FROM filters f, fq q ORDER BY 1, 2;
-- Every row of a tenant, in order, and nothing else.
SELECT count(*) AS rows, bool_and(tenant = 6) AS all_six
FROM (SELECT id, tenant FROM ft WHERE tenant = 6 ORDER BY v <-> :'q1' LIMIT 1000) x;
-- Nothing matches: a NULL comparison, an empty range, a value out of the type's range.
SELECT count(*) FROM (SELECT id FROM ft WHERE tenant = NULL ORDER BY v <-> :'q1' LIMIT 5) x;
SELECT count(*) FROM (SELECT id FROM ft WHERE tenant > 5 AND tenant < 4 ORDER BY v <-> :'q1' LIMIT 5) x;
SELECT count(*) FROM (SELECT id FROM ft WHERE tenant = 3000000000 ORDER BY v <-> :'q1' LIMIT 5) x;
-- Without a filter, rows whose tenant is NULL are found as any other.
SELECT count(*) FILTER (WHERE tenant IS NULL) AS null_tenants
FROM (SELECT id, tenant FROM ft ORDER BY v <-> :'q1' LIMIT 600) x;
-- A prepared statement rescans with a new filter value each time.
SET enable_seqscan = off;
PREPARE by_tenant(int) AS SELECT tenant FROM ft WHERE tenant = $1 ORDER BY v <-> :'q1' LIMIT 3;
EXECUTE by_tenant(1);
EXECUTE by_tenant(2);
DEALLOCATE by_tenant;
RESET enable_seqscan;
SELECT t, knn(format('SELECT id FROM ft WHERE tenant = %s ORDER BY v <-> %L LIMIT 4', t, :'q1'), true) =
          knn(format('SELECT id FROM ft WHERE tenant = %s ORDER BY v <-> %L LIMIT 4', t, :'q1'), false) AS same
FROM generate_series(0, 9) t;
-- A LATERAL rescan: each outer row's own filter value.
SET enable_seqscan = off;
SELECT t.t, (SELECT array_agg(x.tenant) = array_fill(t.t, ARRAY[3])
             FROM (SELECT tenant FROM ft WHERE tenant = t.t ORDER BY v <-> :'q1' LIMIT 3) x) AS own_tenant
FROM generate_series(0, 3) t(t);
RESET enable_seqscan;

-- Inserts after the build carry their filter value; VACUUM keeps the rest.
INSERT INTO ft
SELECT 1000 + i, 11, 0, ARRAY(SELECT (random() * 10)::real FROM generate_series(1, 16) WHERE i > 0)
FROM generate_series(1, 20) i;
DELETE FROM ft WHERE tenant = 6;
VACUUM ft;
SELECT count(*) AS eleven FROM (SELECT id FROM ft WHERE tenant = 11 ORDER BY v <-> :'q1' LIMIT 100) x;
SELECT count(*) AS six FROM (SELECT id FROM ft WHERE tenant = 6 ORDER BY v <-> :'q1' LIMIT 100) x;
SELECT q.qid, knn(format('SELECT id FROM ft WHERE tenant >= 9 ORDER BY v <-> %L LIMIT 15', q.qv), true) =
              knn(format('SELECT id FROM ft WHERE tenant >= 9 ORDER BY v <-> %L LIMIT 15', q.qv), false) AS same
FROM fq q ORDER BY 1;
-- The checker compares each entry's filter value with its row.
SELECT gpu_ivfpq_check('ft_tenant'::regclass, true);

-- A bigint filter column: its extremes, and INT64_MIN (which NULLs share
-- in the index) found exactly; NULL rows never pass a filter.
UPDATE ft SET big = NULL WHERE id % 101 = 0;
CREATE INDEX ft_big ON ft USING gpu_ivfpq (v, big) WITH (lists = 8, m = 4);
DROP INDEX ft_tenant;
SELECT f, knn(format('SELECT id FROM ft WHERE %s ORDER BY v <-> %L LIMIT 10', f, :'q1'), true) =
          knn(format('SELECT id FROM ft WHERE %s ORDER BY v <-> %L LIMIT 10', f, :'q1'), false) AS same
FROM unnest(ARRAY['big = -9223372036854775808', 'big = 9223372036854775807', 'big < -100',
                  'big <= -9223372036854775808', 'big > 250', 'big >= 9223372036854775807']) f;
SELECT count(*) AS min_rows FROM (SELECT id FROM ft WHERE big = -9223372036854775808 ORDER BY v <-> :'q1' LIMIT 100) x;
SELECT gpu_ivfpq_check('ft_big'::regclass, true);

-- Column rules.
CREATE INDEX ON ft USING gpu_ivfpq (v, tenant, big);
CREATE INDEX ON ft USING gpu_ivfpq (tenant, v);
CREATE INDEX ON ft USING gpu_ivfpq (v, v);
CREATE TABLE ft_text (v real[], label text);
CREATE INDEX ON ft_text USING gpu_ivfpq (v, label);
-- An empty table: the untrained index filters too.
CREATE TABLE ft_empty (v real[], t smallint);
CREATE INDEX ft_empty_idx ON ft_empty USING gpu_ivfpq (v, t);
INSERT INTO ft_empty VALUES ('{1,2}', 1), ('{2,3}', 2), ('{3,4}', NULL), ('{0,0}', 2);
SET enable_seqscan = off;
SELECT v, t FROM ft_empty WHERE t = 2 ORDER BY v <-> '{0,0}' LIMIT 5;
SELECT v, t FROM ft_empty WHERE t >= 1::bigint ORDER BY v <-> '{0,0}' LIMIT 5;
RESET enable_seqscan;

DROP TABLE ft, fq, filters, ft_text, ft_empty;
DROP FUNCTION knn(text, bool);
