-- gpu_ivfpq 0.1.0 -> 0.2.0: every object gets a description; the objects
-- themselves are unchanged. A fresh 0.2.0 install has the same
-- (gpu_ivfpq--0.2.0.sql).

\echo Use "ALTER EXTENSION gpu_ivfpq UPDATE TO '0.2.0'" to load this file. \quit

-- gpu_ivfpq_check had its description in 0.1.0 already.
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
