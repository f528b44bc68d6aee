-- gpu_ivfpq 0.4.0: distance operators on real[] and the gpu_ivfpq index access method;
-- edit distance on text and the gpu_metric index access method (fuzzy string search).
-- pgvector's vector and halfvec columns: the companion extension gpu_ivfpq_pgvector.

\echo Use "CREATE EXTENSION gpu_ivfpq" to load this file. \quit

-- Distance functions. STRICT: a NULL vector has no distance.
CREATE FUNCTION gpu_ivfpq_l2_distance(real[], real[]) RETURNS float8
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION gpu_ivfpq_negative_inner_product(real[], real[]) RETURNS float8
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION gpu_ivfpq_cosine_distance(real[], real[]) RETURNS float8
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE OPERATOR <-> (
	LEFTARG = real[], RIGHTARG = real[], PROCEDURE = gpu_ivfpq_l2_distance,
	COMMUTATOR = '<->'
);
CREATE OPERATOR <#> (
	LEFTARG = real[], RIGHTARG = real[], PROCEDURE = gpu_ivfpq_negative_inner_product,
	COMMUTATOR = '<#>'
);
CREATE OPERATOR <=> (
	LEFTARG = real[], RIGHTARG = real[], PROCEDURE = gpu_ivfpq_cosine_distance,
	COMMUTATOR = '<=>'
);

-- The access method.
CREATE FUNCTION gpu_ivfpq_handler(internal) RETURNS index_am_handler
	AS 'MODULE_PATHNAME' LANGUAGE C;
CREATE ACCESS METHOD gpu_ivfpq TYPE INDEX HANDLER gpu_ivfpq_handler;
COMMENT ON ACCESS METHOD gpu_ivfpq IS 'IVFPQ approximate nearest-neighbour index';

-- Support function 2 of each operator class says which metric it indexes.
CREATE FUNCTION gpu_ivfpq_metric_l2(internal) RETURNS int4
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION gpu_ivfpq_metric_ip(internal) RETURNS int4
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION gpu_ivfpq_metric_cosine(internal) RETURNS int4
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;

CREATE OPERATOR CLASS real_l2_ops
	DEFAULT FOR TYPE real[] USING gpu_ivfpq AS
	OPERATOR 1 <-> (real[], real[]) FOR ORDER BY float_ops,
	FUNCTION 1 gpu_ivfpq_l2_distance(real[], real[]),
	FUNCTION 2 (real[], real[]) gpu_ivfpq_metric_l2(internal);

CREATE OPERATOR CLASS real_ip_ops
	FOR TYPE real[] USING gpu_ivfpq AS
	OPERATOR 1 <#> (real[], real[]) FOR ORDER BY float_ops,
	FUNCTION 1 gpu_ivfpq_negative_inner_product(real[], real[]),
	FUNCTION 2 (real[], real[]) gpu_ivfpq_metric_ip(internal);

CREATE OPERATOR CLASS real_cosine_ops
	FOR TYPE real[] USING gpu_ivfpq AS
	OPERATOR 1 <=> (real[], real[]) FOR ORDER BY float_ops,
	FUNCTION 1 gpu_ivfpq_cosine_distance(real[], real[]),
	FUNCTION 2 (real[], real[]) gpu_ivfpq_metric_cosine(internal);


-- Filter columns: an index may have a second column of an integer type
-- (CREATE INDEX ... USING gpu_ivfpq (embedding, tenant_id)). Its entries
-- keep the column's value, and a scan applies WHERE tenant_id <op> constant
-- (=, <, <=, >, >=, across smallint, integer and bigint) before ranking, on
-- the GPU or in the CPU engine. Strategy numbers are B-tree's.
CREATE OPERATOR FAMILY integer_filter_ops USING gpu_ivfpq;

CREATE OPERATOR CLASS int2_filter_ops
	DEFAULT FOR TYPE int2 USING gpu_ivfpq FAMILY integer_filter_ops AS
	OPERATOR 1 < (int2, int2),
	OPERATOR 2 <= (int2, int2),
	OPERATOR 3 = (int2, int2),
	OPERATOR 4 >= (int2, int2),
	OPERATOR 5 > (int2, int2);

CREATE OPERATOR CLASS int4_filter_ops
	DEFAULT FOR TYPE int4 USING gpu_ivfpq FAMILY integer_filter_ops AS
	OPERATOR 1 < (int4, int4),
	OPERATOR 2 <= (int4, int4),
	OPERATOR 3 = (int4, int4),
	OPERATOR 4 >= (int4, int4),
	OPERATOR 5 > (int4, int4);

CREATE OPERATOR CLASS int8_filter_ops
	DEFAULT FOR TYPE int8 USING gpu_ivfpq FAMILY integer_filter_ops AS
	OPERATOR 1 < (int8, int8),
	OPERATOR 2 <= (int8, int8),
	OPERATOR 3 = (int8, int8),
	OPERATOR 4 >= (int8, int8),
	OPERATOR 5 > (int8, int8);

ALTER OPERATOR FAMILY integer_filter_ops USING gpu_ivfpq ADD
	OPERATOR 1 < (int2, int4),
	OPERATOR 2 <= (int2, int4),
	OPERATOR 3 = (int2, int4),
	OPERATOR 4 >= (int2, int4),
	OPERATOR 5 > (int2, int4),
	OPERATOR 1 < (int2, int8),
	OPERATOR 2 <= (int2, int8),
	OPERATOR 3 = (int2, int8),
	OPERATOR 4 >= (int2, int8),
	OPERATOR 5 > (int2, int8),
	OPERATOR 1 < (int4, int2),
	OPERATOR 2 <= (int4, int2),
	OPERATOR 3 = (int4, int2),
	OPERATOR 4 >= (int4, int2),
	OPERATOR 5 > (int4, int2),
	OPERATOR 1 < (int4, int8),
	OPERATOR 2 <= (int4, int8),
	OPERATOR 3 = (int4, int8),
	OPERATOR 4 >= (int4, int8),
	OPERATOR 5 > (int4, int8),
	OPERATOR 1 < (int8, int2),
	OPERATOR 2 <= (int8, int2),
	OPERATOR 3 = (int8, int2),
	OPERATOR 4 >= (int8, int2),
	OPERATOR 5 > (int8, int2),
	OPERATOR 1 < (int8, int4),
	OPERATOR 2 <= (int8, int4),
	OPERATOR 3 = (int8, int4),
	OPERATOR 4 >= (int8, int4),
	OPERATOR 5 > (int8, int4);

-- The GPU service's state and what scans it counted (a service exists only
-- when gpu_ivfpq is in shared_preload_libraries).
CREATE FUNCTION gpu_ivfpq_status(
	OUT state text, OUT service_pid int4, OUT device text, OUT service_starts int4,
	OUT started_at timestamptz, OUT queries_gpu int8, OUT queries_cpu int8,
	OUT gpu_fallbacks int8, OUT batches int8, OUT mean_batch float8, OUT batch_histogram int8[],
	OUT mirrors int4, OUT memory_used_mb float8, OUT memory_budget_mb float8, OUT last_error text,
	OUT gpu_process_pid int4, OUT gpu_restarts int4, OUT last_gpu_exit text,
	OUT last_gpu_exit_at timestamptz, OUT queued_searches int8, OUT mean_queue_wait_us float8,
	OUT mean_log_wait_us float8, OUT mean_gpu_us float8, OUT mean_deliver_us float8,
	OUT append_calls int8, OUT mean_append_us float8, OUT mean_append_device_us float8)
	RETURNS record AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
CREATE VIEW gpu_ivfpq_status AS SELECT * FROM gpu_ivfpq_status();

-- Indexes mirrored in GPU memory (all databases; index names resolve in the current one).
CREATE FUNCTION gpu_ivfpq_mirrors(
	OUT datid oid, OUT indexrelid oid, OUT relfilenode oid, OUT build_id int8,
	OUT entries int8, OUT size_mb float8, OUT queries int8, OUT vectors bool, OUT filter_keys bool,
	OUT placement text, OUT devices int4[], OUT kind text)
	RETURNS SETOF record AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
CREATE VIEW gpu_ivfpq_mirrors AS
	SELECT m.datid, d.datname, m.indexrelid,
		   CASE WHEN m.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
				THEN m.indexrelid::regclass::text END AS index,
		   m.relfilenode, m.build_id, m.entries, m.size_mb, m.queries, m.vectors, m.filter_keys,
		   m.placement, m.devices, m.kind
	FROM gpu_ivfpq_mirrors() m LEFT JOIN pg_database d ON d.oid = m.datid;

-- The GPUs of the GPU process: memory, work and health of each.
CREATE FUNCTION gpu_ivfpq_devices(
	OUT device int4, OUT description text, OUT alive bool, OUT memory_budget_mb float8,
	OUT memory_used_mb float8, OUT mirrors int4, OUT queries int8, OUT batches int8, OUT busy_ms float8)
	RETURNS SETOF record AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
CREATE VIEW gpu_ivfpq_devices AS SELECT * FROM gpu_ivfpq_devices();

-- Monitoring roles read the service's state: pg_monitor (through
-- pg_read_all_stats) sees every database; a role granted EXECUTE/SELECT
-- explicitly sees its own database's mirrors and no error texts.
REVOKE ALL ON FUNCTION gpu_ivfpq_status(), gpu_ivfpq_mirrors(), gpu_ivfpq_devices() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gpu_ivfpq_status(), gpu_ivfpq_mirrors(), gpu_ivfpq_devices() TO pg_monitor;
GRANT SELECT ON gpu_ivfpq_status, gpu_ivfpq_mirrors, gpu_ivfpq_devices TO pg_monitor;

-- The functions below read tables outside the executor: each checks the
-- caller's SELECT privilege on the table (or its vector column) and refuses
-- tables whose row-level security applies to the caller.

-- Loads an index into GPU memory now instead of on its first scan (needs
-- SELECT on its table, as pg_prewarm does).
CREATE FUNCTION gpu_ivfpq_prewarm(index regclass) RETURNS int8
	AS 'MODULE_PATHNAME' LANGUAGE C STRICT VOLATILE;

-- Verifies the index the way contrib/amcheck verifies a B-tree: the
-- metapage, the quantizer and list directory pages, every list chain and
-- entry; with heapallindexed, also that each row of the table visible to a
-- new snapshot, with a non-NULL value, is in the index exactly once. Errors
-- (SQLSTATE XX002, index_corrupted) at the first problem, naming the block;
-- returns nothing when the index is sound. Needs SELECT on the table; takes
-- only ACCESS SHARE locks.
CREATE FUNCTION gpu_ivfpq_check(index regclass, heapallindexed boolean DEFAULT false) RETURNS void
	AS 'MODULE_PATHNAME' LANGUAGE C STRICT VOLATILE;
COMMENT ON FUNCTION gpu_ivfpq_check(regclass, boolean) IS
	'checks a gpu_ivfpq index for corruption (heapallindexed: and that it holds every visible row)';

-- Exact range search: every row of the index's table within radius of query
-- (the operator class's distance), nearest first; max_rows > 0 keeps the
-- nearest max_rows. Lists are pruned by their covering radius. Join back
-- with: JOIN gpu_ivfpq_range(...) r ON t.ctid = r.tid
CREATE FUNCTION gpu_ivfpq_range(index regclass, query real[], radius float8, max_rows int DEFAULT 0)
	RETURNS TABLE (tid tid, distance float8)
	AS 'MODULE_PATHNAME' LANGUAGE C STRICT VOLATILE;

-- Batch k-NN: the k nearest visible rows of each query (a real[][] matrix, one
-- query per row, or one real[] vector), re-ranked exactly like an index scan
-- (gpu_ivfpq.probes lists, max(k, gpu_ivfpq.rerank) candidates per query).
-- query numbers rows of the matrix from 1. Join back with ON t.ctid = r.tid.
CREATE FUNCTION gpu_ivfpq_knn_batch(index regclass, queries real[], k int)
	RETURNS TABLE (query int, rank int, tid tid, distance float8)
	AS 'MODULE_PATHNAME' LANGUAGE C STRICT VOLATILE;

-- The k-nearest-neighbour graph of the index's table: for every row (src),
-- its k nearest other rows (dst), rank from 1, with exact distances. Store
-- it with CREATE TABLE g AS SELECT * FROM gpu_ivfpq_knn_graph('idx', 10);
-- progress is reported as NOTICEs; a cancel stops it cleanly.
CREATE FUNCTION gpu_ivfpq_knn_graph(index regclass, k int)
	RETURNS TABLE (src tid, rank int, dst tid, distance float8)
	AS 'MODULE_PATHNAME' LANGUAGE C STRICT VOLATILE;

-- Exact brute-force k-NN over a vector column (real[], or pgvector's vector
-- or halfvec), no index needed: the GPU's fused GEMM + k-selection through
-- the service when it runs on a GPU, the CPU engine otherwise. metric: 'l2'
-- (<->), 'ip' (<#>) or 'cosine' (<=>).
CREATE FUNCTION gpu_ivfpq_exact_knn(tbl regclass, col name, queries real[], k int, metric text DEFAULT 'l2')
	RETURNS TABLE (query int, rank int, tid tid, distance float8)
	AS 'MODULE_PATHNAME' LANGUAGE C STRICT VOLATILE;

-- What each object is (shown by \dx+, \df+, \do+, \dAc+); an update from
-- 0.1.0 adds the same (gpu_ivfpq--0.1.0--0.2.0.sql).
COMMENT ON FUNCTION gpu_ivfpq_l2_distance(real[], real[]) IS
	'Euclidean distance between two real[] vectors (operator <->)';
COMMENT ON FUNCTION gpu_ivfpq_negative_inner_product(real[], real[]) IS
	'negative inner product of two real[] vectors (operator <#>): smaller is more similar';
COMMENT ON FUNCTION gpu_ivfpq_cosine_distance(real[], real[]) IS
	'cosine distance 1 - cos(a, b) of two real[] vectors, NaN when either is zero (operator <=>)';
COMMENT ON OPERATOR <-> (real[], real[]) IS 'Euclidean distance';
COMMENT ON OPERATOR <#> (real[], real[]) IS 'negative inner product';
COMMENT ON OPERATOR <=> (real[], real[]) IS 'cosine distance';
COMMENT ON FUNCTION gpu_ivfpq_handler(internal) IS 'handler of the gpu_ivfpq index access method';
COMMENT ON FUNCTION gpu_ivfpq_metric_l2(internal) IS
	'operator class support: the index ranks by Euclidean distance';
COMMENT ON FUNCTION gpu_ivfpq_metric_ip(internal) IS
	'operator class support: the index ranks by negative inner product';
COMMENT ON FUNCTION gpu_ivfpq_metric_cosine(internal) IS
	'operator class support: the index ranks by cosine distance';
COMMENT ON OPERATOR FAMILY real_l2_ops USING gpu_ivfpq IS 'real[] vectors by Euclidean distance (<->)';
COMMENT ON OPERATOR CLASS real_l2_ops USING gpu_ivfpq IS 'real[] vectors by Euclidean distance (<->)';
COMMENT ON OPERATOR FAMILY real_ip_ops USING gpu_ivfpq IS 'real[] vectors by negative inner product (<#>)';
COMMENT ON OPERATOR CLASS real_ip_ops USING gpu_ivfpq IS 'real[] vectors by negative inner product (<#>)';
COMMENT ON OPERATOR FAMILY real_cosine_ops USING gpu_ivfpq IS 'real[] vectors by cosine distance (<=>)';
COMMENT ON OPERATOR CLASS real_cosine_ops USING gpu_ivfpq IS 'real[] vectors by cosine distance (<=>)';
COMMENT ON OPERATOR FAMILY integer_filter_ops USING gpu_ivfpq IS
	'filter columns: comparisons of smallint, integer and bigint applied before ranking';
COMMENT ON OPERATOR CLASS int2_filter_ops USING gpu_ivfpq IS 'smallint filter column';
COMMENT ON OPERATOR CLASS int4_filter_ops USING gpu_ivfpq IS 'integer filter column';
COMMENT ON OPERATOR CLASS int8_filter_ops USING gpu_ivfpq IS 'bigint filter column';
COMMENT ON FUNCTION gpu_ivfpq_status() IS 'the GPU service''s state and counters (the view gpu_ivfpq_status)';
COMMENT ON VIEW gpu_ivfpq_status IS 'the GPU service''s state and counters';
COMMENT ON FUNCTION gpu_ivfpq_mirrors() IS 'indexes mirrored in GPU memory (the view gpu_ivfpq_mirrors)';
COMMENT ON VIEW gpu_ivfpq_mirrors IS 'indexes mirrored in GPU memory, in every database';
COMMENT ON FUNCTION gpu_ivfpq_devices() IS 'the GPUs the service uses (the view gpu_ivfpq_devices)';
COMMENT ON VIEW gpu_ivfpq_devices IS 'the GPUs the service uses: memory, work and health of each';
COMMENT ON FUNCTION gpu_ivfpq_prewarm(regclass) IS
	'loads a gpu_ivfpq index into GPU memory now instead of at its first scan; returns its entries';
COMMENT ON FUNCTION gpu_ivfpq_range(regclass, real[], float8, int) IS
	'exact range search: every row within radius of the query, nearest first';
COMMENT ON FUNCTION gpu_ivfpq_knn_batch(regclass, real[], int) IS
	'the k nearest rows of each query of a real[][] matrix (or of one real[] vector)';
COMMENT ON FUNCTION gpu_ivfpq_knn_graph(regclass, int) IS
	'the k nearest other rows of every row of the index''s table';
COMMENT ON FUNCTION gpu_ivfpq_exact_knn(regclass, name, real[], int, text) IS
	'exact brute-force k nearest rows of each query over a vector column, no index needed';

-- Fuzzy string search: the edit distance between texts, and gpu_metric,
-- an index access method for exact range and k-NN search under it (the
-- engine's List of Clusters or Sparse Spatial Selection). The distance is
-- Levenshtein's, on Unicode code points: 'cañón' <~> 'canon' is 2.
CREATE FUNCTION gpu_metric_edit_distance(text, text) RETURNS int4
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE COST 10;
CREATE OPERATOR <~> (
	LEFTARG = text, RIGHTARG = text, FUNCTION = gpu_metric_edit_distance,
	COMMUTATOR = '<~>'
);

-- A range of words: those within radius edits of word (word <% edit_range('cassa', 2)).
CREATE TYPE edit_range AS (word text, radius int4);
CREATE FUNCTION edit_range(word text, radius int4) RETURNS edit_range
	AS 'MODULE_PATHNAME', 'gpu_metric_edit_range' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE;
CREATE FUNCTION gpu_metric_within(text, edit_range) RETURNS bool
	AS 'MODULE_PATHNAME' LANGUAGE C IMMUTABLE STRICT PARALLEL SAFE COST 10;
-- matchingsel applies the operator to the column's statistics, as pg_trgm's % does.
CREATE OPERATOR <% (
	LEFTARG = text, RIGHTARG = edit_range, FUNCTION = gpu_metric_within,
	RESTRICT = matchingsel, JOIN = matchingjoinsel
);

CREATE FUNCTION gpu_metric_handler(internal) RETURNS index_am_handler
	AS 'MODULE_PATHNAME' LANGUAGE C;
CREATE ACCESS METHOD gpu_metric TYPE INDEX HANDLER gpu_metric_handler;

-- Strategy 1: the range predicate; strategy 2: ORDER BY the distance.
CREATE OPERATOR CLASS text_edit_ops
	DEFAULT FOR TYPE text USING gpu_metric AS
	OPERATOR 1 <% (text, edit_range),
	OPERATOR 2 <~> (text, text) FOR ORDER BY integer_ops;

-- Many queries in one call, searched in parallel: the rows of the index's
-- table (visible to the caller, by distance then heap TID) within radius of
-- each query, or its k nearest. query numbers the array's elements from 1;
-- word is the indexed value. They read the table outside the executor: they
-- check SELECT on it and refuse tables whose row-level security applies.
CREATE FUNCTION gpu_metric_range_batch(index regclass, queries text[], radius int)
	RETURNS TABLE (query int, tid tid, word text, distance int)
	AS 'MODULE_PATHNAME' LANGUAGE C STRICT VOLATILE;
CREATE FUNCTION gpu_metric_knn_batch(index regclass, queries text[], k int)
	RETURNS TABLE (query int, rank int, tid tid, word text, distance int)
	AS 'MODULE_PATHNAME' LANGUAGE C STRICT VOLATILE;

-- Loads a gpu_metric index into the GPU service's memory now instead of on
-- its first search (needs SELECT on its table, as pg_prewarm does).
CREATE FUNCTION gpu_metric_prewarm(index regclass) RETURNS int8
	AS 'MODULE_PATHNAME' LANGUAGE C STRICT VOLATILE;

COMMENT ON FUNCTION gpu_metric_edit_distance(text, text) IS
	'Levenshtein distance between two texts, counted on Unicode code points (operator <~>)';
COMMENT ON OPERATOR <~> (text, text) IS 'edit distance (Levenshtein, on code points)';
COMMENT ON TYPE edit_range IS 'the words within radius edits of word (operator <%)';
COMMENT ON FUNCTION edit_range(text, int4) IS 'the range of the words within radius edits of word';
COMMENT ON FUNCTION gpu_metric_within(text, edit_range) IS
	'whether a text is within the range''s radius of its word (operator <%)';
COMMENT ON OPERATOR <% (text, edit_range) IS 'within an edit distance range';
COMMENT ON FUNCTION gpu_metric_handler(internal) IS 'handler of the gpu_metric index access method';
COMMENT ON ACCESS METHOD gpu_metric IS
	'exact range and nearest-neighbour search of text under edit distance (List of Clusters, SSS)';
COMMENT ON OPERATOR FAMILY text_edit_ops USING gpu_metric IS
	'text by edit distance: ranges (<%) and ORDER BY <~>';
COMMENT ON OPERATOR CLASS text_edit_ops USING gpu_metric IS
	'text by edit distance: ranges (<%) and ORDER BY <~>';
COMMENT ON FUNCTION gpu_metric_range_batch(regclass, text[], int) IS
	'the rows within radius edits of each query, by distance';
COMMENT ON FUNCTION gpu_metric_knn_batch(regclass, text[], int) IS
	'the k rows nearest each query by edit distance';
COMMENT ON FUNCTION gpu_metric_prewarm(regclass) IS
	'loads a gpu_metric index into GPU memory now instead of at its first search; returns its live words';
