// Batch search (batch_search.h): candidates from the GPU service in one
// request per chunk of queries (or the CPU engine), re-ranked where the
// vectors are (the GPU's mirror, the index's vector copies, or the heap
// rows visible to the caller's snapshot), as an index scan does.
#include <algorithm>
#include <cmath>

#include "functions/batch_search.h"
#include "functions/parallel_rerank.h"
#include "service/service.h"
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

/*
 * Reads every entry of the index into bs->all (once), for the queries that
 * re-rank them all: those of an untrained index, and those too long for
 * the quantizers to rank (gpuivfpq::ivfpq_ranks_query).
 */
static void
ReadAllEntries(GpuIvfpqBatchSearch *bs)
{
	if (bs->all_read)
		return;
	for (uint32 l = 0; l < bs->meta.lists; l++)
		(void) GpuIvfpqCollectList(bs->index, &bs->meta, bs->dir[l].head, NULL, NULL, &bs->all);
	/* Sorted once: re-ranking sorts its input in place, a no-op on sorted labels. */
	std::sort(bs->all.labels, bs->all.labels + bs->all.n);
	bs->all_read = true;
	if (bs->all.n + 1 > bs->hits_cap)
	{
		bs->hits_cap = bs->all.n + 1;
		bs->hits = (GpuIvfpqHit *) repalloc_huge(bs->hits, sizeof(GpuIvfpqHit) * bs->hits_cap);
	}
}

/*
 * Prepares a batch search of index (opened by the caller, with its heap):
 * k results per query from want candidates (want >= k), through
 * gpu_ivfpq.probes lists. Engine memory is freed with the current context.
 */
void
GpuIvfpqBatchBegin(GpuIvfpqBatchSearch *bs, Relation index, Relation heap, int dim, int k, int want)
{
	memset(bs, 0, sizeof(*bs));
	bs->index = index;
	bs->heap = heap;
	bs->metric = GpuIvfpqMetricOf(index);
	bs->dim = dim;
	bs->k = k;
	GpuIvfpqReadMeta(index, &bs->meta);
	/* No more candidates than the index can hold, whatever gpu_ivfpq.rerank says. */
	want = (int) Max((int64) k, Min((int64) want, GpuIvfpqEntriesBound(index, &bs->meta)));
	bs->want = want;
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
	if (bs->meta.trained)
	{
		/* The model is loaded for the queries the CPU engine searches, if any. */
		if (!GpuIvfpqIsRabitq(&bs->meta))
			bs->prepared = GpuIvfpqMakeOwned<gpuivfpq::IvfPqQuery>(CurrentMemoryContext, "query preparation");
		bs->topk = GpuIvfpqMakeOwned<gpuivfpq::TopK>(CurrentMemoryContext, "k-selection", (size_t) want);
	}

	/* Chunks of queries: one GPU request each, within a bounded segment. */
	bs->chunk = Max((int64) 1, (int64) (BATCH_SEGMENT_BYTES /
										 ((Size) dim * sizeof(float) +
										  (Size) want * (sizeof(int64) + sizeof(double)))));
	bs->vectors = GpuIvfpqLayoutOf(&bs->meta).vdim > 0;
	bs->labels = (int64 *) palloc_extended((Size) bs->chunk * want * sizeof(int64), MCXT_ALLOC_HUGE);
	bs->exact = (double *) palloc_extended((Size) bs->chunk * want * sizeof(double), MCXT_ALLOC_HUGE);
	bs->counts = (int *) palloc(sizeof(int) * bs->chunk);
	bs->hits_cap = (int64) want + 1;
	bs->hits = (GpuIvfpqHit *) palloc_extended(sizeof(GpuIvfpqHit) * bs->hits_cap, MCXT_ALLOC_HUGE);
	if (!bs->meta.trained)
	{
		/* Nothing for the GPU to mirror: device = gpu says so, as an index scan does. */
		if (gpu_ivfpq_device == GPU_IVFPQ_DEVICE_GPU)
			GpuIvfpqGpuRequiredError("batch search",
									 "The index has no trained quantizers (REINDEX it once its table holds rows)");
		ReadAllEntries(bs);
	}
	GpuIvfpqHeapFetchBegin(&bs->hf, heap, index, GetActiveSnapshot());
}

/*
 * The CPU engine's candidates of query q from its probes nearest lists
 * through topk (room for its k() in labels and exact); *n says how many.
 * Returns how many entries those lists hold.
 */
static int64
CpuCandidates(GpuIvfpqBatchSearch *bs, const float *q, int probes, gpuivfpq::TopK *topk, int64 *labels,
			  double *exact, int *n)
{
	int64		entries;

	if (GpuIvfpqIsRabitq(&bs->meta))
	{
		/* RaBitQ codes: candidates by lower bound, re-ranked from the heap. */
		entries = GpuIvfpqRabitqRankLists(bs->index, &bs->meta, bs->dir, q, probes, NULL, topk, labels,
										  exact, n);
	}
	else
	{
		/* Asked again per query: other scans may have evicted it since. */
		bs->model = GpuIvfpqGetModel(bs->index, &bs->meta);
		GpuIvfpqGuard("query preparation", [&] { bs->model->prepare_query(q, probes, *bs->prepared); });
		entries = GpuIvfpqRankLists(bs->index, &bs->meta, bs->dir, bs->model, bs->prepared, probes, NULL,
									topk, q, labels, bs->vectors ? exact : NULL, n);
	}
	GpuIvfpqCountCpuQuery();
	return entries;
}

/* Re-ranks a query's n candidates as dists says into bs->hits (room for n + 1); returns how many are kept. */
static int64
RerankCandidates(GpuIvfpqBatchSearch *bs, const GpuIvfpqRerankSpec *spec, int64 *labels, double *exact,
				 int n, GpuIvfpqAnswerDists dists)
{
	if (dists == GPU_IVFPQ_DISTS_EXACT)
		return GpuIvfpqKeepVisible(&bs->hf, bs->visible, labels, exact, n, bs->k, bs->hits);
	if (dists == GPU_IVFPQ_DISTS_LOWER)
	{
		int64		fetched = 0;
		int64		nh = 0;

		/* hits has room for n + 1, and no more than n rows are kept. */
		GpuIvfpqRerankBoundedBatch(&bs->hf, spec, spec->query, 1, labels, exact, n, &n, bs->k, bs->hits, &nh,
								   &fetched);
		bs->fetched += fetched;
		return nh;
	}
	return GpuIvfpqRerank(&bs->hf, spec, labels, n, bs->hits, NULL);
}

/*
 * A query whose full set of candidates left fewer than k rows visible
 * (entries of rows deleted or not yet visible, before VACUUM): searched
 * again on the CPU engine with twice the lists and twice the candidates
 * until k rows are kept, every entry was ranked, or the candidates the
 * snapshot sees reach gpu_ivfpq.max_scan_tuples, as an index scan's later
 * rounds widen (the entries it cannot see do not count: they would end the
 * search before it found a row). The kept rows are in bs->hits; returns
 * how many.
 */
static int64
WidenQuery(GpuIvfpqBatchSearch *bs, const GpuIvfpqRerankSpec *spec, int64 kept)
{
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq batch widening",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	int			lists = (int) bs->meta.lists;
	int64		bound = GpuIvfpqEntriesBound(bs->index, &bs->meta);
	int			probes = bs->probes;
	int64		want = bs->want;
	GpuIvfpqAnswerDists dists = bs->vectors ? GPU_IVFPQ_DISTS_EXACT
		: GpuIvfpqIsRabitq(&bs->meta) ? GPU_IVFPQ_DISTS_LOWER : GPU_IVFPQ_DISTS_NONE;

	int64		invisible = 0;	/* of the last round's candidates */

	while (kept < bs->k && (probes < lists || want < bound) && want - invisible < gpu_ivfpq_max_scan_tuples)
	{
		gpuivfpq::TopK *topk;
		int64	   *labels;
		double	   *exact;
		int			n = 0;
		int64		entries;

		probes = Min(probes * 2, lists);
		want = Min(Min(want * 2, bound), (int64) INT_MAX / 4);
		topk = GpuIvfpqMakeOwned<gpuivfpq::TopK>(cxt, "k-selection", (size_t) want);
		labels = (int64 *) palloc_extended(sizeof(int64) * want, MCXT_ALLOC_HUGE);
		exact = (double *) palloc_extended(sizeof(double) * want, MCXT_ALLOC_HUGE);
		entries = CpuCandidates(bs, spec->query, probes, topk, labels, exact, &n);
		if (bs->hits_cap < (int64) n + 1)
		{
			bs->hits_cap = (int64) n + 1;
			bs->hits = (GpuIvfpqHit *) repalloc_huge(bs->hits, sizeof(GpuIvfpqHit) * bs->hits_cap);
		}
		kept = RerankCandidates(bs, spec, labels, exact, n, dists);
		invisible = Max((int64) n - kept, 0);
		bs->widened++;
		/* Every entry of every list ranked: nothing further to find. */
		if (probes == lists && entries <= want)
			break;
		MemoryContextReset(cxt);
	}
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	return kept;
}

/*
 * Whether a query whose n candidates left fewer than k rows visible may find
 * more with more lists: a full set of candidates (entries not visible took
 * places), or lists left unprobed (the probed ones held too few entries, as
 * with data in few lists), as an index scan's later rounds find them.
 */
static bool
MayFindMore(const GpuIvfpqBatchSearch *bs, int n)
{
	return n == bs->want || bs->probes < (int) bs->meta.lists;
}

/* Searches nq queries (nq x dim floats), calling emit for each result in rank order. */
void
GpuIvfpqBatchRun(GpuIvfpqBatchSearch *bs, const float *queries, int64 nq, GpuIvfpqBatchEmit emit,
				 void *arg)
{
	int			want = bs->want;
	int			dim = bs->dim;
	GpuIvfpqRerankSpec spec;

	memset(&spec, 0, sizeof(spec));
	spec.metric = bs->metric;
	spec.dim = dim;
	for (int64 c0 = 0; c0 < nq; c0 += bs->chunk)
	{
		int64		cn = Min(bs->chunk, nq - c0);
		bool		on_gpu = false;
		bool		all_ranked = bs->meta.trained;
		GpuIvfpqAnswerDists dists = GPU_IVFPQ_DISTS_NONE;
		instr_time	t0,
					t1;

		INSTR_TIME_SET_CURRENT(t0);

		if (bs->meta.trained)
		{
			on_gpu = GpuIvfpqServiceSearchBatch(bs->index, &bs->meta, queries + c0 * dim, cn, want,
												bs->probes, false, bs->labels, bs->exact, &dists,
												&bs->segment);
			for (int64 i = 0; i < cn; i++)
			{
				int			n = 0;

				/* Too long to rank: every entry is re-ranked below. */
				if (!gpuivfpq::ivfpq_ranks_query(queries + (c0 + i) * dim, (size_t) dim))
				{
					ReadAllEntries(bs);
					all_ranked = false;
				}
				else if (on_gpu)
					while (n < want && bs->labels[i * want + n] >= 0)
						n++;
				else
					(void) CpuCandidates(bs, queries + (c0 + i) * dim, bs->probes, bs->topk,
										 bs->labels + i * want, bs->exact + i * want, &n);
				bs->counts[i] = n;
			}
			if (on_gpu)
				bs->gpu_queries += cn;
			else
				bs->cpu_queries += cn;
			/* Re-ranked by the GPU, or by RankLists from the vector copies; RaBitQ: bounds. */
			if (!on_gpu)
				dists = bs->vectors ? GPU_IVFPQ_DISTS_EXACT
					: GpuIvfpqIsRabitq(&bs->meta) ? GPU_IVFPQ_DISTS_LOWER : GPU_IVFPQ_DISTS_NONE;
		}
		INSTR_TIME_SET_CURRENT(t1);
		INSTR_TIME_SUBTRACT(t1, t0);
		bs->search_secs += INSTR_TIME_GET_DOUBLE(t1);
		INSTR_TIME_SET_CURRENT(t0);
		/*
		 * Re-ranks from the table over parallel workers where it can; else
		 * candidates by bound a group of queries at a time, as a parallel
		 * participant takes them.
		 */
		if (all_ranked && (dists == GPU_IVFPQ_DISTS_LOWER || dists == GPU_IVFPQ_DISTS_NONE))
		{
			bool		grouped = false;

			if (bs->par_hits == NULL)
			{
				bs->par_hits = (GpuIvfpqHit *) palloc_extended(sizeof(GpuIvfpqHit) * (Size) bs->chunk * bs->k,
															   MCXT_ALLOC_HUGE);
				bs->par_counts = (int64 *) palloc(sizeof(int64) * bs->chunk);
			}
			if (cn >= 2 * GPU_IVFPQ_RERANK_PER_PARTICIPANT)
				grouped = GpuIvfpqRerankParallel(bs, queries + c0 * dim, cn, dists, bs->par_hits, bs->par_counts);
			if (!grouped && dists == GPU_IVFPQ_DISTS_LOWER)
			{
				int64		group = GpuIvfpqRerankGroup(want);

				for (int64 g0 = 0; g0 < cn; g0 += group)
				{
					int64		fetched = 0;

					GpuIvfpqRerankBoundedBatch(&bs->hf, &spec, queries + (c0 + g0) * dim, Min(group, cn - g0),
											   bs->labels + g0 * want, bs->exact + g0 * want, want,
											   bs->counts + g0, bs->k, bs->par_hits + g0 * bs->k,
											   bs->par_counts + g0, &fetched);
					bs->fetched += fetched;
				}
				grouped = true;
			}
			if (grouped)
			{
				for (int64 i = 0; i < cn; i++)
				{
					if (bs->par_counts[i] < bs->k && MayFindMore(bs, bs->counts[i]))
					{
						int64		nh;

						spec.query = queries + (c0 + i) * dim;
						nh = WidenQuery(bs, &spec, bs->par_counts[i]);
						for (int64 r = 0; r < Min(nh, (int64) bs->k); r++)
							emit(arg, c0 + i, (int) r, &bs->hits[r].tid, bs->hits[r].dist);
					}
					else
						for (int64 r = 0; r < bs->par_counts[i]; r++)
							emit(arg, c0 + i, (int) r, &bs->par_hits[i * bs->k + r].tid,
								 bs->par_hits[i * bs->k + r].dist);
					CHECK_FOR_INTERRUPTS();
				}
				INSTR_TIME_SET_CURRENT(t1);
				INSTR_TIME_SUBTRACT(t1, t0);
				bs->finish_secs += INSTR_TIME_GET_DOUBLE(t1);
				continue;
			}
		}
		for (int64 i = 0; i < cn; i++)
		{
			int64		nh;

			spec.query = queries + (c0 + i) * dim;
			/* Untrained, or a query too long to rank: it re-ranks every entry. */
			if (!bs->meta.trained || !gpuivfpq::ivfpq_ranks_query(spec.query, (size_t) dim))
				nh = GpuIvfpqRerank(&bs->hf, &spec, bs->all.labels, bs->all.n, bs->hits, NULL);
			else
			{
				nh = RerankCandidates(bs, &spec, bs->labels + i * want, bs->exact + i * want, bs->counts[i],
									  dists);
				if (nh < bs->k && MayFindMore(bs, bs->counts[i]))
					nh = WidenQuery(bs, &spec, nh);
			}
			for (int64 r = 0; r < Min(nh, (int64) bs->k); r++)
				emit(arg, c0 + i, (int) r, &bs->hits[r].tid, bs->hits[r].dist);
			CHECK_FOR_INTERRUPTS();
		}
		INSTR_TIME_SET_CURRENT(t1);
		INSTR_TIME_SUBTRACT(t1, t0);
		bs->finish_secs += INSTR_TIME_GET_DOUBLE(t1);
	}
}

/* Ends the heap access; engine objects go with the caller's memory context. */
void
GpuIvfpqBatchEnd(GpuIvfpqBatchSearch *bs)
{
	GpuIvfpqHeapFetchEnd(&bs->hf);
	if (bs->segment != NULL)
		dsm_detach(bs->segment);
	bs->segment = NULL;
}
