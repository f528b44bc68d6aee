-- codes = rabitq: indexes whose entries hold RaBitQ codes (bits per
-- dimension, no vector copies). With every list probed and every row
-- re-ranked the answers equal a sequential scan's, for each operator class,
-- a filter column, inserts after the build, deletes and VACUUM, the batch
-- functions; with fewer lists, recall as an index with PQ codes gets it;
-- an index a fraction of the size; the options' and limits' errors; the
-- index checker; what does not take such an index yet.
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
RESET client_min_messages;

\i test/sql/knn_function.inc
-- 3000 rows of 32 dimensions around 20 centres, a tenant column, 5 queries.
SELECT setseed(0.28);
CREATE TABLE rq (id int, tenant int, v real[]);
INSERT INTO rq
SELECT i, i % 7, ARRAY(SELECT ((i % 20) * 0.3 + random())::real FROM generate_series(1, 32) WHERE i > 0)
FROM generate_series(1, 3000) i;
INSERT INTO rq VALUES (3001, 1, NULL);
CREATE TABLE rqq (qid int, qv real[]);
INSERT INTO rqq
SELECT i, ARRAY(SELECT ((i * 3) * 0.3 + random())::real FROM generate_series(1, 32) WHERE i > 0)
FROM generate_series(1, 5) i;

-- The options: codes and bits (1..8); bad values are refused.
CREATE INDEX rq_bad ON rq USING gpu_ivfpq (v) WITH (codes = opq);
CREATE INDEX rq_bad ON rq USING gpu_ivfpq (v) WITH (codes = rabitq, bits = 0);
CREATE INDEX rq_bad ON rq USING gpu_ivfpq (v) WITH (codes = rabitq, bits = 9);
-- m is for PQ codes: RaBitQ codes say they ignore it.
CREATE INDEX rq_m ON rqq USING gpu_ivfpq (qv) WITH (lists = 1, codes = rabitq, m = 4);
DROP INDEX rq_m;

CREATE INDEX rq_l2 ON rq USING gpu_ivfpq (v) WITH (lists = 16, codes = rabitq);
CREATE INDEX rq_ip ON rq USING gpu_ivfpq (v real_ip_ops) WITH (lists = 16, codes = rabitq, bits = 7);
CREATE INDEX rq_cos ON rq USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 16, codes = rabitq, bits = 1);
-- The same rows in a second table, indexed with PQ codes and vector copies.
CREATE TABLE rqp AS SELECT * FROM rq;
CREATE INDEX rqp_pq ON rqp USING gpu_ivfpq (v) WITH (lists = 16, m = 8);
SELECT relname, reloptions FROM pg_class WHERE relname LIKE 'rq%\_%' AND relkind = 'i' ORDER BY relname;
-- Codes only: a fraction of the index with PQ codes and vector copies.
SELECT pg_relation_size('rq_l2') * 2 < pg_relation_size('rqp_pq') AS under_half;
SELECT i AS index, gpu_ivfpq_check(i, true) AS checked FROM unnest('{rq_l2,rq_ip,rq_cos}'::regclass[]) i;

-- Every list, every row re-ranked (from the table): exact answers.
-- (One index per operator on rq: each operator's scan uses its own.)
CREATE FUNCTION same_as_seq(op text, lim int DEFAULT 10, tab text DEFAULT 'rq', filter text DEFAULT 'true')
RETURNS TABLE (qid int, same bool) LANGUAGE sql AS $$
	SELECT q.qid,
		knn(format('SELECT id FROM %s WHERE %s ORDER BY v %s %L LIMIT %s', tab, filter, op, q.qv, lim), true) =
		knn(format('SELECT id FROM %s WHERE %s ORDER BY v %s %L LIMIT %s', tab, filter, op, q.qv, lim), false)
	FROM rqq q ORDER BY 1
$$;
SET gpu_ivfpq.probes = 16;
SET gpu_ivfpq.rerank = 3001;
SELECT * FROM same_as_seq('<->');
SELECT * FROM same_as_seq('<#>');
SELECT * FROM same_as_seq('<=>');
-- The bounds hold for all but a share of the rows (drawn at a confidence):
-- with every entry ranked the scan fetches every candidate before it
-- returns a row, so every query gets a sequential scan's answer (with the
-- bounds alone deciding, 1 of 200 such queries, 128 dimensions at 1 bit,
-- lost a row in a run on another seed).
CREATE TABLE rq128 (id int, v real[]);
INSERT INTO rq128
SELECT i, ARRAY(SELECT ((i % 50) * 0.05 + random())::real FROM generate_series(1, 128) WHERE i > 0)
FROM generate_series(1, 3000) i;
CREATE TABLE rq128q AS
SELECT id, ARRAY(SELECT (x + (random() - 0.5) * 0.6)::real FROM unnest(v) x) AS qv FROM rq128 WHERE id % 15 = 0;
CREATE INDEX rq128_l2 ON rq128 USING gpu_ivfpq (v) WITH (lists = 8, codes = rabitq, bits = 1);
SET gpu_ivfpq.probes = 8;
SELECT count(*) FILTER (WHERE
         knn(format('SELECT id FROM rq128 ORDER BY v <-> %L LIMIT 10', q.qv), true) IS DISTINCT FROM
         knn(format('SELECT id FROM rq128 ORDER BY v <-> %L LIMIT 10', q.qv), false)) AS differ,
       count(*) AS queries
FROM rq128q q;
DROP TABLE rq128, rq128q;
SET gpu_ivfpq.probes = 16;
-- Past the first round: the scan goes on in distance order.
SET gpu_ivfpq.rerank = 20;
SELECT * FROM same_as_seq('<->', 60);

-- Fewer lists: the codes' estimates pick the candidates, the table's rows
-- order them; recall@10 over the queries as good as the PQ index's here.
CREATE FUNCTION recall(tab text, probes int) RETURNS numeric LANGUAGE plpgsql AS $$
DECLARE
	hits int := 0;
	q record;
BEGIN
	PERFORM set_config('gpu_ivfpq.probes', probes::text, true);
	PERFORM set_config('gpu_ivfpq.rerank', '100', true);
	FOR q IN SELECT * FROM rqq LOOP
		hits := hits + cardinality(ARRAY(
			SELECT unnest(knn(format('SELECT id FROM %s ORDER BY v <-> %L LIMIT 10', tab, q.qv), true))
			INTERSECT
			SELECT unnest(knn(format('SELECT id FROM %s ORDER BY v <-> %L LIMIT 10', tab, q.qv), false))));
	END LOOP;
	RETURN hits / 50.0;
END $$;
SELECT recall('rq', 4) >= recall('rqp', 4) - 0.1 AS as_good, recall('rq', 4) >= 0.8 AS recall_ok;

-- Filter column: filtered answers equal a sequential scan's.
DROP INDEX rqp_pq;
CREATE INDEX rqp_tenant ON rqp USING gpu_ivfpq (v, tenant) WITH (lists = 16, codes = rabitq, bits = 3);
SET gpu_ivfpq.rerank = 3001;
SELECT * FROM same_as_seq('<->', 10, 'rqp', 'tenant = 3');
SELECT * FROM same_as_seq('<->', 10, 'rqp', 'tenant BETWEEN 2 AND 4');

-- Inserts after the build are encoded into their lists; deletes and VACUUM.
INSERT INTO rq
SELECT 3001 + i, i % 7, ARRAY(SELECT (1.5 + random())::real FROM generate_series(1, 32) WHERE i > 0)
FROM generate_series(1, 300) i;
DELETE FROM rq WHERE id % 5 = 0;
VACUUM rq;
SELECT i AS index, gpu_ivfpq_check(i, true) AS checked FROM unnest('{rq_l2,rq_ip,rq_cos}'::regclass[]) i;
SELECT * FROM same_as_seq('<->');
SELECT * FROM same_as_seq('<=>');

-- Batch k-NN: queries whose 10 rows equal a sequential scan's.
CREATE FUNCTION batch_same(OUT same bigint, OUT queries bigint) LANGUAGE sql AS $$
SELECT count(*) FILTER (WHERE b.ids = s.ids) AS same, count(*) AS queries
FROM (SELECT query, array_agg(rq.id ORDER BY rank) AS ids
      FROM gpu_ivfpq_knn_batch('rq_ip', (SELECT array_agg(qv ORDER BY qid) FROM rqq), 10) r
      JOIN rq ON rq.ctid = r.tid GROUP BY query) b
JOIN (SELECT qid AS query, ARRAY(SELECT id FROM rq ORDER BY v <#> rqq.qv, id LIMIT 10) AS ids FROM rqq) s
USING (query)
$$;
-- Batch k-NN and the k-NN graph: the same answers as the scans.
SET gpu_ivfpq.rerank = 100;
SELECT * FROM batch_same();
-- Rows deleted but not vacuumed stay in the lists: candidates fetched in
-- the order of their lower bounds pass over them, and the batch and the
-- scans still return the nearest visible rows.
BEGIN;
DELETE FROM rq WHERE id % 3 = 0;
SET LOCAL gpu_ivfpq.probes = 16;
SELECT * FROM batch_same();
SELECT * FROM same_as_seq('<->', 30);
ROLLBACK;
SET gpu_ivfpq.probes = 4;
SET client_min_messages = warning;
SELECT count(*) = 10 * (SELECT count(v) FROM rq) AS graph_rows FROM gpu_ivfpq_knn_graph('rq_l2', 10);
RESET client_min_messages;
-- 3000 queries: the re-rank from the table runs over parallel workers (a
-- group of queries at a time from a shared counter), with the same rows,
-- ranks and distances as the leader alone, deleted rows passed over alike.
CREATE FUNCTION batch_digest() RETURNS text LANGUAGE sql AS $$
SELECT md5(string_agg(format('%s %s %s %s', query, rank, tid, distance), ';' ORDER BY query, rank))
FROM gpu_ivfpq_knn_batch('rq_l2', (SELECT array_agg(v ORDER BY id) FROM rq WHERE id <= 3000), 10)
$$;
BEGIN;
DELETE FROM rq WHERE id % 5 = 0;
SET LOCAL max_parallel_workers_per_gather = 0;
SELECT batch_digest() AS serial \gset
SET LOCAL max_parallel_workers_per_gather = 2;
SELECT batch_digest() = :'serial' AS parallel_same;
ROLLBACK;
DROP FUNCTION batch_digest();
-- Queries re-ranked in a group (rows fetched once for all of them, in
-- rounds) get what each gets alone, deleted rows passed over alike.
BEGIN;
DELETE FROM rq WHERE id % 5 = 0;
SET LOCAL max_parallel_workers_per_gather = 0;
SELECT count(*) AS rows, count(*) FILTER (WHERE g.tid IS NULL OR o.tid IS NULL) AS differ
FROM (SELECT (SELECT array_agg(id ORDER BY id) FROM rq WHERE id <= 400)[query] AS id, rank, tid, distance
      FROM gpu_ivfpq_knn_batch('rq_l2', (SELECT array_agg(v ORDER BY id) FROM rq WHERE id <= 400), 10)) g
FULL JOIN (SELECT rq.id, r.rank, r.tid, r.distance
           FROM rq, LATERAL gpu_ivfpq_knn_batch('rq_l2', rq.v, 10) r WHERE rq.id <= 400) o
USING (id, rank, tid, distance);
ROLLBACK;
-- The workers' buffer accesses count with the leader's (EXPLAIN (BUFFERS),
-- pg_stat_statements), as in PostgreSQL's own parallel plans: as many as
-- the leader makes alone (the groups fetch the same rows), but for a
-- group's first fetch, which may or may not find the page its
-- participant's last fetch pinned (at most one access per round of a
-- group either way; the workers' fetches are thousands).
CREATE FUNCTION batch_buffers() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
	p json;
BEGIN
	EXECUTE 'EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF, FORMAT JSON)
		SELECT count(*) FROM gpu_ivfpq_knn_batch(''rq_l2'', (SELECT array_agg(v ORDER BY id) FROM rq WHERE id <= 3000), 10)'
	INTO p;
	RETURN (p->0->'Plan'->>'Shared Hit Blocks')::bigint + (p->0->'Plan'->>'Shared Read Blocks')::bigint;
END $$;
BEGIN;
DELETE FROM rq WHERE id % 5 = 0;
SET LOCAL max_parallel_workers_per_gather = 0;
SELECT batch_buffers() AS serial_buffers \gset
SET LOCAL max_parallel_workers_per_gather = 2;
SELECT abs(batch_buffers() - :serial_buffers) <= 3000 AS parallel_buffers_counted;
ROLLBACK;
DROP FUNCTION batch_buffers();
-- An expression index re-ranks in the leader alone: its function (here
-- one that sets a setting) need not be safe in parallel workers.
CREATE FUNCTION emb(x real[]) RETURNS real[] IMMUTABLE LANGUAGE plpgsql AS
$$BEGIN PERFORM set_config('my.calls', '1', true); RETURN x; END$$;
CREATE INDEX rq_emb ON rq USING gpu_ivfpq (emb(v)) WITH (lists = 16, codes = rabitq);
BEGIN;
SET LOCAL max_parallel_workers_per_gather = 2;
SELECT count(*) > 0 AS expression_batch
FROM gpu_ivfpq_knn_batch('rq_emb', (SELECT array_agg(v ORDER BY id) FROM rq WHERE id <= 3000), 10);
ROLLBACK;
DROP INDEX rq_emb;
DROP FUNCTION emb(real[]);
-- An index's expression is its table owner's code: the batch functions run
-- it as the owner (as CREATE INDEX and ANALYZE do), never with the
-- caller's privileges. (A query that orders by the expression calls it
-- itself, as its caller.)
CREATE ROLE rq_owner;
CREATE TABLE rq_own (id int, v real[]);
INSERT INTO rq_own SELECT id, v FROM rq WHERE id <= 2000;
ALTER TABLE rq_own OWNER TO rq_owner;
CREATE FUNCTION owner_emb(x real[]) RETURNS real[] IMMUTABLE LANGUAGE plpgsql AS
$$BEGIN IF current_user <> 'rq_owner' THEN RAISE EXCEPTION 'ran as %', current_user; END IF; RETURN x; END$$;
CREATE INDEX rq_own_emb ON rq_own USING gpu_ivfpq (owner_emb(v)) WITH (lists = 4, codes = rabitq);
SELECT count(*) > 0 AS batch_as_owner
FROM gpu_ivfpq_knn_batch('rq_own_emb', (SELECT array_agg(v ORDER BY id) FROM rq WHERE id <= 20), 5);
SET client_min_messages = warning;
SELECT count(*) > 0 AS graph_as_owner FROM gpu_ivfpq_knn_graph('rq_own_emb', 10);
RESET client_min_messages;
DROP TABLE rq_own;
DROP FUNCTION owner_emb(real[]);
DROP ROLE rq_owner;
-- Cosine rows and queries of extreme norms keep their direction (their
-- squares overflow or underflow float: normalised after scaling by a power
-- of two), so a row 1e19 times the query is its nearest, and a query 1e-30
-- times another finds what that one finds.
CREATE TABLE rq_ext (id int, v real[]);
INSERT INTO rq_ext SELECT i, ARRAY[sin(i), cos(i), sin(i * 0.3), cos(i * 0.7)]::real[]
FROM generate_series(1, 300) i;
INSERT INTO rq_ext VALUES (0, '{1e19,2e19,-1e19,3e19}');
CREATE INDEX rq_ext_cos ON rq_ext USING gpu_ivfpq (v real_cosine_ops) WITH (lists = 4, codes = rabitq);
BEGIN;
SET LOCAL enable_seqscan = off;
SET LOCAL gpu_ivfpq.probes = 4;
SET LOCAL gpu_ivfpq.rerank = 400;
SELECT id AS huge_row_nearest FROM rq_ext ORDER BY v <=> '{1,2,-1,3}' LIMIT 1;
SELECT (SELECT array_agg(id) FROM (SELECT id FROM rq_ext ORDER BY v <=> '{0.3,0.9,-0.2,0.1}' LIMIT 5) a) =
       (SELECT array_agg(id) FROM (SELECT id FROM rq_ext ORDER BY v <=> '{3e-31,9e-31,-2e-31,1e-31}' LIMIT 5) b)
       AS tiny_query_same;
ROLLBACK;
DROP TABLE rq_ext;

-- Range search: every row within the radius (the 30th nearest distance of
-- each query), as a sequential scan finds them, for each operator class
-- (lists pruned by their covering radii, the others' rows checked in the table).
CREATE FUNCTION range_same(idx text, op text) RETURNS TABLE (qid int, rows bigint, same bool)
LANGUAGE plpgsql AS $$
BEGIN
	RETURN QUERY EXECUTE format($q$
	SELECT q.qid, (SELECT count(*) FROM gpu_ivfpq_range(%1$L, q.qv, r.r)),
	       (SELECT array_agg(rq.id ORDER BY rq.id) FROM gpu_ivfpq_range(%1$L, q.qv, r.r) g JOIN rq ON rq.ctid = g.tid) =
	       (SELECT array_agg(id ORDER BY id) FROM rq WHERE v %2$s q.qv <= r.r)
	FROM rqq q, LATERAL (SELECT v %2$s q.qv AS r FROM rq WHERE v IS NOT NULL ORDER BY 1 OFFSET 29 LIMIT 1) r
	ORDER BY 1$q$, idx, op);
END $$;
SELECT * FROM range_same('rq_l2', '<->');
SELECT * FROM range_same('rq_ip', '<#>');
SELECT * FROM range_same('rq_cos', '<=>');
DROP FUNCTION range_same(text, text);
-- RaBitQ codes stop at 2000 dimensions.
CREATE TABLE rq_wide (v real[]);
INSERT INTO rq_wide SELECT array_fill(1.0::real, ARRAY[2001]);
CREATE INDEX rq_wide_idx ON rq_wide USING gpu_ivfpq (v) WITH (codes = rabitq);
-- An index built on an empty table takes RaBitQ codes at its REINDEX.
CREATE TABLE rq_empty (id int, v real[]);
CREATE INDEX rq_empty_idx ON rq_empty USING gpu_ivfpq (v) WITH (lists = 4, codes = rabitq, bits = 5);
INSERT INTO rq_wide SELECT NULL;
INSERT INTO rq_empty SELECT id, v FROM rq WHERE id <= 400;
REINDEX INDEX rq_empty_idx;
SELECT gpu_ivfpq_check('rq_empty_idx', true) AS checked;
SET gpu_ivfpq.probes = 4;
SET enable_seqscan = off;
SELECT count(*) AS rows FROM (SELECT id FROM rq_empty ORDER BY v <-> (SELECT qv FROM rqq WHERE qid = 1) LIMIT 500) x;
RESET enable_seqscan;

-- Rows updated in place (HOT: the index holds the chain's root, the row has
-- moved on) come back from scans that re-rank from the table, with RaBitQ
-- codes and with PQ codes without vector copies alike.
CREATE TABLE rqh (id int, v real[], w int) WITH (fillfactor = 50);
INSERT INTO rqh SELECT i, ARRAY[i, i * 0.5, 1]::real[], 0 FROM generate_series(1, 200) i;
CREATE INDEX rqh_rq ON rqh USING gpu_ivfpq (v) WITH (lists = 2, codes = rabitq);
CREATE INDEX rqh_pq ON rqh USING gpu_ivfpq (v real_ip_ops) WITH (lists = 2, m = 1, store_vectors = off);
UPDATE rqh SET w = 1 WHERE id <= 5;
SELECT count(*) AS moved_in_place FROM rqh WHERE id <= 5 AND ctid > '(0,50)';
SET gpu_ivfpq.probes = 2;
SET gpu_ivfpq.rerank = 1000;
SELECT knn('SELECT id FROM rqh ORDER BY v <-> ''{1,1,1}'' LIMIT 200', true) =
       knn('SELECT id FROM rqh ORDER BY v <-> ''{1,1,1}'' LIMIT 200', false) AS rabitq_same,
       knn('SELECT id FROM rqh ORDER BY v <#> ''{-1,-1,-1}'' LIMIT 200', true) =
       knn('SELECT id FROM rqh ORDER BY v <#> ''{-1,-1,-1}'' LIMIT 200', false) AS pq_same;
-- The functions return the rows' own TIDs (their ctid).
SELECT count(*) AS joined FROM gpu_ivfpq_knn_batch('rqh_rq', '{1,1,1}'::real[], 200) r JOIN rqh ON rqh.ctid = r.tid;
DROP TABLE rqh;

DROP TABLE rq, rqp, rqq, rq_wide, rq_empty;
DROP FUNCTION same_as_seq(text, int, text, text);
DROP FUNCTION recall(text, int);
DROP FUNCTION knn(text, bool);
