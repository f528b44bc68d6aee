// Distance operators on real[] (<->, <#>, <=>), the input checks they share
// with the index, and the one reader of vector values of every format.
#include <cmath>

#include "am/am.h"
#include "engine/distances.h"
#include "engine/exact_distance.h"

extern "C" {
PG_FUNCTION_INFO_V1(gpu_ivfpq_l2_distance);
PG_FUNCTION_INFO_V1(gpu_ivfpq_negative_inner_product);
PG_FUNCTION_INFO_V1(gpu_ivfpq_cosine_distance);
PG_FUNCTION_INFO_V1(gpu_ivfpq_metric_l2);
PG_FUNCTION_INFO_V1(gpu_ivfpq_metric_ip);
PG_FUNCTION_INFO_V1(gpu_ivfpq_metric_cosine);
}

/*
 * Checks that arr is a usable vector (one dimension, float4, no NULLs, only
 * finite values) and returns its elements. what names the value in errors.
 */
const float *
GpuIvfpqArrayVector(ArrayType *arr, int *dim, const char *what)
{
	const float *data;
	int			n;

	if (ARR_ELEMTYPE(arr) != FLOAT4OID)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("%s must be a real[] array", what)));
	if (ARR_NDIM(arr) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array, not %d-dimensional", what, ARR_NDIM(arr)),
				 errhint("Use a flat array such as '{0.1, 0.2, 0.3}'; an empty array is not a vector.")));
	if (ARR_HASNULL(arr) && array_contains_nulls(arr))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not contain NULL elements", what)));
	n = ARR_DIMS(arr)[0];
	data = (const float *) ARR_DATA_PTR(arr);
	GpuIvfpqCheckFinite(data, n, what);
	*dim = n;
	return data;
}

void
GpuIvfpqCheckFinite(const float *v, int n, const char *what)
{
	uint32		bad = 0;

	/*
	 * A branch-free pass first (every row the executor projects comes here
	 * twice): an exponent of all ones is NaN or infinity. Only a vector that
	 * holds one is walked again for the element to name.
	 */
	for (int i = 0; i < n; i++)
	{
		uint32		bits;

		memcpy(&bits, &v[i], sizeof(bits));
		bad |= (uint32) ((bits & 0x7f800000) == 0x7f800000);
	}
	if (likely(bad == 0))
		return;
	for (int i = 0; i < n; i++)
	{
		if (!std::isfinite(v[i]))
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("%s element %d is %s", what, i + 1,
							std::isnan(v[i]) ? "NaN" : "infinite"),
					 errhint("Vectors must hold finite values only.")));
	}
}

/* Errors out when a vector has more dimensions than the index can hold. */
void
GpuIvfpqCheckIndexableDim(int dim)
{
	if (dim > GPU_IVFPQ_MAX_DIM)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("vector has %d dimensions, gpu_ivfpq indexes at most %d", dim, GPU_IVFPQ_MAX_DIM),
				 errhint("Reduce the vectors' dimension (for example by a projection) before indexing them.")));
}

/*
 * The elements of a vector value of the given format, checked as the
 * operators check real[] (finite values; pgvector's layout), as float4:
 * build, insert, scans, the search functions and the checker all read
 * vectors here, so every path sees the same floats for the same value
 * (a halfvec's converted exactly). what names the value in errors.
 */
const float *
GpuIvfpqDatumVector(Datum value, GpuIvfpqVectorFormat format, int *dim, const char *what)
{
	switch (format)
	{
		case GPU_IVFPQ_FORMAT_REAL_ARRAY:
			return GpuIvfpqArrayVector(DatumGetArrayTypeP(value), dim, what);
		case GPU_IVFPQ_FORMAT_VECTOR:
		case GPU_IVFPQ_FORMAT_HALFVEC:
			return GpuIvfpqPgvectorElements(value, format, dim, what);
		case GPU_IVFPQ_FORMAT_NONE:
			break;
	}
	ereport(ERROR,
			(errcode(ERRCODE_DATATYPE_MISMATCH),
			 errmsg("%s is not of a vector type gpu_ivfpq reads", what)));
	return NULL;
}

/*
 * The elements of a vector read back from the heap for re-ranking. A real[]
 * was fully checked when it was indexed, so only its shape is checked here.
 */
const float *
GpuIvfpqStoredVector(Datum value, GpuIvfpqVectorFormat format, int *dim)
{
	ArrayType  *arr;

	if (format != GPU_IVFPQ_FORMAT_REAL_ARRAY)
		return GpuIvfpqDatumVector(value, format, dim, "indexed vector");
	arr = DatumGetArrayTypeP(value);
	if (ARR_ELEMTYPE(arr) != FLOAT4OID || ARR_NDIM(arr) != 1 || ARR_HASNULL(arr))
		return GpuIvfpqArrayVector(arr, dim, "indexed vector");
	*dim = ARR_DIMS(arr)[0];
	return (const float *) ARR_DATA_PTR(arr);
}

/*
 * The exact distance of a metric, as the SQL operators return it. The
 * operators, the index's re-ranking on the CPU and the GPU's re-rank kernel
 * all compute it with gpuivfpq::exact_distance, so an index scan orders rows
 * by exactly the values a sequential scan would compute.
 */
double
GpuIvfpqExactDistance(int metric, const float *a, const float *b, int dim)
{
	return gpuivfpq::exact_distance((gpuivfpq::Metric) metric, a, b, (size_t) Max(dim, 0));
}

/* Shared body of the three operators: checks both inputs, then measures. */
static double
DistanceBetweenArrays(FunctionCallInfo fcinfo, int metric)
{
	ArrayType  *a = PG_GETARG_ARRAYTYPE_P(0);
	ArrayType  *b = PG_GETARG_ARRAYTYPE_P(1);
	int			da,
				db;
	const float *va = GpuIvfpqArrayVector(a, &da, "vector");
	const float *vb = GpuIvfpqArrayVector(b, &db, "vector");

	if (da != db)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("vectors have different dimensions %d and %d", da, db)));
	return GpuIvfpqExactDistance(metric, va, vb, da);
}

/* real[] <-> real[]: Euclidean distance. */
Datum
gpu_ivfpq_l2_distance(PG_FUNCTION_ARGS)
{
	PG_RETURN_FLOAT8(DistanceBetweenArrays(fcinfo, (int) gpuivfpq::Metric::L2));
}

/* real[] <#> real[]: negative inner product (smaller is more similar). */
Datum
gpu_ivfpq_negative_inner_product(PG_FUNCTION_ARGS)
{
	PG_RETURN_FLOAT8(DistanceBetweenArrays(fcinfo, (int) gpuivfpq::Metric::InnerProduct));
}

/* real[] <=> real[]: cosine distance, 1 - cos(a, b). */
Datum
gpu_ivfpq_cosine_distance(PG_FUNCTION_ARGS)
{
	PG_RETURN_FLOAT8(DistanceBetweenArrays(fcinfo, (int) gpuivfpq::Metric::Cosine));
}

/* Opclass support function 2: which metric an operator class indexes. */
Datum
gpu_ivfpq_metric_l2(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32((int32) gpuivfpq::Metric::L2);
}

Datum
gpu_ivfpq_metric_ip(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32((int32) gpuivfpq::Metric::InnerProduct);
}

Datum
gpu_ivfpq_metric_cosine(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT32((int32) gpuivfpq::Metric::Cosine);
}
