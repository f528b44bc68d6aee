// The query arguments of the search functions (queries.h): the argument's
// declared type says how to read it; each vector goes through
// GpuIvfpqDatumVector, the one reader.
#include <cmath>

#include "functions/queries.h"

/* The queries of a real[] argument: one vector (1-D) or one per row (2-D). */
static const float *
RealArrayQueries(ArrayType *arr, int64 *nq, int *dim)
{
	int			ndim = ARR_NDIM(arr);
	int			n;

	if (ARR_ELEMTYPE(arr) != FLOAT4OID)
		elog(ERROR, "queries must be real[]");
	if (ndim == 0)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("queries must not be empty")));
	if (ndim != 1 && ndim != 2)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("queries must be a vector (real[]) or a matrix (real[][]), not a %d-dimensional array", ndim),
				 errhint("Build the matrix with array_agg(vector ORDER BY ...).")));
	if (ARR_HASNULL(arr) && array_contains_nulls(arr))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("queries must not contain NULL elements")));
	n = ArrayGetNItems(ndim, ARR_DIMS(arr));
	*nq = ndim == 1 ? 1 : ARR_DIMS(arr)[0];
	*dim = ndim == 1 ? ARR_DIMS(arr)[0] : ARR_DIMS(arr)[1];
	if (n == 0 || *dim == 0)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("queries must not be empty")));
	for (int i = 0; i < n; i++)
		if (!std::isfinite(((const float *) ARR_DATA_PTR(arr))[i]))
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("queries must not contain NaN or infinity")));
	return (const float *) ARR_DATA_PTR(arr);
}

/*
 * The queries of an array of vector or halfvec values, one per element, as
 * rows of a float4 matrix (palloc'd): every query must have the first
 * one's dimension.
 */
static const float *
PgvectorArrayQueries(ArrayType *arr, GpuIvfpqVectorFormat format, int64 *nq, int *dim)
{
	int16		typlen;
	bool		typbyval;
	char		typalign;
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	float	   *out = NULL;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("queries must be a one-dimensional array of %s, not %d-dimensional",
						GpuIvfpqFormatName(format), ARR_NDIM(arr)),
				 errhint("Build it with array_agg(vector ORDER BY ...).")));
	get_typlenbyvalalign(ARR_ELEMTYPE(arr), &typlen, &typbyval, &typalign);
	deconstruct_array(arr, ARR_ELEMTYPE(arr), typlen, typbyval, typalign, &elems, &nulls, &n);
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("queries must not be empty")));
	for (int i = 0; i < n; i++)
	{
		int			d;
		const float *v;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("queries must not contain NULL elements"),
					 errdetail("Query %d is NULL.", i + 1)));
		v = GpuIvfpqDatumVector(elems[i], format, &d, "query vector");
		if (out == NULL)
		{
			*dim = d;
			out = (float *) palloc_extended(sizeof(float) * (Size) n * d, MCXT_ALLOC_HUGE);
		}
		else if (d != *dim)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("query %d has %d dimensions, query 1 has %d", i + 1, d, *dim),
					 errhint("Every query must have the index's number of dimensions.")));
		memcpy(out + (Size) i * d, v, sizeof(float) * d);
		CHECK_FOR_INTERRUPTS();
	}
	*nq = n;
	return out;
}

/*
 * The queries of argument argno (nq rows of dim floats): a real[] vector or
 * matrix, one vector or halfvec, or an array of them.
 */
const float *
GpuIvfpqQueryVectors(FunctionCallInfo fcinfo, int argno, int64 *nq, int *dim)
{
	bool		is_array;
	GpuIvfpqVectorFormat format = GpuIvfpqArgFormat(fcinfo, argno, &is_array);

	if (format == GPU_IVFPQ_FORMAT_REAL_ARRAY)
		return RealArrayQueries(PG_GETARG_ARRAYTYPE_P(argno), nq, dim);
	if (is_array)
		return PgvectorArrayQueries(PG_GETARG_ARRAYTYPE_P(argno), format, nq, dim);
	*nq = 1;
	return GpuIvfpqDatumVector(PG_GETARG_DATUM(argno), format, dim, "query vector");
}

/* The one query of argument argno: a real[], vector or halfvec. */
const float *
GpuIvfpqQueryVector(FunctionCallInfo fcinfo, int argno, int *dim)
{
	bool		is_array;
	GpuIvfpqVectorFormat format = GpuIvfpqArgFormat(fcinfo, argno, &is_array);

	if (is_array)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("query must be one vector, not an array of %s", GpuIvfpqFormatName(format))));
	if (format == GPU_IVFPQ_FORMAT_REAL_ARRAY)
		return GpuIvfpqArrayVector(PG_GETARG_ARRAYTYPE_P(argno), dim, "query vector");
	return GpuIvfpqDatumVector(PG_GETARG_DATUM(argno), format, dim, "query vector");
}
