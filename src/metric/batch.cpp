// gpu_metric_range_batch and gpu_metric_knn_batch: many queries of a
// gpu_metric index in one call, searched in parallel by the engine (or a
// GPU service, through the same search call as the scans), answered with
// the rows visible to the caller's snapshot, by (distance, heap TID).
#include <algorithm>

#include "metric/am.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(gpu_metric_range_batch);
PG_FUNCTION_INFO_V1(gpu_metric_knn_batch);
}

/* Queries per engine call at most: cancels are checked between them. */
#define METRIC_BATCH_CHUNK	256
/* The answers one engine call may hold at the most: work_mem, or this when larger. */
#define METRIC_BATCH_MIN_BUDGET ((double) (64 * 1024 * 1024))

/* A batch call's queries, its table access and its output. */
typedef struct MetricBatch
{
	const char *function;
	Relation	index;
	Relation	heap;
	int64		nq;				/* queries given, NULLs included */
	int64		nsearched;		/* non-NULL ones */
	int32	   *ordinal;		/* of each searched query: its position in the array, from 1 */
	uint32	   *cps;			/* the searched queries' code points, back to back */
	uint64	   *offsets;		/* nsearched + 1 */
	Snapshot	snapshot;
	IndexFetchTableData *fetch;
	TupleTableSlot *slot;
	Tuplestorestate *store;
	TupleDesc	desc;
	uint64		evaluations;
	uint64		live;
	bool		on_gpu;
} MetricBatch;

/* Opens the index and its table, checks the caller may read it, and decodes the queries. */
static void
BatchBegin(MetricBatch *b, FunctionCallInfo fcinfo, const char *function)
{
	ArrayType  *queries = PG_GETARG_ARRAYTYPE_P(1);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Datum	   *elems;
	bool	   *nulls;
	int			nelems;
	Size		cap;

	memset(b, 0, sizeof(*b));
	b->function = function;
	InitMaterializedSRF(fcinfo, 0);
	b->store = rsinfo->setResult;
	b->desc = rsinfo->setDesc;
	GpuIvfpqOpenIndexChecked(PG_GETARG_OID(0), "gpu_metric", function, true, &b->index, &b->heap);

	deconstruct_array(queries, TEXTOID, -1, false, TYPALIGN_INT, &elems, &nulls, &nelems);
	b->nq = nelems;
	b->ordinal = (int32 *) palloc(sizeof(int32) * Max(nelems, 1));
	b->offsets = (uint64 *) palloc(sizeof(uint64) * (nelems + 1));
	cap = 1024;
	b->cps = (uint32 *) palloc(sizeof(uint32) * cap);
	b->offsets[0] = 0;
	for (int i = 0; i < nelems; i++)
	{
		int			len;
		int			ncp;
		char	   *utf8;
		uint32	   *cps;

		/* A NULL query has no answers, as a NULL compares with nothing. */
		if (nulls[i])
			continue;
		utf8 = GpuMetricDatumUtf8(elems[i], &len);
		cps = GpuMetricCodePoints(utf8, len, &ncp);
		if (b->offsets[b->nsearched] + ncp > cap)
		{
			cap = Max(cap * 2, b->offsets[b->nsearched] + ncp);
			b->cps = (uint32 *) repalloc_huge(b->cps, sizeof(uint32) * cap);
		}
		memcpy(b->cps + b->offsets[b->nsearched], cps, sizeof(uint32) * ncp);
		b->ordinal[b->nsearched] = i + 1;
		b->offsets[b->nsearched + 1] = b->offsets[b->nsearched] + ncp;
		b->nsearched++;
		pfree(cps);
	}
	b->snapshot = GetActiveSnapshot();
	b->fetch = table_index_fetch_begin(b->heap);
	b->slot = table_slot_create(b->heap, NULL);
}

/* Whether the row at *tid is visible to the call's snapshot; *tid becomes its own TID (GpuMetricRowVisible). */
static bool
RowVisible(MetricBatch *b, ItemPointer tid)
{
	return GpuMetricRowVisible(b->fetch, b->snapshot, b->slot, tid);
}

/* A visible row of a query's hits, by its own TID (a HOT chain's visible member). */
typedef struct VisibleHit
{
	ItemPointerData tid;
	uint32		id;
	uint32		dist;
} VisibleHit;

/*
 * The visible rows of a query's nh hits (sorted by distance) into out (room
 * for nh), by (distance, the row's own TID): the index holds a HOT chain's
 * root TID, and the visible member (RowVisible) may lie elsewhere, so each
 * group of equal distances is ordered after its rows are resolved, as ctid
 * shows them. With limit >= 0, stops after the group in which limit rows
 * are reached (the whole group is resolved: its order decides which are
 * kept). Returns how many are in out.
 */
static int64
VisibleHits(MetricBatch *b, const GpuMetricCached *entry, const gpuivfpq::MetricHit *hits, int64 nh,
			int64 limit, VisibleHit *out)
{
	int64		n = 0;

	for (int64 g0 = 0, g1; g0 < nh && (limit < 0 || n < limit); g0 = g1)
	{
		int64		start = n;

		for (g1 = g0; g1 < nh && hits[g1].dist == hits[g0].dist; g1++)
		{
			ItemPointerData tid = entry->tids[hits[g1].id];

			if (RowVisible(b, &tid))
			{
				out[n].tid = tid;
				out[n].id = hits[g1].id;
				out[n].dist = hits[g1].dist;
				n++;
			}
			if ((g1 & 1023) == 1023)
				CHECK_FOR_INTERRUPTS();
		}
		/* In place, no allocation, a comparator that cannot fail: safe beside ereport. */
		std::sort(out + start, out + n, [](const VisibleHit &x, const VisibleHit &y) {
			return ItemPointerCompare((ItemPointer) &x.tid, (ItemPointer) &y.tid) < 0;
		});
	}
	return n;
}

/* Emits one answer: (query, [rank,] tid, word, distance). */
static void
EmitRow(MetricBatch *b, GpuMetricCached *entry, int64 q, int rank, const ItemPointerData *tid,
		uint32 id, uint32 dist)
{
	Datum		values[5];
	bool		nulls[5] = {false, false, false, false, false};
	int			col = 0;
	const char *utf8 = entry->bytes + entry->offsets[id];
	int			len = (int) (entry->offsets[id + 1] - entry->offsets[id]);
	char	   *word = pg_any_to_server(utf8, len, PG_UTF8);
	ItemPointer out = (ItemPointer) palloc(sizeof(ItemPointerData));

	*out = *tid;
	values[col++] = Int32GetDatum(b->ordinal[q]);
	if (rank > 0)
		values[col++] = Int32GetDatum(rank);
	values[col++] = PointerGetDatum(out);
	/* pg_any_to_server returns the bytes as they were when no conversion is needed. */
	values[col++] = PointerGetDatum(word == utf8 ? cstring_to_text_with_len(utf8, len) : cstring_to_text(word));
	values[col++] = Int32GetDatum((int32) dist);
	tuplestore_putvalues(b->store, b->desc, values, nulls);
}

/* Ends the table access, reports the work at DEBUG1 and closes the relations. */
static void
BatchEnd(MetricBatch *b)
{
	table_index_fetch_end(b->fetch);
	ExecDropSingleTupleTableSlot(b->slot);
	elog(DEBUG1, "%s on \"%s\": %lld queries, %llu distance evaluations of %llu live objects each (%.2f%% of brute force)%s",
		 b->function, RelationGetRelationName(b->index), (long long) b->nsearched,
		 (unsigned long long) b->evaluations, (unsigned long long) b->live,
		 b->nsearched > 0 && b->live > 0 ? 100.0 * b->evaluations / ((double) b->live * b->nsearched) : 0.0,
		 b->on_gpu ? ", on the GPU" : "");
	table_close(b->heap, AccessShareLock);
	relation_close(b->index, AccessShareLock);
}

/*
 * How many queries, from query q0 on, the next engine call takes: at most
 * METRIC_BATCH_CHUNK, and no more than whose answers would fit the budget
 * (work_mem or METRIC_BATCH_MIN_BUDGET, the larger) if each query matched
 * every object of the index, as a wide radius does, or a k-NN whose k-th
 * distance ties with every word (equal words, or an empty query among
 * words of one length); one at the least. An engine call holds all its
 * answers at once (and the engine its own copy of them): without this a
 * chunk of 256 such queries over a million words asked for 2 GB.
 */
static int64
BatchChunk(MetricBatch *b, int64 q0)
{
	GpuMetricMetaPageData meta;
	GpuMetricCached *entry = GpuMetricGetCached(b->index, &meta);
	double		budget = Max((double) work_mem * 1024.0, METRIC_BATCH_MIN_BUDGET);
	double		per_query = (double) Max(entry->objects, 1) * sizeof(gpuivfpq::MetricHit);
	int64		n = (int64) Min((double) METRIC_BATCH_CHUNK, Max(1.0, budget / per_query));

	return Min(n, b->nsearched - q0);
}

/*
 * Searches n of the batch's queries (which: their numbers among the
 * searched ones) in one call, on the engine's threads, into found (query j
 * of found is which[j]): within radius param (range), or the param nearest
 * with their whole distance group (knn, GpuMetricSearchNearest). Returns
 * the cached index it searched: object ids stay valid for the whole call.
 */
static GpuMetricCached *
SearchQueries(MetricBatch *b, const int64 *which, int64 n, bool knn, uint32 param, GpuMetricHits *found)
{
	GpuMetricMetaPageData meta;
	GpuMetricCached *entry = GpuMetricGetCached(b->index, &meta);
	uint64	   *offsets = (uint64 *) palloc(sizeof(uint64) * (n + 1));
	uint32	   *cps;

	offsets[0] = 0;
	for (int64 j = 0; j < n; j++)
		offsets[j + 1] = offsets[j] + (b->offsets[which[j] + 1] - b->offsets[which[j]]);
	cps = (uint32 *) palloc_extended(sizeof(uint32) * Max(offsets[n], 1), MCXT_ALLOC_HUGE);
	for (int64 j = 0; j < n; j++)
		memcpy(cps + offsets[j], b->cps + b->offsets[which[j]], sizeof(uint32) * (offsets[j + 1] - offsets[j]));
	if (knn)
		GpuMetricSearchNearest(b->index, entry, &meta, cps, offsets, n, param, GpuMetricSearchThreads(), found);
	else
		GpuMetricSearch(b->index, entry, &meta, false, cps, offsets, n, param, NULL, GpuMetricSearchThreads(),
						found);
	b->evaluations += found->evaluations;
	b->live = found->live;
	b->on_gpu |= found->on_gpu;
	return entry;
}

/*
 * gpu_metric_range_batch(index, queries, radius): for each query, every
 * visible row whose word is within radius edits, by (distance, heap TID).
 */
Datum
gpu_metric_range_batch(PG_FUNCTION_ARGS)
{
	int32		radius = PG_GETARG_INT32(2);
	MetricBatch b;
	MemoryContext chunkctx;

	GpuMetricCheckRadius(radius);
	BatchBegin(&b, fcinfo, "gpu_metric_range_batch");
	chunkctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_metric batch chunk", ALLOCSET_DEFAULT_SIZES);
	for (int64 q0 = 0, n = 0; q0 < b.nsearched; q0 += n)
	{
		MemoryContext old;
		int64	   *which;
		GpuMetricHits found;
		GpuMetricCached *entry;

		n = BatchChunk(&b, q0);
		old = MemoryContextSwitchTo(chunkctx);
		which = (int64 *) palloc(sizeof(int64) * n);
		for (int64 j = 0; j < n; j++)
			which[j] = q0 + j;
		entry = SearchQueries(&b, which, n, false, (uint32) radius, &found);
		for (int64 j = 0; j < n; j++)
		{
			gpuivfpq::MetricHit *hits = found.hits + found.offsets[j];
			int64		nh = (int64) (found.offsets[j + 1] - found.offsets[j]);

			VisibleHit *vis = (VisibleHit *) palloc_extended(sizeof(VisibleHit) * Max(nh, 1), MCXT_ALLOC_HUGE);
			int64		nv;

			GpuMetricSortByTid(entry->tids, hits, nh);
			nv = VisibleHits(&b, entry, hits, nh, -1, vis);
			for (int64 h = 0; h < nv; h++)
				EmitRow(&b, entry, which[j], 0, &vis[h].tid, vis[h].id, vis[h].dist);
			pfree(vis);
			CHECK_FOR_INTERRUPTS();
		}
		MemoryContextSwitchTo(old);
		MemoryContextReset(chunkctx);
	}
	BatchEnd(&b);
	PG_RETURN_VOID();
}

/*
 * gpu_metric_knn_batch(index, queries, k): for each query, the k nearest
 * visible rows, by (distance, heap TID), rank from 1. The engine ranks
 * live objects; rows not visible to the snapshot (deleted, or not yet
 * committed) are skipped, so a query whose nearest are not all visible is
 * searched again for more, until k are found or none are left.
 */
Datum
gpu_metric_knn_batch(PG_FUNCTION_ARGS)
{
	int32		k = PG_GETARG_INT32(2);
	MetricBatch b;
	MemoryContext chunkctx;
	MemoryContext roundctx;

	if (k < 1 || k > GPU_METRIC_BATCH_MAX_K)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("k must be between 1 and %d, not %d", GPU_METRIC_BATCH_MAX_K, k),
				 errhint("Ask for at most %d nearest words a query; gpu_metric_range_batch returns every word within a radius.",
						 GPU_METRIC_BATCH_MAX_K)));
	BatchBegin(&b, fcinfo, "gpu_metric_knn_batch");
	chunkctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_metric batch chunk", ALLOCSET_DEFAULT_SIZES);
	/* Not under chunkctx: a reset deletes a context's children. */
	roundctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_metric batch round", ALLOCSET_DEFAULT_SIZES);
	for (int64 q0 = 0, n = 0; q0 < b.nsearched; q0 += n)
	{
		MemoryContext old;
		ItemPointerData *tids;
		uint32	   *ids;
		uint32	   *dists;
		int		   *kept;
		int64	   *which;
		int64		npending;
		int64		want = k;
		GpuMetricCached *entry = NULL;

		n = BatchChunk(&b, q0);
		npending = n;
		old = MemoryContextSwitchTo(chunkctx);
		/* Each query's answers (k at most), kept until the chunk is done. */
		tids = (ItemPointerData *) palloc(sizeof(ItemPointerData) * n * k);
		ids = (uint32 *) palloc(sizeof(uint32) * n * k);
		dists = (uint32 *) palloc(sizeof(uint32) * n * k);
		kept = (int *) palloc0(sizeof(int) * n);
		which = (int64 *) palloc(sizeof(int64) * n);
		for (int64 j = 0; j < n; j++)
			which[j] = q0 + j;
		while (npending > 0)
		{
			GpuMetricHits found;
			int64		still = 0;
			int64		next_want = want * 2;

			MemoryContextSwitchTo(roundctx);
			entry = SearchQueries(&b, which, npending, true, (uint32) Min(want, (int64) PG_UINT32_MAX), &found);
			for (int64 j = 0; j < npending; j++)
			{
				int64		i = which[j] - q0;
				gpuivfpq::MetricHit *hits = found.hits + found.offsets[j];
				int64		nh = (int64) (found.offsets[j + 1] - found.offsets[j]);

				VisibleHit *vis = (VisibleHit *) palloc_extended(sizeof(VisibleHit) * Max(nh, 1), MCXT_ALLOC_HUGE);
				int64		nv;

				GpuMetricSortByTid(entry->tids, hits, nh);
				nv = VisibleHits(&b, entry, hits, nh, k, vis);
				kept[i] = (int) Min(nv, (int64) k);
				for (int r = 0; r < kept[i]; r++)
				{
					tids[i * k + r] = vis[r].tid;
					ids[i * k + r] = vis[r].id;
					dists[i * k + r] = vis[r].dist;
				}
				/*
				 * Done with k rows, or with every live object ranked (fewer
				 * than asked for); else the next round reaches past the
				 * rows ranked here, for as many as are missing.
				 */
				if (kept[i] < k && nh >= want)
				{
					which[still++] = which[j];
					next_want = Max(next_want, nh + (k - kept[i]));
				}
				CHECK_FOR_INTERRUPTS();
			}
			npending = still;
			want = next_want;
			MemoryContextSwitchTo(chunkctx);
			MemoryContextReset(roundctx);
		}
		/* In query order; object ids are the same in every round's copy of the index. */
		for (int64 i = 0; i < n; i++)
			for (int r = 0; r < kept[i]; r++)
				EmitRow(&b, entry, q0 + i, r + 1, &tids[i * k + r], ids[i * k + r], dists[i * k + r]);
		MemoryContextSwitchTo(old);
		MemoryContextReset(chunkctx);
	}
	BatchEnd(&b);
	PG_RETURN_VOID();
}
