-- The distance operators on real[]: <-> (L2), <#> (negative inner product),
-- <=> (cosine distance), their input checks, and NULL handling.
-- (Each test file can run alone: the extension is created if missing.)
SET client_min_messages = warning;
CREATE EXTENSION IF NOT EXISTS gpu_ivfpq;
RESET client_min_messages;

-- Known values (small integers, so every result is exact in float8).
SELECT '{1,2,3}'::real[] <-> '{4,6,3}'::real[] AS l2_5;
SELECT '{0,0}'::real[] <-> '{0,0}'::real[] AS l2_0;
SELECT '{1,1,1,1}'::real[] <-> '{0,0,0,0}'::real[] AS l2_2;
SELECT '{-3}'::real[] <-> '{1}'::real[] AS l2_4;
SELECT '{1,2,3}'::real[] <#> '{4,5,6}'::real[] AS nip_minus_32;
SELECT '{1,-2}'::real[] <#> '{2,1}'::real[] AS nip_0;
SELECT '{-1,-1}'::real[] <#> '{1,1}'::real[] AS nip_2;
SELECT '{1,0}'::real[] <=> '{0,1}'::real[] AS cos_orthogonal_1;
SELECT '{3,4}'::real[] <=> '{6,8}'::real[] AS cos_parallel_0;
SELECT '{1,0}'::real[] <=> '{-2,0}'::real[] AS cos_opposite_2;
SELECT round(('{1,0}'::real[] <=> '{1,1}'::real[])::numeric, 12) AS cos_45deg;
-- Cosine ignores length (up to rounding): 1 - 13 / sqrt(14 * 29).
SELECT round(('{1,2,3}'::real[] <=> '{-2,0,5}'::real[])::numeric, 12) AS cos_a,
       round(('{2,4,6}'::real[] <=> '{-20,0,50}'::real[])::numeric, 12) AS cos_scaled,
       round((1 - 13 / sqrt(14 * 29))::numeric, 12) AS cos_expected;

-- Commutative, and the result type is float8.
SELECT ('{1,2,3}'::real[] <-> '{3,1,0}'::real[]) = ('{3,1,0}'::real[] <-> '{1,2,3}'::real[]) AS l2_commutes,
       ('{1,2,3}'::real[] <#> '{3,1,0}'::real[]) = ('{3,1,0}'::real[] <#> '{1,2,3}'::real[]) AS ip_commutes,
       ('{1,2,3}'::real[] <=> '{3,1,0}'::real[]) = ('{3,1,0}'::real[] <=> '{1,2,3}'::real[]) AS cos_commutes;
SELECT pg_typeof('{1}'::real[] <-> '{2}'::real[]), pg_typeof('{1}'::real[] <#> '{2}'::real[]),
       pg_typeof('{1}'::real[] <=> '{2}'::real[]);

-- Distances are computed in float8 from the float4 elements.
SELECT '{0.1}'::real[] <-> '{0}'::real[] AS float4_point_one;

-- Non-default lower bounds are fine: only the number of elements matters.
SELECT '[0:1]={3,4}'::real[] <-> '{0,0}'::real[] AS lower_bound_0;

-- Cosine distance with a zero vector is undefined: NaN (which sorts after
-- every number, so such rows come last in ORDER BY <=>).
SELECT '{0,0}'::real[] <=> '{1,0}'::real[] AS cos_zero_left;
SELECT '{1,0}'::real[] <=> '{0,0}'::real[] AS cos_zero_right;
SELECT '{0,0}'::real[] <=> '{0,0}'::real[] AS cos_zero_both;
-- L2 and inner product of a zero vector are ordinary numbers.
SELECT '{0,0}'::real[] <-> '{3,4}'::real[] AS l2_zero, '{0,0}'::real[] <#> '{3,4}'::real[] AS ip_zero;

-- NULL operands give NULL (the functions are STRICT).
SELECT NULL::real[] <-> '{1,2}'::real[] IS NULL AS l2_null_left,
       '{1,2}'::real[] <-> NULL::real[] IS NULL AS l2_null_right,
       NULL::real[] <#> NULL::real[] IS NULL AS ip_null_both,
       NULL::real[] <=> '{1,2}'::real[] IS NULL AS cos_null_left;

-- Errors: different lengths.
SELECT '{1,2}'::real[] <-> '{1,2,3}'::real[];
SELECT '{1,2,3}'::real[] <#> '{1}'::real[];
SELECT '{1}'::real[] <=> '{1,2}'::real[];
-- Errors: multi-dimensional arrays.
SELECT '{{1,2},{3,4}}'::real[] <-> '{1,2}'::real[];
SELECT '{1,2,3,4}'::real[] <#> '{{1,2},{3,4}}'::real[];
-- Errors: empty arrays (PostgreSQL's empty array has no dimension).
SELECT '{}'::real[] <-> '{}'::real[];
SELECT '{1}'::real[] <=> '{}'::real[];
-- Errors: NULL elements.
SELECT '{1,NULL}'::real[] <-> '{1,2}'::real[];
SELECT '{1,2}'::real[] <#> ARRAY[NULL, 1]::real[];
-- Errors: NaN and infinities (the element number is 1-based).
SELECT '{1,NaN}'::real[] <-> '{1,2}'::real[];
SELECT '{1,2}'::real[] <#> '{Infinity,2}'::real[];
SELECT '{1,2,-Infinity}'::real[] <=> '{1,2,3}'::real[];
-- A float4 overflow is caught by the real[] input itself.
SELECT '{1e39}'::real[] <-> '{1}'::real[];

-- The operators are not defined for other element types.
SELECT '{1,2}'::float8[] <-> '{1,2}'::float8[];
-- ... but an integer array literal cast to real[] works.
SELECT ARRAY[3, 4]::real[] <-> ARRAY[0, 0]::real[] AS from_int;

-- The SQL functions behind the operators.
SELECT gpu_ivfpq_l2_distance('{1,2}', '{4,6}') AS l2,
       gpu_ivfpq_negative_inner_product('{1,2}', '{4,6}') AS nip,
       gpu_ivfpq_cosine_distance('{1,0}', '{0,1}') AS cos;

-- Operator metadata: commutators, and the opclasses of the access method.
SELECT oprname, oprleft::regtype, oprright::regtype, oprresult::regtype, oprcom::regoperator
FROM pg_operator WHERE oprname IN ('<->', '<#>', '<=>') AND oprleft = 'real[]'::regtype
ORDER BY oprname;
SELECT opcname, opcdefault, amopopr::regoperator, amoppurpose
FROM pg_opclass c JOIN pg_am a ON a.oid = c.opcmethod
     JOIN pg_amop o ON o.amopfamily = c.opcfamily
WHERE a.amname = 'gpu_ivfpq' AND amoppurpose = 'o' ORDER BY opcname;
-- The filter columns' classes: one family of search operators 1-5 over
-- smallint, integer and bigint, each pair of types.
SELECT opcname, opcintype::regtype, opcdefault, count(*) AS operators,
       count(DISTINCT amopstrategy) AS strategies, bool_and(amoppurpose = 's') AS search
FROM pg_opclass c JOIN pg_am a ON a.oid = c.opcmethod
     JOIN pg_amop o ON o.amopfamily = c.opcfamily
WHERE a.amname = 'gpu_ivfpq' AND opcintype <> 'real[]'::regtype
GROUP BY 1, 2, 3 ORDER BY opcname;
SELECT amvalidate(c.oid) AS valid, opcname FROM pg_opclass c JOIN pg_am a ON a.oid = c.opcmethod
WHERE a.amname = 'gpu_ivfpq' ORDER BY opcname;

-- Index AM properties.
SELECT p.name, pg_indexam_has_property(a.oid, p.name)
FROM pg_am a, unnest(ARRAY['can_order', 'can_unique', 'can_multi_col', 'can_include']) p(name)
WHERE a.amname = 'gpu_ivfpq';
