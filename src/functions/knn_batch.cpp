// gpu_ivfpq_knn_batch: many k-NN queries in one call, through batch search.
#include <cmath>

#include "functions/batch_search.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "executor/executor.h"
#include "funcapi.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(gpu_ivfpq_knn_batch);
}

/* k of gpu_ivfpq_knn_batch and gpu_ivfpq_knn_graph: 1..GPU_IVFPQ_BATCH_MAX_K. */
void
GpuIvfpqCheckBatchK(int k)
{
	if (k < 1 || k > GPU_IVFPQ_BATCH_MAX_K)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("k must be between 1 and %d, not %d", GPU_IVFPQ_BATCH_MAX_K, k)));
}

typedef struct BatchOut
{
	Tuplestorestate *store;
	TupleDesc	desc;
	int64		base;			/* query number of the first query of the run */
} BatchOut;

static void
EmitBatchRow(void *arg, int64 query, int rank, ItemPointer tid, double dist)
{
	BatchOut   *out = (BatchOut *) arg;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	values[0] = Int32GetDatum((int32) (out->base + query + 1));
	values[1] = Int32GetDatum(rank + 1);
	values[2] = PointerGetDatum(tid);
	values[3] = Float8GetDatum(dist);
	tuplestore_putvalues(out->store, out->desc, values, nulls);
}

/* gpu_ivfpq_knn_batch(index, queries, k): (query, rank, tid, distance). */
Datum
gpu_ivfpq_knn_batch(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	int32		k = PG_GETARG_INT32(2);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Relation	index;
	Relation	heap;
	GpuIvfpqBatchSearch bs;
	BatchOut	out;
	const float *queries;
	int64		nq;
	int			dim;

	GpuIvfpqCheckBatchK(k);
	queries = GpuIvfpqQueryVectors(fcinfo, 1, &nq, &dim);
	InitMaterializedSRF(fcinfo, 0);
	GpuIvfpqOpenIndexChecked(indexoid, "gpu_ivfpq", "gpu_ivfpq_knn_batch", true, &index, &heap);
	GpuIvfpqBatchBegin(&bs, index, heap, dim, k, Max(k, gpu_ivfpq_rerank));
	out.store = rsinfo->setResult;
	out.desc = rsinfo->setDesc;
	out.base = 0;
	GpuIvfpqBatchRun(&bs, queries, nq, EmitBatchRow, &out);
	GpuIvfpqBatchEnd(&bs);
	elog(DEBUG1, "gpu_ivfpq batch search on \"%s\": %lld queries, %d candidates each, %lld on the GPU; "
		 "searching %.3f s, visibility and rows %.3f s (%lld fetched by bound, %lld wider searches)",
		 RelationGetRelationName(index), (long long) nq, bs.want, (long long) bs.gpu_queries,
		 bs.search_secs, bs.finish_secs, (long long) bs.fetched, (long long) bs.widened);
	table_close(heap, AccessShareLock);
	relation_close(index, AccessShareLock);
	PG_RETURN_VOID();
}

