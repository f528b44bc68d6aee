// The batch functions' re-rank from the heap over parallel workers
// (parallel_rerank.h): the leader and its workers take the chunk's queries
// from a shared counter (groups of GpuIvfpqRerankGroup where candidates are
// ranked by bounds, else one at a time), each re-ranks its queries' candidates
// from the rows visible to the leader's snapshot (the one re-rank module,
// rerank.h) and writes their k best into the segment; the leader copies them
// out in query order.
#include "functions/parallel_rerank.h"
#include "common/parallel_text.h"

extern "C" {
#include "access/parallel.h"
#include "access/relation.h"
#include "access/table.h"
#include "miscadmin.h"
#include "optimizer/cost.h"
#include "pgstat.h"
#include "port/atomics.h"
#include "storage/shm_toc.h"
#include "tcop/tcopprot.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/snapmgr.h"
}

#define RERANK_KEY_SHARED UINT64CONST(0xB1A7C4E2D0000001)
#define RERANK_KEY_QUERY_TEXT UINT64CONST(0xB1A7C4E2D0000002)
#define RERANK_KEY_USAGE UINT64CONST(0xB1A7C4E2D0000003)


/* The segment: this header, then the arrays at the offsets it gives. */
typedef struct RerankShared
{
	Oid			heaprelid;
	Oid			indexrelid;
	int			metric;
	int			dim;
	int			k;
	int			want;
	int			dists;			/* GpuIvfpqAnswerDists: LOWER or NONE */
	int64		nq;
	pg_atomic_uint64 next;		/* the next query to take */
	pg_atomic_uint64 fetched;	/* rows fetched by bound, all participants */
	Size		queries_at;		/* nq x dim floats */
	Size		labels_at;		/* nq x want */
	Size		lower_at;		/* nq x want */
	Size		counts_at;		/* nq */
	Size		hits_at;		/* nq x k */
	Size		nhits_at;		/* nq */
} RerankShared;

extern "C" PGDLLEXPORT void gpu_ivfpq_rerank_main(dsm_segment *seg, shm_toc *toc);

template <typename T>
static T *
At(RerankShared *s, Size offset)
{
	return (T *) ((char *) s + offset);
}

/*
 * Takes queries from the counter until none is left (GpuIvfpqRerankGroup of
 * them at a time where their candidates are ranked by bounds, else one);
 * hits: room for want + 1.
 */
static void
RerankTake(RerankShared *s, GpuIvfpqHeapFetch *hf, GpuIvfpqHit *hits)
{
	GpuIvfpqRerankSpec spec;
	const float *queries = At<const float>(s, s->queries_at);
	int64	   *labels = At<int64>(s, s->labels_at);
	const double *lower = At<const double>(s, s->lower_at);
	const int  *counts = At<const int>(s, s->counts_at);
	GpuIvfpqHit *out = At<GpuIvfpqHit>(s, s->hits_at);
	int64	   *nhits = At<int64>(s, s->nhits_at);
	uint64		group = s->dists == GPU_IVFPQ_DISTS_LOWER ? (uint64) GpuIvfpqRerankGroup(s->want) : 1;

	memset(&spec, 0, sizeof(spec));
	spec.metric = s->metric;
	spec.dim = s->dim;
	for (;;)
	{
		uint64		i = pg_atomic_fetch_add_u64(&s->next, group);
		int64		nh;
		int64		fetched = 0;
		int			n;

		if (i >= (uint64) s->nq)
			break;
		if (s->dists == GPU_IVFPQ_DISTS_LOWER)
		{
			int64		gn = Min((int64) group, s->nq - (int64) i);

			GpuIvfpqRerankBoundedBatch(hf, &spec, queries + i * s->dim, gn, labels + i * s->want,
									   lower + i * s->want, s->want, counts + i, s->k, out + i * s->k,
									   nhits + i, &fetched);
			pg_atomic_fetch_add_u64(&s->fetched, (uint64) fetched);
			continue;
		}
		n = Min(Max(counts[i], 0), s->want);
		spec.query = queries + i * s->dim;
		nh = GpuIvfpqRerank(hf, &spec, labels + i * s->want, n, hits, NULL);
		nh = Min(nh, (int64) s->k);
		memcpy(out + i * s->k, hits, sizeof(GpuIvfpqHit) * nh);
		nhits[i] = nh;
		CHECK_FOR_INTERRUPTS();
	}
}

/* A parallel worker: re-ranks the queries it takes. */
void
gpu_ivfpq_rerank_main(dsm_segment *seg, shm_toc *toc)
{
	RerankShared *s = (RerankShared *) shm_toc_lookup(toc, RERANK_KEY_SHARED, false);
	Relation	heap;
	Relation	index;
	GpuIvfpqHeapFetch hf;
	GpuIvfpqHit *hits;

	GpuIvfpqParallelTextRestore(toc, RERANK_KEY_QUERY_TEXT);
	GpuIvfpqParallelUsageStart();
	/* The leader holds these locks too: the workers join its lock group. */
	heap = table_open(s->heaprelid, AccessShareLock);
	index = index_open(s->indexrelid, AccessShareLock);
	/* The leader's snapshot, restored as this worker's active one. */
	GpuIvfpqHeapFetchBegin(&hf, heap, index, GetActiveSnapshot());
	hits = (GpuIvfpqHit *) palloc_extended(sizeof(GpuIvfpqHit) * ((Size) s->want + 1), MCXT_ALLOC_HUGE);
	RerankTake(s, &hf, hits);
	pfree(hits);
	GpuIvfpqHeapFetchEnd(&hf);
	index_close(index, AccessShareLock);
	table_close(heap, AccessShareLock);
	GpuIvfpqParallelUsageEnd(toc, RERANK_KEY_USAGE);
}

bool
GpuIvfpqRerankParallel(GpuIvfpqBatchSearch *bs, const float *queries, int64 nq, GpuIvfpqAnswerDists dists,
					   GpuIvfpqHit *out, int64 *nhits)
{
	int			request;
	ParallelContext *pcxt;
	RerankShared *s;
	Size		bytes;
	RerankShared layout;

	if (dists != GPU_IVFPQ_DISTS_LOWER && dists != GPU_IVFPQ_DISTS_NONE)
		return false;
	/* Not from a parallel worker, nor in a transaction that cannot start workers. */
	if (IsInParallelMode() || !IsUnderPostmaster || RelationUsesLocalBuffers(bs->heap))
		return false;
	/*
	 * An expression index's rows are its expression of each fetched row:
	 * user functions, which need not be parallel safe (they may set a
	 * setting or read a temporary table), so such an index re-ranks in this
	 * backend alone.
	 */
	if (RelationGetIndexExpressions(bs->index) != NIL)
		return false;
	request = (int) Min((int64) max_parallel_workers_per_gather, nq / GPU_IVFPQ_RERANK_PER_PARTICIPANT - 1);
	/* The table's parallel_workers, where set, as for its scans (0: none). */
	if (RelationGetParallelWorkers(bs->heap, -1) >= 0)
		request = Min(request, RelationGetParallelWorkers(bs->heap, -1));
	if (request <= 0)
		return false;

	memset(&layout, 0, sizeof(layout));
	bytes = MAXALIGN(sizeof(RerankShared));
	layout.queries_at = bytes;
	bytes = add_size(bytes, MAXALIGN(mul_size(mul_size((Size) nq, (Size) bs->dim), sizeof(float))));
	layout.labels_at = bytes;
	bytes = add_size(bytes, MAXALIGN(mul_size(mul_size((Size) nq, (Size) bs->want), sizeof(int64))));
	layout.lower_at = bytes;	/* the bounds, for LOWER only */
	if (dists == GPU_IVFPQ_DISTS_LOWER)
		bytes = add_size(bytes, MAXALIGN(mul_size(mul_size((Size) nq, (Size) bs->want), sizeof(double))));
	layout.counts_at = bytes;
	bytes = add_size(bytes, MAXALIGN(mul_size((Size) nq, sizeof(int))));
	layout.hits_at = bytes;
	bytes = add_size(bytes, MAXALIGN(mul_size(mul_size((Size) nq, (Size) bs->k), sizeof(GpuIvfpqHit))));
	layout.nhits_at = bytes;
	bytes = add_size(bytes, MAXALIGN(mul_size((Size) nq, sizeof(int64))));

	EnterParallelMode();
	pcxt = CreateParallelContext("gpu_ivfpq", "gpu_ivfpq_rerank_main", request);
	shm_toc_estimate_chunk(&pcxt->estimator, bytes);
	shm_toc_estimate_keys(&pcxt->estimator, 1);
	GpuIvfpqParallelTextEstimate(pcxt);
	GpuIvfpqParallelUsageEstimate(pcxt);
	InitializeParallelDSM(pcxt);
	if (pcxt->seg == NULL)
	{
		/* No dynamic shared memory to be had: the caller re-ranks serially. */
		DestroyParallelContext(pcxt);
		ExitParallelMode();
		return false;
	}
	s = (RerankShared *) shm_toc_allocate(pcxt->toc, bytes);
	*s = layout;
	s->heaprelid = RelationGetRelid(bs->heap);
	s->indexrelid = RelationGetRelid(bs->index);
	s->metric = bs->metric;
	s->dim = bs->dim;
	s->k = bs->k;
	s->want = bs->want;
	s->dists = (int) dists;
	s->nq = nq;
	pg_atomic_init_u64(&s->next, 0);
	pg_atomic_init_u64(&s->fetched, 0);
	memcpy(At<float>(s, s->queries_at), queries, sizeof(float) * (Size) nq * bs->dim);
	memcpy(At<int64>(s, s->labels_at), bs->labels, sizeof(int64) * (Size) nq * bs->want);
	if (dists == GPU_IVFPQ_DISTS_LOWER)
		memcpy(At<double>(s, s->lower_at), bs->exact, sizeof(double) * (Size) nq * bs->want);
	memcpy(At<int>(s, s->counts_at), bs->counts, sizeof(int) * (Size) nq);
	shm_toc_insert(pcxt->toc, RERANK_KEY_SHARED, s);
	GpuIvfpqParallelTextStore(pcxt, RERANK_KEY_QUERY_TEXT);
	GpuIvfpqParallelUsageStore(pcxt, RERANK_KEY_USAGE);
	LaunchParallelWorkers(pcxt);
	if (pcxt->nworkers_launched == 0)
	{
		DestroyParallelContext(pcxt);
		ExitParallelMode();
		return false;
	}
	/* The leader takes queries too, with its own heap access. */
	RerankTake(s, &bs->hf, bs->hits);
	/* Raises a worker's error, if any. */
	WaitForParallelWorkersToFinish(pcxt);
	GpuIvfpqParallelUsageAccum(pcxt, RERANK_KEY_USAGE);
	memcpy(nhits, At<int64>(s, s->nhits_at), sizeof(int64) * (Size) nq);
	for (int64 i = 0; i < nq; i++)
		memcpy(out + i * bs->k, At<GpuIvfpqHit>(s, s->hits_at) + i * bs->k, sizeof(GpuIvfpqHit) * nhits[i]);
	bs->fetched += (int64) pg_atomic_read_u64(&s->fetched);
	elog(DEBUG1, "gpu_ivfpq batch search on \"%s\": %lld queries re-ranked from the table with %d parallel workers",
		 RelationGetRelationName(bs->index), (long long) nq, pcxt->nworkers_launched);
	DestroyParallelContext(pcxt);
	ExitParallelMode();
	return true;
}
