// Batch k-NN from SQL: many queries in one call. Candidates come from the
// GPU service in one request per chunk of queries (or the CPU engine), then
// each query's candidates are re-ranked with exact distances from the heap
// rows visible to the caller's snapshot, as an index scan does.
#include <algorithm>
#include <cmath>
#include <vector>

#include "heap_fetch.h"
#include "guard.h"
#include "engine/ivfpq.h"
#include "engine/topk.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(gpu_ivfpq_knn_batch);
}

#define BATCH_MAX_K 1000
#define BATCH_SEGMENT_BYTES (32 * 1024 * 1024)	/* GPU request size per chunk */

typedef struct BatchHit
{
	double		dist;
	ItemPointerData tid;
} BatchHit;

/* The queries of a real[] argument: one vector (1-D) or one per row (2-D). */
static const float *
QueryMatrix(ArrayType *arr, int64 *nq, int *dim)
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

/* CPU candidates of one query: the want best labels by ADC over probes lists. */
static int
CpuCandidates(Relation index, const GpuIvfpqMetaPageData *meta, const GpuIvfpqListDirEntry *dir,
			  gpuivfpq::IvfPqModel *model, gpuivfpq::IvfPqQuery *prepared, const float *q,
			  int probes, int want, int64 *labels)
{
	gpuivfpq::TopK *topk = NULL;
	int			n = 0;

	GpuIvfpqGuard("query preparation", [&] {
		model->prepare_query(q, probes, *prepared);
		topk = new gpuivfpq::TopK(want);
	});
	PG_TRY();
	{
		(void) GpuIvfpqRankLists(index, meta, dir, model, prepared, probes, topk);
	}
	PG_CATCH();
	{
		delete topk;
		PG_RE_THROW();
	}
	PG_END_TRY();
	GpuIvfpqGuard("k-selection", [&] {
		for (const auto &nb : topk->take_sorted())
			labels[n++] = nb.label;
		delete topk;
	});
	return n;
}

/* Every entry's label (an untrained index: scans are exact over all rows). */
static std::vector<int64>
AllLabels(Relation index, const GpuIvfpqMetaPageData *meta, const GpuIvfpqListDirEntry *dir)
{
	std::vector<int64> all;
	int			esz = GpuIvfpqEntrySize(0);

	for (uint32 l = 0; l < meta->lists; l++)
		for (BlockNumber blk = dir[l].head; blk != InvalidBlockNumber;)
		{
			Buffer		buf = ReadBuffer(index, blk);
			Page		page;

			LockBuffer(buf, BUFFER_LOCK_SHARE);
			page = BufferGetPage(buf);
			for (int i = 0; i < GpuIvfpqPageEntryCount(page, 0); i++)
			{
				ItemPointerData tid;

				memcpy(&tid, (const char *) PageGetContents(page) + (Size) i * esz, GPU_IVFPQ_TID_BYTES);
				all.push_back(GpuIvfpqTidToLabel(&tid));
			}
			blk = GpuIvfpqPageGetOpaque(page)->next;
			UnlockReleaseBuffer(buf);
			CHECK_FOR_INTERRUPTS();
		}
	return all;
}

/* gpu_ivfpq_knn_batch(index, queries, k): (query, rank, tid, distance). */
Datum
gpu_ivfpq_knn_batch(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	ArrayType  *qarr = PG_GETARG_ARRAYTYPE_P(1);
	int32		k = PG_GETARG_INT32(2);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Relation	index;
	Relation	heap;
	GpuIvfpqMetaPageData meta;
	GpuIvfpqListDirEntry *dir;
	gpuivfpq::IvfPqModel *model = NULL;
	gpuivfpq::IvfPqQuery *prepared = NULL;
	GpuIvfpqHeapFetch hf;
	const float *queries;
	int64		nq;
	int			dim;
	int			metric;
	int			want;
	int			probes;
	int64		chunk;
	int64	   *labels;
	int		   *counts;
	BatchHit   *hits;
	std::vector<int64> all;
	int64		gpu_queries = 0;

	if (k < 1 || k > BATCH_MAX_K)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("k must be between 1 and %d, not %d", BATCH_MAX_K, k)));
	queries = QueryMatrix(qarr, &nq, &dim);
	InitMaterializedSRF(fcinfo, 0);
	index = GpuIvfpqOpenIndex(indexoid);
	heap = table_open(index->rd_index->indrelid, AccessShareLock);
	metric = GpuIvfpqMetricOf(index);
	GpuIvfpqReadMeta(index, &meta);
	if (meta.dimensions != 0 && (uint32) dim != meta.dimensions)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("query vectors have %d dimensions, the index \"%s\" has %u",
						dim, RelationGetRelationName(index), meta.dimensions)));
	if (dim > GPU_IVFPQ_MAX_DIM)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("query vectors have %d dimensions, more than %d", dim, GPU_IVFPQ_MAX_DIM)));
	dir = GpuIvfpqReadListDir(index, &meta);
	want = Max(k, gpu_ivfpq_rerank);
	probes = Min(gpu_ivfpq_probes, (int) meta.lists);
	if (meta.trained)
	{
		model = GpuIvfpqGetModel(index, &meta);
		GpuIvfpqGuard("query preparation", [&] { prepared = new gpuivfpq::IvfPqQuery(); });
	}
	else
		all = AllLabels(index, &meta, dir);

	/* Chunks of queries: one GPU request each, within a bounded segment. */
	chunk = Max((int64) 1, (int64) (BATCH_SEGMENT_BYTES / ((Size) dim * sizeof(float) + (Size) want * sizeof(int64))));
	chunk = Min(chunk, nq);
	labels = (int64 *) palloc_extended((Size) chunk * want * sizeof(int64), MCXT_ALLOC_HUGE);
	counts = (int *) palloc(sizeof(int) * chunk);
	hits = (BatchHit *) palloc(sizeof(BatchHit) * Max((Size) want, all.size() + 1));
	GpuIvfpqHeapFetchBegin(&hf, heap, index, GetActiveSnapshot());
	PG_TRY();
	{
		for (int64 c0 = 0; c0 < nq; c0 += chunk)
		{
			int64		cn = Min(chunk, nq - c0);
			bool		on_gpu = false;

			if (meta.trained)
			{
				on_gpu = GpuIvfpqServiceSearchBatch(index, &meta, queries + c0 * dim, cn, want, probes,
													labels);
				for (int64 i = 0; i < cn; i++)
				{
					int			n = 0;

					if (on_gpu)
						while (n < want && labels[i * want + n] >= 0)
							n++;
					else
						n = CpuCandidates(index, &meta, dir, model, prepared, queries + (c0 + i) * dim,
										  probes, want, labels + i * want);
					counts[i] = n;
				}
				if (on_gpu)
					gpu_queries += cn;
				else
					for (int64 i = 0; i < cn; i++)
						GpuIvfpqCountCpuQuery();
			}
			for (int64 i = 0; i < cn; i++)
			{
				int64	   *cand = meta.trained ? labels + i * want : all.data();
				int64		ncand = meta.trained ? counts[i] : (int64) all.size();
				const float *q = queries + (c0 + i) * dim;
				int64		nh = 0;

				/* Exact distances of the visible rows, fetched in heap order. */
				std::sort(cand, cand + ncand);
				for (int64 j = 0; j < ncand; j++)
				{
					ItemPointerData tid;
					int			vdim;
					const float *v;

					if (j > 0 && cand[j] == cand[j - 1])
						continue;
					GpuIvfpqLabelToTid(cand[j], &tid);
					v = GpuIvfpqHeapFetchVector(&hf, &tid, &vdim);
					if (v != NULL && vdim == dim)
					{
						hits[nh].dist = GpuIvfpqExactDistance(metric, q, v, dim);
						hits[nh].tid = tid;
						nh++;
					}
				}
				std::sort(hits, hits + nh, [](const BatchHit &a, const BatchHit &b) {
					if (a.dist != b.dist)
						return a.dist < b.dist;
					return ItemPointerCompare((ItemPointer) &a.tid, (ItemPointer) &b.tid) < 0;
				});
				for (int64 r = 0; r < Min(nh, (int64) k); r++)
				{
					Datum		values[4];
					bool		nulls[4] = {false, false, false, false};

					values[0] = Int32GetDatum((int32) (c0 + i + 1));
					values[1] = Int32GetDatum((int32) (r + 1));
					values[2] = PointerGetDatum(&hits[r].tid);
					values[3] = Float8GetDatum(hits[r].dist);
					tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
				}
				CHECK_FOR_INTERRUPTS();
			}
		}
	}
	PG_CATCH();
	{
		delete prepared;
		PG_RE_THROW();
	}
	PG_END_TRY();
	GpuIvfpqGuard("cleanup", [&] { delete prepared; });
	GpuIvfpqHeapFetchEnd(&hf);
	elog(DEBUG1, "gpu_ivfpq batch search on \"%s\": %lld queries, %lld candidates each, %lld on the GPU",
		 RelationGetRelationName(index), (long long) nq, (long long) want, (long long) gpu_queries);
	table_close(heap, AccessShareLock);
	relation_close(index, AccessShareLock);
	PG_RETURN_VOID();
}
