-- gpu_ivfpq 0.2.0 -> 0.3.0: the mirrors view shows each mirror's placement
-- over the GPUs, and a view lists the GPUs; fuzzy string search (the edit
-- distance operators and the gpu_metric index access method).
\echo Use "ALTER EXTENSION gpu_ivfpq UPDATE TO '0.3.0'" to load this file. \quit

DROP VIEW gpu_ivfpq_mirrors;
DROP FUNCTION gpu_ivfpq_mirrors();
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

REVOKE ALL ON FUNCTION gpu_ivfpq_mirrors(), gpu_ivfpq_devices() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION gpu_ivfpq_mirrors(), gpu_ivfpq_devices() TO pg_monitor;
GRANT SELECT ON gpu_ivfpq_mirrors, gpu_ivfpq_devices TO pg_monitor;

COMMENT ON FUNCTION gpu_ivfpq_mirrors() IS 'indexes mirrored in GPU memory (the view gpu_ivfpq_mirrors)';
COMMENT ON VIEW gpu_ivfpq_mirrors IS 'indexes mirrored in GPU memory, in every database';
COMMENT ON FUNCTION gpu_ivfpq_devices() IS 'the GPUs the service uses (the view gpu_ivfpq_devices)';
COMMENT ON VIEW gpu_ivfpq_devices IS 'the GPUs the service uses: memory, work and health of each';

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
