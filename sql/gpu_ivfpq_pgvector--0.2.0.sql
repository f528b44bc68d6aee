-- gpu_ivfpq_pgvector 0.2.0: gpu_ivfpq indexes on pgvector's vector and halfvec
-- columns, ordered by pgvector's own operators, and the search functions
-- with vector and halfvec queries. Requires gpu_ivfpq and vector (pgvector).
--
-- The index reads each value in pgvector's documented binary layout and
-- keeps it as float4 (a halfvec's elements converted exactly), like a real[]
-- column's: the CPU engine and the GPU service see the same vectors.

\echo Use "CREATE EXTENSION gpu_ivfpq_pgvector" to load this file. \quit

-- halfvec came with pgvector 0.7.0: an older vector extension gets a clear
-- error here, not "type halfvec does not exist" halfway through.
DO $$
DECLARE
	v text := (SELECT extversion FROM pg_extension WHERE extname = 'vector');
BEGIN
	IF v ~ '^[0-9]+\.[0-9]+' AND
	   (regexp_match(v, '^([0-9]+)\.([0-9]+)'))::int[] < ARRAY[0, 7] THEN
		RAISE EXCEPTION 'gpu_ivfpq_pgvector needs pgvector 0.7.0 or later, the vector extension is %', v
			USING ERRCODE = 'feature_not_supported',
				  HINT = 'Update pgvector and run ALTER EXTENSION vector UPDATE.';
	END IF;
END
$$;

-- Operator classes. Their names are pgvector's own: operator classes are
-- named per access method, so "USING gpu_ivfpq (embedding vector_l2_ops)"
-- reads like pgvector's "USING hnsw (embedding vector_l2_ops)". Operator 1
-- is pgvector's (<-> Euclidean, <#> negative inner product, <=> cosine
-- distance), so unchanged queries use the index; support function 1 is the
-- operator's function, support function 2 tells the index which distance
-- it ranks by.
CREATE OPERATOR CLASS vector_l2_ops
	DEFAULT FOR TYPE vector USING gpu_ivfpq AS
	OPERATOR 1 <-> (vector, vector) FOR ORDER BY float_ops,
	FUNCTION 1 l2_distance(vector, vector),
	FUNCTION 2 (vector, vector) gpu_ivfpq_metric_l2(internal);

CREATE OPERATOR CLASS vector_ip_ops
	FOR TYPE vector USING gpu_ivfpq AS
	OPERATOR 1 <#> (vector, vector) FOR ORDER BY float_ops,
	FUNCTION 1 vector_negative_inner_product(vector, vector),
	FUNCTION 2 (vector, vector) gpu_ivfpq_metric_ip(internal);

CREATE OPERATOR CLASS vector_cosine_ops
	FOR TYPE vector USING gpu_ivfpq AS
	OPERATOR 1 <=> (vector, vector) FOR ORDER BY float_ops,
	FUNCTION 1 cosine_distance(vector, vector),
	FUNCTION 2 (vector, vector) gpu_ivfpq_metric_cosine(internal);

CREATE OPERATOR CLASS halfvec_l2_ops
	DEFAULT FOR TYPE halfvec USING gpu_ivfpq AS
	OPERATOR 1 <-> (halfvec, halfvec) FOR ORDER BY float_ops,
	FUNCTION 1 l2_distance(halfvec, halfvec),
	FUNCTION 2 (halfvec, halfvec) gpu_ivfpq_metric_l2(internal);

CREATE OPERATOR CLASS halfvec_ip_ops
	FOR TYPE halfvec USING gpu_ivfpq AS
	OPERATOR 1 <#> (halfvec, halfvec) FOR ORDER BY float_ops,
	FUNCTION 1 halfvec_negative_inner_product(halfvec, halfvec),
	FUNCTION 2 (halfvec, halfvec) gpu_ivfpq_metric_ip(internal);

CREATE OPERATOR CLASS halfvec_cosine_ops
	FOR TYPE halfvec USING gpu_ivfpq AS
	OPERATOR 1 <=> (halfvec, halfvec) FOR ORDER BY float_ops,
	FUNCTION 1 cosine_distance(halfvec, halfvec),
	FUNCTION 2 (halfvec, halfvec) gpu_ivfpq_metric_cosine(internal);

-- The search functions with vector and halfvec queries: one query, or an
-- array of them (array_agg(embedding ORDER BY ...)). The same C functions
-- as gpu_ivfpq's real[] signatures, which read the query argument by its
-- declared type; the indexed or searched column may be of any vector type.
-- With these overloads, a query written as an untyped literal needs a cast
-- ('[1,2,3]'::vector, '{1,2,3}'::real[]).
CREATE FUNCTION gpu_ivfpq_knn_batch(index regclass, queries vector[], k int)
	RETURNS TABLE (query int, rank int, tid tid, distance float8)
	AS 'MODULE_PATHNAME', 'gpu_ivfpq_knn_batch' LANGUAGE C STRICT VOLATILE;
CREATE FUNCTION gpu_ivfpq_knn_batch(index regclass, queries vector, k int)
	RETURNS TABLE (query int, rank int, tid tid, distance float8)
	AS 'MODULE_PATHNAME', 'gpu_ivfpq_knn_batch' LANGUAGE C STRICT VOLATILE;
CREATE FUNCTION gpu_ivfpq_knn_batch(index regclass, queries halfvec[], k int)
	RETURNS TABLE (query int, rank int, tid tid, distance float8)
	AS 'MODULE_PATHNAME', 'gpu_ivfpq_knn_batch' LANGUAGE C STRICT VOLATILE;
CREATE FUNCTION gpu_ivfpq_knn_batch(index regclass, queries halfvec, k int)
	RETURNS TABLE (query int, rank int, tid tid, distance float8)
	AS 'MODULE_PATHNAME', 'gpu_ivfpq_knn_batch' LANGUAGE C STRICT VOLATILE;

CREATE FUNCTION gpu_ivfpq_exact_knn(tbl regclass, col name, queries vector[], k int, metric text DEFAULT 'l2')
	RETURNS TABLE (query int, rank int, tid tid, distance float8)
	AS 'MODULE_PATHNAME', 'gpu_ivfpq_exact_knn' LANGUAGE C STRICT VOLATILE;
CREATE FUNCTION gpu_ivfpq_exact_knn(tbl regclass, col name, queries vector, k int, metric text DEFAULT 'l2')
	RETURNS TABLE (query int, rank int, tid tid, distance float8)
	AS 'MODULE_PATHNAME', 'gpu_ivfpq_exact_knn' LANGUAGE C STRICT VOLATILE;
CREATE FUNCTION gpu_ivfpq_exact_knn(tbl regclass, col name, queries halfvec[], k int, metric text DEFAULT 'l2')
	RETURNS TABLE (query int, rank int, tid tid, distance float8)
	AS 'MODULE_PATHNAME', 'gpu_ivfpq_exact_knn' LANGUAGE C STRICT VOLATILE;
CREATE FUNCTION gpu_ivfpq_exact_knn(tbl regclass, col name, queries halfvec, k int, metric text DEFAULT 'l2')
	RETURNS TABLE (query int, rank int, tid tid, distance float8)
	AS 'MODULE_PATHNAME', 'gpu_ivfpq_exact_knn' LANGUAGE C STRICT VOLATILE;

CREATE FUNCTION gpu_ivfpq_range(index regclass, query vector, radius float8, max_rows int DEFAULT 0)
	RETURNS TABLE (tid tid, distance float8)
	AS 'MODULE_PATHNAME', 'gpu_ivfpq_range' LANGUAGE C STRICT VOLATILE;
CREATE FUNCTION gpu_ivfpq_range(index regclass, query halfvec, radius float8, max_rows int DEFAULT 0)
	RETURNS TABLE (tid tid, distance float8)
	AS 'MODULE_PATHNAME', 'gpu_ivfpq_range' LANGUAGE C STRICT VOLATILE;

-- What each object is.
COMMENT ON OPERATOR FAMILY vector_l2_ops USING gpu_ivfpq IS 'pgvector vector columns by Euclidean distance (<->)';
COMMENT ON OPERATOR CLASS vector_l2_ops USING gpu_ivfpq IS 'pgvector vector columns by Euclidean distance (<->)';
COMMENT ON OPERATOR FAMILY vector_ip_ops USING gpu_ivfpq IS 'pgvector vector columns by negative inner product (<#>)';
COMMENT ON OPERATOR CLASS vector_ip_ops USING gpu_ivfpq IS 'pgvector vector columns by negative inner product (<#>)';
COMMENT ON OPERATOR FAMILY vector_cosine_ops USING gpu_ivfpq IS 'pgvector vector columns by cosine distance (<=>)';
COMMENT ON OPERATOR CLASS vector_cosine_ops USING gpu_ivfpq IS 'pgvector vector columns by cosine distance (<=>)';
COMMENT ON OPERATOR FAMILY halfvec_l2_ops USING gpu_ivfpq IS 'pgvector halfvec columns by Euclidean distance (<->)';
COMMENT ON OPERATOR CLASS halfvec_l2_ops USING gpu_ivfpq IS 'pgvector halfvec columns by Euclidean distance (<->)';
COMMENT ON OPERATOR FAMILY halfvec_ip_ops USING gpu_ivfpq IS 'pgvector halfvec columns by negative inner product (<#>)';
COMMENT ON OPERATOR CLASS halfvec_ip_ops USING gpu_ivfpq IS 'pgvector halfvec columns by negative inner product (<#>)';
COMMENT ON OPERATOR FAMILY halfvec_cosine_ops USING gpu_ivfpq IS 'pgvector halfvec columns by cosine distance (<=>)';
COMMENT ON OPERATOR CLASS halfvec_cosine_ops USING gpu_ivfpq IS 'pgvector halfvec columns by cosine distance (<=>)';
COMMENT ON FUNCTION gpu_ivfpq_knn_batch(regclass, vector[], int) IS 'the k nearest rows of each vector query';
COMMENT ON FUNCTION gpu_ivfpq_knn_batch(regclass, vector, int) IS 'the k nearest rows of a vector query';
COMMENT ON FUNCTION gpu_ivfpq_knn_batch(regclass, halfvec[], int) IS 'the k nearest rows of each halfvec query';
COMMENT ON FUNCTION gpu_ivfpq_knn_batch(regclass, halfvec, int) IS 'the k nearest rows of a halfvec query';
COMMENT ON FUNCTION gpu_ivfpq_exact_knn(regclass, name, vector[], int, text) IS
	'exact brute-force k nearest rows of each vector query over a vector column, no index needed';
COMMENT ON FUNCTION gpu_ivfpq_exact_knn(regclass, name, vector, int, text) IS
	'exact brute-force k nearest rows of a vector query over a vector column, no index needed';
COMMENT ON FUNCTION gpu_ivfpq_exact_knn(regclass, name, halfvec[], int, text) IS
	'exact brute-force k nearest rows of each halfvec query over a vector column, no index needed';
COMMENT ON FUNCTION gpu_ivfpq_exact_knn(regclass, name, halfvec, int, text) IS
	'exact brute-force k nearest rows of a halfvec query over a vector column, no index needed';
COMMENT ON FUNCTION gpu_ivfpq_range(regclass, vector, float8, int) IS
	'exact range search: every row within radius of a vector query, nearest first';
COMMENT ON FUNCTION gpu_ivfpq_range(regclass, halfvec, float8, int) IS
	'exact range search: every row within radius of a halfvec query, nearest first';
