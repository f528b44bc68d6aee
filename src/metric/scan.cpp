// Scans of a gpu_metric index, exact. A range predicate (word <% range)
// returns every row within the radius, at once, in heap order (or, with an
// ORDER BY too, by distance). An ORDER BY word <~> query alone streams rows
// by ascending distance, equal distances in heap TID order: k-NN rounds of
// the engine with a doubling k, each returning the distance groups it has
// complete, so that LIMIT k works for any k. The search itself is the
// engine's (GpuMetricSearch), on the backend's restored copy of the index.
#include <algorithm>

#include "metric/am.h"
#include "common/guard.h"

extern "C" {
#include "nodes/tidbitmap.h"
}

/* Neighbours the first k-NN round asks for: a LIMIT of 10 or so in one round. */
#define GPU_METRIC_FIRST_K	16
/* How much each next k-NN round asks for more. */
#define GPU_METRIC_K_GROWTH	4

/* A range predicate of the scan. */
typedef struct MetricRange
{
	uint32	   *cps;
	int			ncp;
	int32		radius;
} MetricRange;

typedef struct GpuMetricScanOpaqueData
{
	MemoryContext scanctx;		/* lives as long as the scan */
	MemoryContext rescanctx;	/* the keys: reset by each rescan */
	MemoryContext roundctx;		/* the current batch of rows: reset by the next */

	/* the keys of the current rescan */
	bool		nomatch;		/* a NULL range: no row matches */
	int			nranges;
	MetricRange *ranges;
	bool		ordered;		/* ORDER BY word <~> query */
	bool		null_order;		/* ... with a NULL query: no distances */
	uint32	   *order_cps;
	int			order_ncp;

	/* the rows to return, and where the scan stands */
	bool		started;
	bool		done;			/* no batch follows the current one */
	ItemPointerData *tids;
	int32	   *dists;
	int64		nresults;
	int64		next;
	int64		k;				/* k-NN: the next round's k */
	uint32		floor;			/* k-NN: every object nearer than this was returned */

	/* ties of an ordered scan are ordered by the rows' own TIDs (ResolveTies) */
	int64		resolved;		/* rows before this one are in their final order */
	IndexFetchTableData *fetch;
	TupleTableSlot *slot;

	/* instrumentation, at DEBUG1 when the scan ends */
	int			rounds;
	uint64		evaluations;
	uint64		live;
} GpuMetricScanOpaqueData;
typedef GpuMetricScanOpaqueData *GpuMetricScanOpaque;

/* ambeginscan */
IndexScanDesc
gpumetricbeginscan(Relation index, int nkeys, int norderbys)
{
	IndexScanDesc scan = RelationGetIndexScan(index, nkeys, norderbys);
	MemoryContext scanctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_metric scan",
												  ALLOCSET_DEFAULT_SIZES);
	GpuMetricScanOpaque so = (GpuMetricScanOpaque) MemoryContextAllocZero(scanctx, sizeof(GpuMetricScanOpaqueData));

	so->scanctx = scanctx;
	so->rescanctx = AllocSetContextCreate(scanctx, "gpu_metric scan keys", ALLOCSET_DEFAULT_SIZES);
	so->roundctx = AllocSetContextCreate(scanctx, "gpu_metric scan rows", ALLOCSET_DEFAULT_SIZES);
	if (norderbys > 0)
	{
		scan->xs_orderbyvals = (Datum *) palloc0(sizeof(Datum) * norderbys);
		scan->xs_orderbynulls = (bool *) palloc(sizeof(bool) * norderbys);
		memset(scan->xs_orderbynulls, true, sizeof(bool) * norderbys);
	}
	scan->opaque = so;
	return scan;
}

/* amrescan: takes the range predicates and the ORDER BY query, and starts over. */
void
gpumetricrescan(IndexScanDesc scan, ScanKey keys, int nkeys, ScanKey orderbys, int norderbys)
{
	GpuMetricScanOpaque so = (GpuMetricScanOpaque) scan->opaque;
	MemoryContext old;

	if (keys && scan->numberOfKeys > 0)
		memmove(scan->keyData, keys, scan->numberOfKeys * sizeof(ScanKeyData));
	if (orderbys && scan->numberOfOrderBys > 0)
		memmove(scan->orderByData, orderbys, scan->numberOfOrderBys * sizeof(ScanKeyData));

	MemoryContextReset(so->rescanctx);
	MemoryContextReset(so->roundctx);
	old = MemoryContextSwitchTo(so->rescanctx);
	so->nomatch = false;
	so->nranges = 0;
	so->ranges = (MetricRange *) palloc(sizeof(MetricRange) * Max(scan->numberOfKeys, 1));
	for (int i = 0; i < scan->numberOfKeys; i++)
	{
		ScanKey		key = &scan->keyData[i];
		MetricRange *range = &so->ranges[so->nranges];
		Datum		word;
		char	   *utf8;
		int			len;

		if (key->sk_strategy != GPU_METRIC_RANGE_STRATEGY)
			elog(ERROR, "gpu_metric: scan key of strategy %d", key->sk_strategy);
		if ((key->sk_flags & SK_ISNULL) || !GpuMetricRangeArg(key->sk_argument, &word, &range->radius))
		{
			/* A NULL range (or word, or radius) holds no word. */
			so->nomatch = true;
			continue;
		}
		utf8 = GpuMetricDatumUtf8(word, &len);
		range->cps = GpuMetricCodePoints(utf8, len, &range->ncp);
		so->nranges++;
	}
	so->ordered = scan->numberOfOrderBys > 0;
	so->null_order = false;
	if (so->ordered)
	{
		ScanKey		key = &scan->orderByData[0];

		if (key->sk_flags & SK_ISNULL)
			so->null_order = true;
		else
		{
			int			len;
			char	   *utf8 = GpuMetricDatumUtf8(key->sk_argument, &len);

			so->order_cps = GpuMetricCodePoints(utf8, len, &so->order_ncp);
		}
	}
	so->started = false;
	so->done = false;
	so->tids = NULL;
	so->dists = NULL;
	so->nresults = 0;
	so->next = 0;
	so->k = GPU_METRIC_FIRST_K;
	so->floor = 0;
	MemoryContextSwitchTo(old);
}

/* Room for n results in the scan's round context. */
static void
AllocResults(GpuMetricScanOpaque so, int64 n)
{
	so->tids = (ItemPointerData *) MemoryContextAllocHuge(so->roundctx, sizeof(ItemPointerData) * Max(n, 1));
	so->dists = (int32 *) MemoryContextAllocHuge(so->roundctx, sizeof(int32) * Max(n, 1));
	so->nresults = 0;
	so->next = 0;
}

/*
 * The distances of n objects to a query, or min(d, bound + 1) (bound:
 * UINT32_MAX for exact ones), into out.
 */
static void
ObjectDistances(GpuMetricCached *entry, const uint32 *cps, int ncp, const uint32 *ids, int64 n,
				uint32 bound, uint32 *out)
{
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "gpu_metric pattern", ALLOCSET_SMALL_SIZES);
	GpuMetricPattern *pattern = GpuIvfpqMakeOwned<GpuMetricPattern>(cxt, "distance", (const uint32_t *) cps,
																	 (size_t) ncp);

	GpuIvfpqGuard("distance", [&] {
		pattern->objects(entry->engine->index(), (const uint32_t *) ids, (size_t) n, bound, (uint32_t *) out);
	});
	MemoryContextDelete(cxt);
}

/*
 * A range scan: the engine searches the range of the smallest radius; the
 * others filter its answers. Rows come in heap order, or by (distance to
 * the ORDER BY query, TID) when the scan is ordered too.
 */
static void
RangeBatch(IndexScanDesc scan)
{
	GpuMetricScanOpaque so = (GpuMetricScanOpaque) scan->opaque;
	Relation	index = scan->indexRelation;
	MetricRange *first = &so->ranges[0];
	GpuMetricMetaPageData meta;
	GpuMetricCached *entry;
	GpuMetricHits found;
	uint64		offsets[2];
	uint32	   *ids;
	uint32	   *dist;
	int64		n;
	int64		kept;

	for (int i = 1; i < so->nranges; i++)
		if (so->ranges[i].radius < first->radius)
			first = &so->ranges[i];
	entry = GpuMetricGetCached(index, &meta);
	offsets[0] = 0;
	offsets[1] = first->ncp;
	GpuMetricSearch(index, entry, &meta, false, first->cps, offsets, 1, (uint32) first->radius, NULL, 1, &found);
	so->evaluations += found.evaluations;
	so->live = found.live;
	so->rounds++;

	n = (int64) found.offsets[1];
	ids = (uint32 *) palloc(sizeof(uint32) * Max(n, 1));
	dist = (uint32 *) palloc(sizeof(uint32) * Max(n, 1));
	for (int64 i = 0; i < n; i++)
		ids[i] = found.hits[i].id;
	for (MetricRange *range = so->ranges; range < so->ranges + so->nranges; range++)
	{
		if (range == first)
			continue;
		ObjectDistances(entry, range->cps, range->ncp, ids, n, (uint32) range->radius, dist);
		so->evaluations += n;
		kept = 0;
		for (int64 i = 0; i < n; i++)
			if (dist[i] <= (uint32) range->radius)
				ids[kept++] = ids[i];
		n = kept;
	}
	if (so->ordered && !so->null_order)
	{
		ObjectDistances(entry, so->order_cps, so->order_ncp, ids, n, UINT32_MAX, dist);
		so->evaluations += n;
	}
	for (int64 i = 0; i < n; i++)
	{
		found.hits[i].id = ids[i];
		found.hits[i].dist = so->ordered && !so->null_order ? dist[i] : 0;
	}
	/* Heap order, or distance then heap order. */
	GpuMetricSortByTid(entry->tids, found.hits, n);
	AllocResults(so, n);
	for (int64 i = 0; i < n; i++)
	{
		so->tids[i] = entry->tids[found.hits[i].id];
		so->dists[i] = (int32) found.hits[i].dist;
	}
	so->nresults = n;
	so->done = true;
}

/*
 * The next k-NN round: the k nearest with their whole distance group
 * (GpuMetricSearchNearest), of which those not returned before (at or past
 * floor) are returned, by distance, then heap order. The next round asks
 * for more, and for more than the rows found so far, so that it reaches
 * past them.
 */
static void
KnnRound(IndexScanDesc scan)
{
	GpuMetricScanOpaque so = (GpuMetricScanOpaque) scan->opaque;
	Relation	index = scan->indexRelation;
	GpuMetricMetaPageData meta;
	GpuMetricCached *entry = GpuMetricGetCached(index, &meta);
	GpuMetricHits found;
	uint64		offsets[2] = {0, (uint64) so->order_ncp};
	uint32		k = (uint32) Min(so->k, (int64) PG_UINT32_MAX);
	int64		n;
	int64		from = 0;

	CHECK_FOR_INTERRUPTS();
	GpuMetricSearchNearest(index, entry, &meta, so->order_cps, offsets, 1, k, 1, &found);
	so->evaluations += found.evaluations;
	so->live = found.live;
	so->rounds++;
	n = (int64) found.offsets[1];
	/* Objects nearer than floor came in earlier rounds. */
	while (from < n && found.hits[from].dist < so->floor)
		from++;
	GpuMetricSortByTid(entry->tids, found.hits + from, n - from);
	AllocResults(so, n - from);
	for (int64 i = from; i < n; i++)
	{
		so->tids[so->nresults] = entry->tids[found.hits[i].id];
		so->dists[so->nresults] = (int32) found.hits[i].dist;
		so->nresults++;
	}
	/* Fewer than k: every live object was ranked. */
	if (n < (int64) k)
		so->done = true;
	else
	{
		so->floor = found.hits[n - 1].dist + 1;
		/*
		 * Four times k, and past the rows found: an ORDER BY that reads on
		 * (no LIMIT, or a filter above the scan) takes few rounds, and once
		 * a round would rank a quarter of the index the next ranks it all.
		 */
		so->k = Max(so->k * GPU_METRIC_K_GROWTH, n + 1);
		if (so->k * GPU_METRIC_K_GROWTH >= (int64) found.live)
			so->k = Max(so->k, (int64) found.live + 1);
	}
}

/* Every live object, in heap order, without distances (no predicate, or a NULL ORDER BY query). */
static void
AllLive(IndexScanDesc scan)
{
	GpuMetricScanOpaque so = (GpuMetricScanOpaque) scan->opaque;
	GpuMetricMetaPageData meta;
	GpuMetricCached *entry = GpuMetricGetCached(scan->indexRelation, &meta);
	const gpuivfpq::MetricIndex &index = entry->engine->index();
	gpuivfpq::MetricHit *hits = (gpuivfpq::MetricHit *) palloc_extended(sizeof(gpuivfpq::MetricHit) *
																		 Max(index.live(), 1), MCXT_ALLOC_HUGE);
	int64		n = 0;

	for (uint32 id = 0; id < index.size(); id++)
		if (!index.is_removed(id))
			hits[n++] = gpuivfpq::MetricHit{id, 0};
	GpuMetricSortByTid(entry->tids, hits, n);
	AllocResults(so, n);
	for (int64 i = 0; i < n; i++)
		so->tids[i] = entry->tids[hits[i].id];
	so->nresults = n;
	so->live = index.live();
	so->done = true;
	pfree(hits);
}

/* Produces the next batch of rows; false when none are left. */
static bool
NextBatch(IndexScanDesc scan)
{
	GpuMetricScanOpaque so = (GpuMetricScanOpaque) scan->opaque;
	MemoryContext old;

	if (!so->started)
	{
		pgstat_count_index_scan(scan->indexRelation);
		so->started = true;
	}
	if (so->done || so->nomatch)
		return false;
	/* The rows returned so far are done with: this batch's answers replace them. */
	MemoryContextReset(so->roundctx);
	so->tids = NULL;
	so->dists = NULL;
	so->nresults = 0;
	so->next = 0;
	so->resolved = 0;
	/*
	 * A scan with neither a range nor an order would stand for every row of
	 * the table, and rows whose word is NULL are not in the index: refused
	 * rather than missing rows. The planner never takes such a path
	 * (amcostestimate refuses it), but PostgreSQL 18 may still build a
	 * bitmap scan from it when every other path is disabled.
	 */
	if (scan->numberOfKeys == 0 && scan->numberOfOrderBys == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("gpu_metric index \"%s\" cannot return every row of its table",
						RelationGetRelationName(scan->indexRelation)),
				 errdetail("Rows whose word is NULL are not in the index."),
				 errhint("Search with a range (<%% edit_range(...)) or an ORDER BY distance, or allow a sequential scan (enable_seqscan).")));
	old = MemoryContextSwitchTo(so->roundctx);
	if (so->nranges > 0)
		RangeBatch(scan);
	else if (so->ordered && !so->null_order)
	{
		/* A round returns rows unless none are left (the next reaches past the last). */
		while (so->nresults == 0 && !so->done)
			KnnRound(scan);
	}
	else
		AllLive(scan);
	MemoryContextSwitchTo(old);
	return so->nresults > 0;
}

/*
 * Puts the rows from so->next on that share its distance and its heap page
 * in the order of their own TIDs. Rows come sorted by distance, then by the
 * index's TIDs: a HOT chain's root, while "ORDER BY word <~> q, ctid" and
 * the batch functions order ties by the visible row's own TID. A HOT update
 * keeps a row on its page, so only ties on one page can change places: each
 * such run is resolved (a heap fetch per row) as the scan reaches it, and
 * never more of a tie group than the scan returns. The rows keep the
 * index's TIDs (the executor follows a chain from its root); one no
 * snapshot of the scan sees keeps its root's place (the executor skips it).
 * Unordered scans and scans without an MVCC snapshot have no order to keep.
 */
static void
ResolveTies(IndexScanDesc scan)
{
	GpuMetricScanOpaque so = (GpuMetricScanOpaque) scan->opaque;
	int64		from = so->next;
	int64		to = from + 1;
	BlockNumber block = ItemPointerGetBlockNumber(&so->tids[from]);
	struct Tie
	{
		ItemPointerData row;
		ItemPointerData root;
	}		   *ties;

	if (!so->ordered || so->null_order || scan->heapRelation == NULL ||
		scan->xs_snapshot == NULL || !IsMVCCSnapshot(scan->xs_snapshot))
	{
		so->resolved = so->nresults;	/* no order among these rows to keep */
		return;
	}
	while (to < so->nresults && so->dists[to] == so->dists[from] &&
		   ItemPointerGetBlockNumber(&so->tids[to]) == block)
		to++;
	so->resolved = to;
	if (to - from < 2)
		return;
	if (so->fetch == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(so->scanctx);

		so->slot = table_slot_create(scan->heapRelation, NULL);
		so->fetch = table_index_fetch_begin(scan->heapRelation);
		MemoryContextSwitchTo(old);
	}
	ties = (Tie *) palloc(sizeof(Tie) * (to - from));
	for (int64 i = from; i < to; i++)
	{
		ties[i - from].root = so->tids[i];
		ties[i - from].row = so->tids[i];
		(void) GpuMetricRowVisible(so->fetch, scan->xs_snapshot, so->slot, &ties[i - from].row);
	}
	/* Distinct chains resolve to distinct rows: a total order. In place, no allocation. */
	std::sort(ties, ties + (to - from), [](const Tie &a, const Tie &b) {
		return ItemPointerCompare((ItemPointer) &a.row, (ItemPointer) &b.row) < 0;
	});
	for (int64 i = from; i < to; i++)
		so->tids[i] = ties[i - from].root;
	pfree(ties);
}

/* amgettuple: the next row (by distance when the scan is ordered). */
bool
gpumetricgettuple(IndexScanDesc scan, ScanDirection dir)
{
	GpuMetricScanOpaque so = (GpuMetricScanOpaque) scan->opaque;

	if (!ScanDirectionIsForward(dir))
		elog(ERROR, "gpu_metric only supports forward scans");
	if (so->next >= so->nresults && !NextBatch(scan))
		return false;
	if (so->next >= so->resolved)
		ResolveTies(scan);
	scan->xs_heaptid = so->tids[so->next];
	/* Exact: neither the predicate nor the order needs a recheck. */
	scan->xs_recheck = false;
	scan->xs_recheckorderby = false;
	if (scan->numberOfOrderBys > 0)
	{
		scan->xs_orderbyvals[0] = Int32GetDatum(so->dists[so->next]);
		scan->xs_orderbynulls[0] = so->null_order;
	}
	so->next++;
	return true;
}

/* amgetbitmap: every row within the ranges. */
int64
gpumetricgetbitmap(IndexScanDesc scan, TIDBitmap *tbm)
{
	GpuMetricScanOpaque so = (GpuMetricScanOpaque) scan->opaque;
	int64		total = 0;

	while (NextBatch(scan))
	{
		tbm_add_tuples(tbm, so->tids, (int) so->nresults, false);
		total += so->nresults;
		so->next = so->nresults;
		CHECK_FOR_INTERRUPTS();
	}
	return total;
}

/* amendscan: reports the search's work at DEBUG1 (benchmarks read it). */
void
gpumetricendscan(IndexScanDesc scan)
{
	GpuMetricScanOpaque so = (GpuMetricScanOpaque) scan->opaque;

	if (so->fetch != NULL)
	{
		table_index_fetch_end(so->fetch);
		ExecDropSingleTupleTableSlot(so->slot);
	}
	if (so->rounds > 0)
		elog(DEBUG1, "gpu_metric scan of \"%s\": %s, %llu distance evaluations of %llu live objects (%.2f%% of brute force) in %d round%s",
			 RelationGetRelationName(scan->indexRelation),
			 so->nranges > 0 ? "range" : "k-NN",
			 (unsigned long long) so->evaluations, (unsigned long long) so->live,
			 so->live > 0 ? 100.0 * so->evaluations / so->live : 0.0, so->rounds,
			 so->rounds == 1 ? "" : "s");
	MemoryContextDelete(so->scanctx);
	scan->opaque = NULL;
}
