// Batch search (batch_search.h): candidates from the GPU service in one
// request per chunk of queries (or the CPU engine), then each query's
// candidates re-ranked with exact distances from the heap rows visible to
// the caller's snapshot, as an index scan does.
#include <algorithm>
#include <cmath>
#include <vector>

#include "functions/batch_search.h"
#include "common/guard.h"
#include "engine/ivfpq.h"
#include "engine/topk.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/snapmgr.h"
}

#define BATCH_SEGMENT_BYTES (32 * 1024 * 1024)	/* GPU request size per chunk */

typedef struct BatchHit
{
	double		dist;
	ItemPointerData tid;
} BatchHit;

/* The queries of a real[] argument: one vector (1-D) or one per row (2-D). */
const float *
GpuIvfpqQueryMatrix(ArrayType *arr, int64 *nq, int *dim)
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
		GpuIvfpqWalkList(index, dir[l].head, 0, [&](const char *ent, int n) {
			GpuIvfpqGuard("candidates", [&] {
				for (int i = 0; i < n; i++)
				{
					ItemPointerData tid;

					memcpy(&tid, ent + (Size) i * esz, GPU_IVFPQ_TID_BYTES);
					all.push_back(GpuIvfpqTidToLabel(&tid));
				}
			});
		});
	return all;
}

/* Engine objects of a batch search, freed at its end or with the context on error. */
typedef struct BatchEngineObjects
{
	gpuivfpq::IvfPqQuery *prepared;
	std::vector<int64> *all;
} BatchEngineObjects;

static void
FreeEngineObjects(void *arg)
{
	BatchEngineObjects *eo = (BatchEngineObjects *) arg;

	delete eo->prepared;
	eo->prepared = NULL;
	delete eo->all;
	eo->all = NULL;
}

/*
 * Prepares a batch search of index (opened by the caller, with its heap):
 * k results per query from want candidates (want >= k), through
 * gpu_ivfpq.probes lists. Engine memory is freed with the current context.
 */
void
GpuIvfpqBatchBegin(GpuIvfpqBatchSearch *bs, Relation index, Relation heap, int dim, int k, int want)
{
	MemoryContextCallback *cb = (MemoryContextCallback *) palloc(sizeof(MemoryContextCallback));
	BatchEngineObjects *eo = (BatchEngineObjects *) palloc0(sizeof(BatchEngineObjects));

	memset(bs, 0, sizeof(*bs));
	bs->engine = eo;
	bs->index = index;
	bs->heap = heap;
	bs->metric = GpuIvfpqMetricOf(index);
	bs->dim = dim;
	bs->k = k;
	bs->want = want;
	GpuIvfpqReadMeta(index, &bs->meta);
	if (bs->meta.dimensions != 0 && (uint32) dim != bs->meta.dimensions)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("query vectors have %d dimensions, the index \"%s\" has %u",
						dim, RelationGetRelationName(index), bs->meta.dimensions)));
	if (dim > GPU_IVFPQ_MAX_DIM)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("query vectors have %d dimensions, more than %d", dim, GPU_IVFPQ_MAX_DIM)));
	bs->dir = GpuIvfpqReadListDir(index, &bs->meta);
	bs->probes = Min(gpu_ivfpq_probes, (int) bs->meta.lists);
	/* bs lives on the caller's stack: the callback owns only the engine objects. */
	cb->func = FreeEngineObjects;
	cb->arg = eo;
	MemoryContextRegisterResetCallback(CurrentMemoryContext, cb);
	if (bs->meta.trained)
	{
		bs->model = GpuIvfpqGetModel(index, &bs->meta);
		GpuIvfpqGuard("query preparation", [&] { eo->prepared = new gpuivfpq::IvfPqQuery(); });
	}
	else
	{
		std::vector<int64> all = AllLabels(index, &bs->meta, bs->dir);

		GpuIvfpqGuard("candidates", [&] { eo->all = new std::vector<int64>(all); });
	}
	bs->prepared = eo->prepared;
	bs->all = eo->all;
	/* Chunks of queries: one GPU request each, within a bounded segment. */
	bs->chunk = Max((int64) 1, (int64) (BATCH_SEGMENT_BYTES /
										 ((Size) dim * sizeof(float) + (Size) want * sizeof(int64))));
	bs->labels = (int64 *) palloc_extended((Size) bs->chunk * want * sizeof(int64), MCXT_ALLOC_HUGE);
	bs->counts = (int *) palloc(sizeof(int) * bs->chunk);
	bs->hits = palloc_extended(sizeof(BatchHit) * Max((Size) want, (bs->all ? bs->all->size() : 0) + 1),
							   MCXT_ALLOC_HUGE);
	GpuIvfpqHeapFetchBegin(&bs->hf, heap, index, GetActiveSnapshot());
}

/* Searches nq queries (nq x dim floats), calling emit for each result in rank order. */
void
GpuIvfpqBatchRun(GpuIvfpqBatchSearch *bs, const float *queries, int64 nq, GpuIvfpqBatchEmit emit,
				 void *arg)
{
	BatchHit   *hits = (BatchHit *) bs->hits;
	int			want = bs->want;
	int			dim = bs->dim;

	for (int64 c0 = 0; c0 < nq; c0 += bs->chunk)
	{
		int64		cn = Min(bs->chunk, nq - c0);
		bool		on_gpu = false;

		if (bs->meta.trained)
		{
			on_gpu = GpuIvfpqServiceSearchBatch(bs->index, &bs->meta, queries + c0 * dim, cn, want,
												bs->probes, bs->labels);
			for (int64 i = 0; i < cn; i++)
			{
				int			n = 0;

				if (on_gpu)
					while (n < want && bs->labels[i * want + n] >= 0)
						n++;
				else
				{
					n = CpuCandidates(bs->index, &bs->meta, bs->dir, bs->model, bs->prepared,
									  queries + (c0 + i) * dim, bs->probes, want, bs->labels + i * want);
					GpuIvfpqCountCpuQuery();
				}
				bs->counts[i] = n;
			}
			if (on_gpu)
				bs->gpu_queries += cn;
			else
				bs->cpu_queries += cn;
		}
		for (int64 i = 0; i < cn; i++)
		{
			int64	   *cand = bs->meta.trained ? bs->labels + i * want : bs->all->data();
			int64		ncand = bs->meta.trained ? bs->counts[i] : (int64) bs->all->size();
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
				v = GpuIvfpqHeapFetchVector(&bs->hf, &tid, &vdim);
				if (v != NULL && vdim == dim)
				{
					hits[nh].dist = GpuIvfpqExactDistance(bs->metric, q, v, dim);
					hits[nh].tid = tid;
					nh++;
				}
			}
			std::sort(hits, hits + nh, [](const BatchHit &a, const BatchHit &b) {
				if (a.dist != b.dist)
					return a.dist < b.dist;
				return ItemPointerCompare((ItemPointer) &a.tid, (ItemPointer) &b.tid) < 0;
			});
			for (int64 r = 0; r < Min(nh, (int64) bs->k); r++)
				emit(arg, c0 + i, (int) r, &hits[r].tid, hits[r].dist);
			CHECK_FOR_INTERRUPTS();
		}
	}
}

void
GpuIvfpqBatchEnd(GpuIvfpqBatchSearch *bs)
{
	GpuIvfpqHeapFetchEnd(&bs->hf);
	GpuIvfpqGuard("cleanup", [&] { FreeEngineObjects(bs->engine); });
	bs->prepared = NULL;
	bs->all = NULL;
}
