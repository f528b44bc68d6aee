// Ordered index scan: probe the nearest lists, rank codes by ADC, re-rank
// the best candidates with exact distances from the heap, and continue with
// more candidates and lists when the executor asks for more rows.
#include <algorithm>
#include <cmath>

#include "common/rerank.h"
#include "common/guard.h"
#include "engine/ivfpq.h"
#include "engine/topk.h"

/* One re-ranked row, returned in (dist, tid) order within its batch. */
typedef struct ScanResult
{
	double		dist;
	ItemPointerData tid;
} ScanResult;

typedef struct GpuIvfpqScanOpaqueData
{
	MemoryContext scanctx;		/* lives as long as the scan */
	MemoryContext batchctx;		/* reset on rescan */

	GpuIvfpqMetaPageData meta;
	GpuIvfpqListDirEntry *dir;
	int			metric;

	/* the query of the current rescan */
	bool		null_query;
	float	   *query;
	gpuivfpq::IvfPqModel *model;	/* owned by the backend cache */
	gpuivfpq::IvfPqQuery *prepared; /* owned here, freed by a context callback */
	bool		query_prepared; /* prepared holds the current query */

	/* progress of the iterative scan */
	bool		started;
	bool		exhausted;
	int			probes;			/* lists probed by the current round */
	int			candidates;		/* ADC candidates taken by the current round */
	int64		reranked;		/* rows re-ranked so far (the bound counts these) */
	int64		entries_seen;	/* entries in the probed lists, last round */
	HTAB	   *seen;			/* TIDs already re-ranked */

	ScanResult *results;
	int			nresults;
	int			next;

	/* instrumentation, reported at DEBUG1 when the scan ends */
	int			gpu_rounds;		/* rounds the GPU service served */
	int			cpu_rounds;
	int64		gpu_batch_sum;	/* sizes of the GPU batches that served them */
	int64		codes_scanned;
	instr_time	adc_time;
	instr_time	rerank_time;

	/* heap access for re-ranking */
	bool		heap_open;		/* hf is set up */
	GpuIvfpqHeapFetch hf;
} GpuIvfpqScanOpaqueData;
typedef GpuIvfpqScanOpaqueData *GpuIvfpqScanOpaque;

/* Frees the prepared query (engine memory) with the scan's context. */
static void
FreePreparedQuery(void *arg)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) arg;

	delete so->prepared;
	so->prepared = NULL;
}

/* Orders results by exact distance (NaN last), then TID. */
static bool
ResultLess(const ScanResult &a, const ScanResult &b)
{
	bool		an = std::isnan(a.dist);
	bool		bn = std::isnan(b.dist);

	if (an != bn)
		return bn;
	if (!an && a.dist != b.dist)
		return a.dist < b.dist;
	return ItemPointerCompare((ItemPointer) &a.tid, (ItemPointer) &b.tid) < 0;
}

/* ambeginscan */
IndexScanDesc
gpuivfpqbeginscan(Relation index, int nkeys, int norderbys)
{
	IndexScanDesc scan = RelationGetIndexScan(index, nkeys, norderbys);
	MemoryContext scanctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq scan",
												  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(scanctx);
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) palloc0(sizeof(GpuIvfpqScanOpaqueData));
	MemoryContextCallback *cb = (MemoryContextCallback *) palloc(sizeof(MemoryContextCallback));

	so->scanctx = scanctx;
	so->batchctx = AllocSetContextCreate(scanctx, "gpu_ivfpq scan batch", ALLOCSET_DEFAULT_SIZES);
	so->metric = GpuIvfpqMetricOf(index);
	GpuIvfpqReadMeta(index, &so->meta);
	so->dir = GpuIvfpqReadListDir(index, &so->meta);
	cb->func = FreePreparedQuery;
	cb->arg = so;
	MemoryContextRegisterResetCallback(scanctx, cb);
	MemoryContextSwitchTo(old);

	/* The executor reads the ORDER BY values from these; the AM provides them. */
	if (norderbys > 0)
	{
		scan->xs_orderbyvals = (Datum *) palloc0(sizeof(Datum) * norderbys);
		scan->xs_orderbynulls = (bool *) palloc(sizeof(bool) * norderbys);
		memset(scan->xs_orderbynulls, true, sizeof(bool) * norderbys);
	}
	scan->opaque = so;
	return scan;
}

/* Sets up the heap fetch machinery on first use (only scans that re-rank need it). */
static void
EnsureHeapAccess(IndexScanDesc scan)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	MemoryContext old;

	if (so->heap_open)
		return;
	if (scan->heapRelation == NULL)
		elog(ERROR, "gpu_ivfpq scans need the heap relation");
	old = MemoryContextSwitchTo(so->scanctx);
	GpuIvfpqHeapFetchBegin(&so->hf, scan->heapRelation, scan->indexRelation, scan->xs_snapshot);
	so->heap_open = true;
	MemoryContextSwitchTo(old);
}

/* amrescan: takes the query vector of the ORDER BY and restarts the scan. */
void
gpuivfpqrescan(IndexScanDesc scan, ScanKey keys, int nkeys, ScanKey orderbys, int norderbys)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	MemoryContext old;
	HASHCTL		hctl;

	MemoryContextReset(so->batchctx);
	so->started = false;
	so->exhausted = false;
	so->reranked = 0;
	so->entries_seen = 0;
	so->results = NULL;
	so->nresults = 0;
	so->next = 0;
	so->query = NULL;
	so->null_query = true;
	so->query_prepared = false;

	if (orderbys && scan->numberOfOrderBys > 0)
		memmove(scan->orderByData, orderbys, scan->numberOfOrderBys * sizeof(ScanKeyData));

	old = MemoryContextSwitchTo(so->batchctx);
	memset(&hctl, 0, sizeof(hctl));
	hctl.keysize = sizeof(ItemPointerData);
	hctl.entrysize = sizeof(ItemPointerData);
	hctl.hcxt = so->batchctx;
	so->seen = hash_create("gpu_ivfpq seen TIDs", 256, &hctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);

	if (scan->numberOfOrderBys > 0 && !(scan->orderByData[0].sk_flags & SK_ISNULL))
	{
		int			dim;
		ArrayType  *arr = DatumGetArrayTypePCopy(scan->orderByData[0].sk_argument);
		const float *q = GpuIvfpqArrayVector(arr, &dim, "query vector");

		if (so->meta.dimensions != 0 && (uint32) dim != so->meta.dimensions)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("query vector has %d dimensions, the index \"%s\" has %u",
							dim, RelationGetRelationName(scan->indexRelation), so->meta.dimensions)));
		so->query = (float *) palloc(sizeof(float) * Max(dim, 1));
		memcpy(so->query, q, sizeof(float) * dim);
		so->null_query = false;
	}
	MemoryContextSwitchTo(old);
}

/* Collects the entries of the probed lists into topk (all of them when topk is NULL). */
static void
CollectCandidates(IndexScanDesc scan, gpuivfpq::TopK *topk, int64 **all, int *nall)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	int			m = so->meta.trained ? so->meta.m : 0;
	int			esz = GpuIvfpqEntrySize(m);
	int			cap = 0;

	if (topk != NULL)
	{
		so->entries_seen = GpuIvfpqRankLists(scan->indexRelation, &so->meta, so->dir, so->model,
											 so->prepared, so->probes, topk);
		return;
	}
	so->entries_seen = 0;
	for (int list = 0; list < so->probes; list++)
		GpuIvfpqWalkList(scan->indexRelation, so->dir[list].head, m, [&](const char *ent, int n) {
			so->entries_seen += n;
			if (*nall + n > cap)
			{
				cap = Max(cap * 2, *nall + n);
				*all = *all ? (int64 *) repalloc_huge(*all, sizeof(int64) * cap)
					: (int64 *) palloc_extended(sizeof(int64) * cap, MCXT_ALLOC_HUGE);
			}
			for (int i = 0; i < n; i++)
			{
				ItemPointerData tid;

				memcpy(&tid, ent + (Size) i * esz, GPU_IVFPQ_TID_BYTES);
				(*all)[(*nall)++] = GpuIvfpqTidToLabel(&tid);
			}
		});
}

/*
 * Re-ranks the candidate TIDs not seen before: fetches each row visible to
 * the scan's snapshot, computes its exact distance, and appends it to the
 * results. Rows no longer visible are skipped.
 */
static void
Rerank(IndexScanDesc scan, int64 *labels, int n)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	int			dim = so->meta.dimensions;

	EnsureHeapAccess(scan);
	/* Labels sort as (block, offset): fetching in that order reads the heap sequentially. */
	std::sort(labels, labels + n);
	so->results = (ScanResult *) MemoryContextAllocHuge(so->batchctx, sizeof(ScanResult) * Max(n, 1));
	so->nresults = 0;
	so->next = 0;
	for (int i = 0; i < n; i++)
	{
		ItemPointerData tid;
		bool		found;
		int			vdim;
		const float *v;

		GpuIvfpqLabelToTid(labels[i], &tid);
		hash_search(so->seen, &tid, HASH_ENTER, &found);
		if (found)
			continue;
		so->reranked++;

		v = GpuIvfpqHeapFetchVector(&so->hf, &tid, &vdim);
		if (v != NULL && (so->null_query || vdim == dim))
		{
			so->results[so->nresults].dist = so->null_query ? get_float8_nan()
				: GpuIvfpqExactDistance(so->metric, so->query, v, dim);
			so->results[so->nresults].tid = tid;
			so->nresults++;
		}
		CHECK_FOR_INTERRUPTS();
	}
	if (!so->null_query)
		std::sort(so->results, so->results + so->nresults, ResultLess);
}

/*
 * One round on the CPU engine: the want best entries of the probed lists by
 * ADC distance, into labels (allocated here, in the batch context).
 */
static void
CpuRound(IndexScanDesc scan, int want, int64 **labels, int *nlabels)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	gpuivfpq::TopK *topk = NULL;

	if (!so->query_prepared)
	{
		so->model = GpuIvfpqGetModel(scan->indexRelation, &so->meta);
		so->query_prepared = true;
		GpuIvfpqGuard("query preparation", [&] {
			if (so->prepared == NULL)
				so->prepared = new gpuivfpq::IvfPqQuery();
			so->model->prepare_query(so->query, so->meta.lists, *so->prepared);
		});
	}
	GpuIvfpqCountCpuQuery();
	so->cpu_rounds++;
	GpuIvfpqGuard("k-selection", [&] { topk = new gpuivfpq::TopK(want); });
	PG_TRY();
	{
		CollectCandidates(scan, topk, NULL, NULL);
	}
	PG_CATCH();
	{
		delete topk;
		PG_RE_THROW();
	}
	PG_END_TRY();
	so->codes_scanned += so->entries_seen;
	*labels = (int64 *) palloc(sizeof(int64) * Max((int) topk->size(), 1));
	*nlabels = 0;
	GpuIvfpqGuard("k-selection", [&] {
		std::vector<gpuivfpq::Neighbor> best = topk->take_sorted();

		for (const auto &nb : best)
			(*labels)[(*nlabels)++] = nb.label;
		delete topk;
	});
}

/*
 * Produces the next batch of results. Round 1 probes gpu_ivfpq.probes lists
 * and re-ranks the gpu_ivfpq.rerank best ADC candidates. Each later round
 * doubles the candidates, and doubles the probed lists once the probed lists
 * have no unseen entries left, until gpu_ivfpq.max_scan_tuples rows were
 * re-ranked or every entry was seen. Returns false when nothing is left.
 */
static bool
NextBatch(IndexScanDesc scan)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;

	while (!so->exhausted)
	{
		MemoryContext old = MemoryContextSwitchTo(so->batchctx);
		int64	   *labels = NULL;
		int			nlabels = 0;

		if (!so->meta.trained || so->null_query || so->meta.dimensions == 0)
		{
			/* No quantizers (or no distances): one exact pass over every entry. */
			so->probes = so->meta.lists;
			CollectCandidates(scan, NULL, &labels, &nlabels);
			so->exhausted = true;
		}
		else
		{
			int			lists = (int) so->meta.lists;

			if (!so->started)
			{
				so->probes = Min(gpu_ivfpq_probes, lists);
				so->candidates = gpu_ivfpq_rerank;
			}
			else
			{
				if (so->reranked >= gpu_ivfpq_max_scan_tuples ||
					(so->probes >= lists && so->reranked >= so->entries_seen))
				{
					so->exhausted = true;
					MemoryContextSwitchTo(old);
					break;
				}
				if (so->reranked >= so->entries_seen)
					so->probes = Min(so->probes * 2, lists);
				so->candidates = (int) Min((int64) so->candidates * 2, (int64) INT_MAX / 4);
			}
			{
				int			want = (int) Min((int64) so->candidates + so->reranked,
											 (int64) gpu_ivfpq_max_scan_tuples + so->candidates);
				instr_time	start,
							end;

				INSTR_TIME_SET_CURRENT(start);
				nlabels = -1;
				if (GpuIvfpqServiceWanted())
				{
					int			batch = 0;

					labels = (int64 *) palloc(sizeof(int64) * want);
					nlabels = GpuIvfpqServiceSearch(scan->indexRelation, &so->meta, so->query, want,
													so->probes, labels, &batch);
					if (nlabels >= 0)
					{
						/*
						 * Fewer than asked: the probed lists hold no more entries
						 * (the CPU path's entries_seen); else at least one more.
						 */
						so->entries_seen = nlabels < want ? nlabels : (int64) nlabels + 1;
						so->gpu_rounds++;
						so->gpu_batch_sum += batch;
					}
				}
				if (nlabels < 0)
					CpuRound(scan, want, &labels, &nlabels);
				INSTR_TIME_SET_CURRENT(end);
				INSTR_TIME_ACCUM_DIFF(so->adc_time, end, start);
			}
		}
		so->started = true;
		MemoryContextSwitchTo(old);
		{
			instr_time	start,
						end;

			INSTR_TIME_SET_CURRENT(start);
			Rerank(scan, labels, nlabels);
			INSTR_TIME_SET_CURRENT(end);
			INSTR_TIME_ACCUM_DIFF(so->rerank_time, end, start);
		}
		if (so->nresults > 0)
			return true;
	}
	return false;
}

/* amgettuple: the next row in distance order. */
bool
gpuivfpqgettuple(IndexScanDesc scan, ScanDirection dir)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	ScanResult *r;

	if (!ScanDirectionIsForward(dir))
		elog(ERROR, "gpu_ivfpq only supports forward scans");
	if (so->next >= so->nresults && !NextBatch(scan))
		return false;
	r = &so->results[so->next++];
	scan->xs_heaptid = r->tid;
	scan->xs_recheck = false;
	scan->xs_recheckorderby = false;
	if (scan->numberOfOrderBys > 0)
	{
		scan->xs_orderbyvals[0] = Float8GetDatum(r->dist);
		scan->xs_orderbynulls[0] = so->null_query;
	}
	return true;
}

/* amendscan */
void
gpuivfpqendscan(IndexScanDesc scan)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;

	if (so->started && so->gpu_rounds > 0)
		elog(DEBUG1, "gpu_ivfpq scan of \"%s\" (GPU service: %d of %d rounds, mean batch %.1f): %d lists probed, candidates in %.3f ms, %lld rows re-ranked in %.3f ms",
			 RelationGetRelationName(scan->indexRelation), so->gpu_rounds,
			 so->gpu_rounds + so->cpu_rounds, (double) so->gpu_batch_sum / so->gpu_rounds,
			 so->probes, INSTR_TIME_GET_MILLISEC(so->adc_time),
			 (long long) so->reranked, INSTR_TIME_GET_MILLISEC(so->rerank_time));
	else if (so->started)
		elog(DEBUG1, "gpu_ivfpq scan of \"%s\" (CPU engine): %d lists probed, %lld codes ranked in %.3f ms, %lld rows re-ranked in %.3f ms",
			 RelationGetRelationName(scan->indexRelation), so->probes,
			 (long long) so->codes_scanned, INSTR_TIME_GET_MILLISEC(so->adc_time),
			 (long long) so->reranked, INSTR_TIME_GET_MILLISEC(so->rerank_time));
	if (so->heap_open)
		GpuIvfpqHeapFetchEnd(&so->hf);
	MemoryContextDelete(so->scanctx);
	scan->opaque = NULL;
}
