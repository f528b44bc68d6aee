// The query arguments of the search functions, whatever their SQL type:
// real[] (one vector, or a matrix of one query per row) in gpu_ivfpq's own
// signatures; vector, halfvec and arrays of them in gpu_ivfpq_pgvector's
// overloads of the same C functions. Queries come out as float4 rows.
#pragma once

#include "common/gpu_ivfpq.h"

extern const float *GpuIvfpqQueryVectors(FunctionCallInfo fcinfo, int argno, int64 *nq, int *dim);
extern const float *GpuIvfpqQueryVector(FunctionCallInfo fcinfo, int argno, int *dim);
