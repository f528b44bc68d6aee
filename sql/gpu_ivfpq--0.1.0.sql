-- gpu_ivfpq 0.1.0: distance operators on real[] and the gpu_ivfpq index access method.

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

-- The GPU service's state and what scans it counted (a service exists only
-- when gpu_ivfpq is in shared_preload_libraries).
CREATE FUNCTION gpu_ivfpq_status(
	OUT state text, OUT service_pid int4, OUT device text, OUT service_starts int4,
	OUT started_at timestamptz, OUT queries_gpu int8, OUT queries_cpu int8, OUT last_error text)
	RETURNS record AS 'MODULE_PATHNAME' LANGUAGE C VOLATILE;
CREATE VIEW gpu_ivfpq_status AS SELECT * FROM gpu_ivfpq_status();
