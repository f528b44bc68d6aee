// Ordered index scan: probe the nearest lists, rank codes by ADC, re-rank
// the best candidates with exact distances (on the GPU or from the vector
// copies in the list pages; from the heap in an index without them), and
// continue with more candidates and lists when the executor asks for more
// rows. Rows come back in exact distance order across rounds: a later
// round never returns a row that sorts before one already returned.
#include "common/guard.h"
#include "common/rerank.h"

extern "C" {
#include "access/stratnum.h"
}
#include "service/service.h"
#include "engine/exact_distance.h"
#include "engine/ivfpq.h"
#include "engine/topk.h"

typedef struct GpuIvfpqScanOpaqueData
{
	MemoryContext scanctx;		/* lives as long as the scan */
	MemoryContext batchctx;		/* reset on rescan */

	GpuIvfpqMetaPageData meta;
	GpuIvfpqListDirEntry *dir;	/* the list directory, read by the first CPU round (ScanListDir) */
	int			metric;
	GpuIvfpqVectorFormat format;	/* of the indexed column */

	/* the query of the current rescan */
	bool		null_query;
	bool		nan_query;		/* every distance is NaN (a zero vector for cosine) */
	bool		unranked;		/* past what the quantizers rank: one exact pass */
	float	   *query;
	gpuivfpq::IvfPqModel *model;	/* the backend cache's: valid during one round only */
	gpuivfpq::IvfPqQuery *prepared; /* owned by scanctx */
	bool		query_prepared; /* prepared holds the current query */

	/* the filter on the filter column, pushed down (scan keys of column 2) */
	bool		filtered;		/* range applies */
	GpuIvfpqKeyRange range;		/* lo > hi: no row can match */

	/* progress of the iterative scan */
	bool		started;
	bool		exhausted;
	int			probes;			/* lists probed by the current round */
	int			candidates;		/* ADC candidates taken by the current round */
	int64		reranked;		/* candidates re-ranked so far */
	int64		invisible;		/* of them, rows the snapshot cannot see or the executor found dead */
	int64		entries_seen;	/* entries in the probed lists, last round */
	HTAB	   *seen;			/* TIDs already re-ranked from the heap */
	bool		returned_any;	/* last is set */
	bool		final_round;	/* the current round ranked every entry */
	int			round_want;		/* candidates the current round asked for */
	int			round_probes;	/* lists the current round probed */
	int			widen_to;		/* > 0: the next round only probes this many lists (a filter) */
	bool		filter_sized;	/* the probes were scaled to the filter's selectivity */
	GpuIvfpqHit last;			/* the last row returned: later rows sort after it */

	/*
	 * The rows returned so far, in order, and whether each is known visible
	 * to the scan's snapshot (re-ranked from the heap). Rows a round took
	 * from vector copies were never checked: the executor drops those it
	 * cannot see (an aborted insert, a deleted row before VACUUM), and such
	 * a row must not hold later rows back (SettleLast).
	 */
	GpuIvfpqHit *returned;
	bool	   *returned_known;
	int64		nreturned;
	int64		returned_cap;

	GpuIvfpqHit *results;
	int			nresults;
	int			next;

	/*
	 * A round ranked by lower bounds (RaBitQ codes) is re-ranked lazily: its
	 * candidates are fetched in bound order only while a bound is below the
	 * nearest row fetched and not yet returned (LazyNext).
	 */
	bool		lazy;			/* the current round is such a round */
	int64	   *cand_labels;	/* its candidates, lowest bound first */
	double	   *cand_lower;		/* their bounds, as exact distances */
	int			ncand;
	int			cand_next;		/* the next candidate to fetch */
	double		tail;			/* bound of every entry the round did not rank */
	GpuIvfpqHit *pending;		/* fetched, not returned: a heap, nearest first */
	int			npending;
	int			pending_cap;
	GpuIvfpqHit lazy_hit;		/* the row LazyNext returned last */

	/* instrumentation, reported at DEBUG1 when the scan ends */
	int			gpu_rounds;		/* rounds the GPU service served */
	int			gpu_exact_rounds;	/* of which it re-ranked */
	int			cpu_rounds;
	int64		skipped_late;	/* candidates that sorted before a returned row */
	int64		gpu_batch_sum;	/* sizes of the GPU batches that served them */
	int64		codes_scanned;
	instr_time	adc_time;
	instr_time	rerank_time;
	bool		timed;			/* time each heap re-rank: the DEBUG1 report is wanted */

	/* heap access for re-ranking */
	bool		heap_open;		/* hf is set up */
	bool		heap_round;		/* the current round re-ranked from the heap */
	int64		heap_reranked;	/* rows re-ranked from the heap (DEBUG report) */
	GpuIvfpqHeapFetch hf;
} GpuIvfpqScanOpaqueData;
typedef GpuIvfpqScanOpaqueData *GpuIvfpqScanOpaque;

/* ambeginscan */
IndexScanDesc
gpuivfpqbeginscan(Relation index, int nkeys, int norderbys)
{
	IndexScanDesc scan = RelationGetIndexScan(index, nkeys, norderbys);
	MemoryContext scanctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq scan",
												  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(scanctx);
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) palloc0(sizeof(GpuIvfpqScanOpaqueData));

	so->scanctx = scanctx;
	so->batchctx = AllocSetContextCreate(scanctx, "gpu_ivfpq scan batch", ALLOCSET_DEFAULT_SIZES);
	so->metric = GpuIvfpqMetricOf(index);
	so->format = GpuIvfpqIndexFormat(index);
	GpuIvfpqReadMeta(index, &so->meta);
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

/* The smallest and largest value of the filter column's type, as filter keys. */
static void
FilterTypeBounds(Relation index, int64 *lo, int64 *hi)
{
	switch (TupleDescAttr(RelationGetDescr(index), 1)->atttypid)
	{
		case INT2OID:
			*lo = PG_INT16_MIN;
			*hi = PG_INT16_MAX;
			break;
		case INT4OID:
			*lo = PG_INT32_MIN;
			*hi = PG_INT32_MAX;
			break;
		default:
			*lo = PG_INT64_MIN;
			*hi = PG_INT64_MAX;
			break;
	}
}

/*
 * Folds the scan keys on the filter column (WHERE filter_column <op> value,
 * op one of < <= = >= >, ANDed) into one range of filter keys. The range is
 * clipped to the column type's values, which keeps NULLs (stored as
 * GPU_IVFPQ_NULL_FILTER_KEY) out of it for smallint and integer columns; a
 * NULL comparison value matches nothing.
 */
static void
SetFilterRange(IndexScanDesc scan, ScanKey keys, int nkeys)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;

	so->filtered = false;
	if (nkeys == 0)
		return;
	so->filtered = true;
	FilterTypeBounds(scan->indexRelation, &so->range.lo, &so->range.hi);
	for (int i = 0; i < nkeys; i++)
	{
		ScanKey		key = &keys[i];
		Oid			type = key->sk_subtype;
		int64		v;

		if (key->sk_attno != 2)
			elog(ERROR, "gpu_ivfpq: scan key on column %d", key->sk_attno);
		if (key->sk_flags & SK_ISNULL)
		{
			so->range.lo = 1;
			so->range.hi = 0;
			return;
		}
		if (type == InvalidOid)
			type = TupleDescAttr(RelationGetDescr(scan->indexRelation), 1)->atttypid;
		if (type == INT2OID)
			v = DatumGetInt16(key->sk_argument);
		else if (type == INT4OID)
			v = DatumGetInt32(key->sk_argument);
		else if (type == INT8OID)
			v = DatumGetInt64(key->sk_argument);
		else
			elog(ERROR, "gpu_ivfpq: filter comparison with type %u", type);
		switch (key->sk_strategy)
		{
			case BTLessStrategyNumber:
				if (v == PG_INT64_MIN)
				{
					so->range.lo = 1;
					so->range.hi = 0;
					return;
				}
				so->range.hi = Min(so->range.hi, v - 1);
				break;
			case BTLessEqualStrategyNumber:
				so->range.hi = Min(so->range.hi, v);
				break;
			case BTEqualStrategyNumber:
				so->range.lo = Max(so->range.lo, v);
				so->range.hi = Min(so->range.hi, v);
				break;
			case BTGreaterEqualStrategyNumber:
				so->range.lo = Max(so->range.lo, v);
				break;
			case BTGreaterStrategyNumber:
				if (v == PG_INT64_MAX)
				{
					so->range.lo = 1;
					so->range.hi = 0;
					return;
				}
				so->range.lo = Max(so->range.lo, v + 1);
				break;
			default:
				elog(ERROR, "gpu_ivfpq: filter strategy %d", key->sk_strategy);
		}
	}
}

/* amrescan: takes the query vector of the ORDER BY and restarts the scan. */
void
gpuivfpqrescan(IndexScanDesc scan, ScanKey keys, int nkeys, ScanKey orderbys, int norderbys)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	MemoryContext old;

	MemoryContextReset(so->batchctx);
	so->started = false;
	so->timed = message_level_is_interesting(DEBUG1);
	so->exhausted = false;
	so->reranked = 0;
	so->invisible = 0;
	so->entries_seen = 0;
	so->returned_any = false;
	so->returned = NULL;
	so->returned_known = NULL;
	so->nreturned = 0;
	so->returned_cap = 0;
	so->final_round = false;
	so->round_want = 0;
	so->round_probes = 0;
	so->widen_to = 0;
	so->filter_sized = false;
	so->results = NULL;
	so->nresults = 0;
	so->next = 0;
	so->lazy = false;
	so->ncand = 0;
	so->cand_next = 0;
	so->pending = NULL;
	so->npending = 0;
	so->pending_cap = 0;
	so->query = NULL;
	so->null_query = true;
	so->nan_query = false;
	so->unranked = false;
	so->query_prepared = false;

	if (orderbys && scan->numberOfOrderBys > 0)
		memmove(scan->orderByData, orderbys, scan->numberOfOrderBys * sizeof(ScanKeyData));
	if (keys && scan->numberOfKeys > 0)
		memmove(scan->keyData, keys, scan->numberOfKeys * sizeof(ScanKeyData));
	SetFilterRange(scan, scan->keyData, scan->numberOfKeys);

	old = MemoryContextSwitchTo(so->batchctx);
	so->seen = GpuIvfpqTidSetCreate(so->batchctx);

	if (scan->numberOfOrderBys > 0 && !(scan->orderByData[0].sk_flags & SK_ISNULL))
	{
		int			dim;
		ScanKey		key = &scan->orderByData[0];
		/* The ORDER BY operator's right operand: the indexed type for every operator class. */
		GpuIvfpqVectorFormat format = OidIsValid(key->sk_subtype) ?
			GpuIvfpqFormatOfType(key->sk_subtype) : so->format;
		const float *q = GpuIvfpqDatumVector(key->sk_argument,
											 format != GPU_IVFPQ_FORMAT_NONE ? format : so->format,
											 &dim, "query vector");

		if (so->meta.dimensions != 0 && (uint32) dim != so->meta.dimensions)
			ereport(ERROR,
					(errcode(ERRCODE_DATA_EXCEPTION),
					 errmsg("query vector has %d dimensions, the index \"%s\" has %u",
							dim, RelationGetRelationName(scan->indexRelation), so->meta.dimensions)));
		so->query = (float *) palloc(sizeof(float) * Max(dim, 1));
		memcpy(so->query, q, sizeof(float) * dim);
		so->null_query = false;
		so->unranked = !gpuivfpq::ivfpq_ranks_query(so->query, (size_t) dim);
		so->nan_query = so->metric == (int) gpuivfpq::Metric::Cosine &&
			std::all_of(so->query, so->query + dim, [](float x) { return x == 0.0f; });
	}
	MemoryContextSwitchTo(old);
}

/*
 * The list directory, read on first use: only rounds on the CPU walk the
 * lists (the GPU's mirror has its own), and at 4096 lists and more the
 * directory is 9 pages and more, which a scan served by the GPU would read
 * and copy for nothing.
 */
static const GpuIvfpqListDirEntry *
ScanListDir(IndexScanDesc scan)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;

	if (so->dir == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(so->scanctx);

		so->dir = GpuIvfpqReadListDir(scan->indexRelation, &so->meta);
		MemoryContextSwitchTo(old);
	}
	return so->dir;
}

/* Every entry of the first so->probes lists (an untrained index, or no query). */
static void
CollectAll(IndexScanDesc scan, GpuIvfpqLabels *all)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	const GpuIvfpqListDirEntry *dir = ScanListDir(scan);

	so->entries_seen = 0;
	for (int list = 0; list < so->probes; list++)
		so->entries_seen += GpuIvfpqCollectList(scan->indexRelation, &so->meta, dir[list].head,
												NULL, so->filtered ? &so->range : NULL, all);
}

/* a sorts before b by distance alone (NaN after every number). */
static bool
DistanceBefore(double a, double b)
{
	if (isnan(a))
		return false;
	return isnan(b) || a < b;
}

/*
 * Before a row is skipped for sorting before the last row returned: the
 * last returned rows that the scan's snapshot cannot see were never output
 * (the executor dropped them), so the order to keep is that of the last
 * visible one. Checks returned rows from the latest back until one is
 * visible (each at most once: a row found visible stays known, one found
 * invisible is forgotten, the snapshot being the scan's for its whole
 * life) and makes it the last.
 */
static void
SettleLast(IndexScanDesc scan)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;

	while (so->nreturned > 0)
	{
		int64		i = so->nreturned - 1;

		if (!so->returned_known[i])
		{
			ItemPointerData tid = so->returned[i].tid;

			EnsureHeapAccess(scan);
			so->returned_known[i] = GpuIvfpqHeapFetchVisible(&so->hf, &tid);
		}
		if (so->returned_known[i])
		{
			so->last = so->returned[i];
			return;
		}
		so->nreturned--;
		CHECK_FOR_INTERRUPTS();
	}
	so->returned_any = false;
}

/* Whether h must be skipped: it sorts before the last visible row returned (strict order). */
static bool
ReturnsLate(IndexScanDesc scan, const GpuIvfpqHit *h)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;

	if (!gpu_ivfpq_strict_order || !so->returned_any || !DistanceBefore(h->dist, so->last.dist))
		return false;
	SettleLast(scan);
	return so->returned_any && DistanceBefore(h->dist, so->last.dist);
}

/*
 * Chooses what a round returns from its candidates, sorted by exact
 * distance. A round that left entries of the probed lists unranked returns
 * only the nearer half: its tail is where the next, wider round finds rows
 * that ADC ranked low but that are nearer (a row returned from the tail
 * would make them late). Of those, with gpu_ivfpq.strict_order, only rows
 * at least as far as the last row returned: a row found only by a wider
 * round that is nearer than one already returned is skipped, since
 * returning it now would break the order. (At an equal distance any TID
 * order is an order by distance: the GPU's k-selection breaks ties among
 * equal codes in no fixed order.) Without strict order such rows are
 * returned late; rows returned before are never returned again.
 */
static void
ChooseReturned(IndexScanDesc scan, bool partial)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	int			kept = 0;
	int			n = so->nresults;

	if (so->null_query)
		return;
	if (partial && n > 0)
	{
		n = (n + 1) / 2;
		/*
		 * Nor a row of NaN distance (a cosine with a zero vector), which
		 * sorts after every number: a later round may still find numbers.
		 * They sort last in the results; the last round returns them. A
		 * query whose every distance is NaN (a zero vector for cosine) has
		 * no order to keep.
		 */
		if (!so->nan_query)
			while (n > 0 && isnan(so->results[n - 1].dist))
				n--;
		/* A heap re-rank must fetch the tail again next round: it is not seen yet. */
		if (so->heap_round)
			for (int i = n; i < so->nresults; i++)
				(void) hash_search(so->seen, &so->results[i].tid, HASH_REMOVE, NULL);
	}
	for (int i = 0; i < n; i++)
	{
		GpuIvfpqHit *h = &so->results[i];
		/*
		 * Heap re-ranks skip seen rows themselves; re-ranked rounds bring
		 * back the rows returned before (seen holds every returned row).
		 */
		bool		returned = !so->heap_round && hash_search(so->seen, &h->tid, HASH_FIND, NULL);

		if (returned)
			continue;
		/* Equal distances may come in any TID order: SQL orders by distance only. */
		if (ReturnsLate(scan, h))
		{
			so->skipped_late++;
			continue;
		}
		so->results[kept++] = *h;
	}
	so->nresults = kept;
}

/*
 * Whether the scan re-ranked gpu_ivfpq.max_scan_tuples candidates: rows it
 * could not see (entries of rows deleted, rolled back or not yet committed,
 * before VACUUM) do not count, so that they cannot end a scan before it
 * found a row. The rounds still end: each ranks more of a bounded index.
 */
static bool
PastScanBound(GpuIvfpqScanOpaque so)
{
	return so->reranked - so->invisible >= gpu_ivfpq_max_scan_tuples;
}

/* What a scan re-ranks from the heap against: its query, skipping rows seen before. */
static void
ScanRerankSpec(GpuIvfpqScanOpaque so, GpuIvfpqRerankSpec *spec)
{
	memset(spec, 0, sizeof(*spec));
	spec->metric = so->metric;
	spec->query = so->null_query ? NULL : so->query;
	spec->dim = so->meta.dimensions;
	spec->seen = so->seen;
	/* The executor follows a HOT chain from its root, the TID the index holds. */
	spec->index_tids = true;
}

/*
 * Re-ranks the candidate labels not seen before with exact distances from
 * the heap (rows no longer visible are skipped) into the next batch of
 * results, in exact distance order: for indexes without vector copies.
 */
static void
HeapRerank(IndexScanDesc scan, int64 *labels, int n)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	GpuIvfpqRerankSpec spec;
	int64		fetched = 0;

	EnsureHeapAccess(scan);
	ScanRerankSpec(so, &spec);
	so->results = (GpuIvfpqHit *) MemoryContextAllocHuge(so->batchctx, sizeof(GpuIvfpqHit) * Max(n, 1));
	so->nresults = (int) GpuIvfpqRerank(&so->hf, &spec, labels, n, so->results, &fetched);
	so->next = 0;
	so->reranked += fetched;
	so->invisible += Max(fetched - so->nresults, 0);
	so->heap_reranked += fetched;
}

/* The pending heap: nearest first, in GpuIvfpqHitLess order (NaN distances last). */
static void
PendingPush(GpuIvfpqScanOpaque so, const GpuIvfpqHit *h)
{
	int			i;

	if (so->npending == so->pending_cap)
	{
		int			cap = Max(64, so->pending_cap * 2);

		so->pending = so->pending == NULL
			? (GpuIvfpqHit *) MemoryContextAlloc(so->batchctx, sizeof(GpuIvfpqHit) * cap)
			: (GpuIvfpqHit *) repalloc(so->pending, sizeof(GpuIvfpqHit) * cap);
		so->pending_cap = cap;
	}
	i = so->npending++;
	while (i > 0 && GpuIvfpqHitLess(*h, so->pending[(i - 1) / 2]))
	{
		so->pending[i] = so->pending[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	so->pending[i] = *h;
}

static GpuIvfpqHit
PendingPop(GpuIvfpqScanOpaque so)
{
	GpuIvfpqHit top = so->pending[0];
	GpuIvfpqHit last = so->pending[--so->npending];
	int			i = 0;

	for (;;)
	{
		int			c = 2 * i + 1;

		if (c >= so->npending)
			break;
		if (c + 1 < so->npending && GpuIvfpqHitLess(so->pending[c + 1], so->pending[c]))
			c++;
		if (!GpuIvfpqHitLess(so->pending[c], last))
			break;
		so->pending[i] = so->pending[c];
		i = c;
	}
	if (so->npending > 0)
		so->pending[i] = last;
	return top;
}

/*
 * Starts a round ranked by lower bounds (RaBitQ codes): labels and their
 * bounds (ranking units), lowest first, are fetched by LazyNext. The rows
 * the round did not rank are bounded by its last candidate's bound (the
 * GPU and the CPU engine rank by bound); a round no other follows bounds
 * nothing. The bounds hold for all but a small share of rows (they are
 * drawn at a confidence, not proven), so a round that ranked every entry
 * of every list (fetch_all: the settings that promise a sequential scan's
 * answer) fetches all its candidates before it returns a row.
 */
static void
LazyRound(IndexScanDesc scan, int64 *labels, const double *lower, int n, bool last_round, bool fetch_all)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	double	   *bounds = (double *) MemoryContextAllocHuge(so->batchctx, sizeof(double) * Max(n, 1));
	double		prev = -get_float8_infinity();

	EnsureHeapAccess(scan);
	for (int i = 0; i < n; i++)
	{
		/*
		 * Bounds come sorted; a device that sent them out of order (never
		 * expected) must not stop the fetch early: each is at most the next.
		 */
		bounds[i] = fetch_all ? -get_float8_infinity() : Max(GpuIvfpqLowerToExact(so->metric, lower[i]), prev);
		prev = bounds[i];
	}
	so->cand_labels = labels;
	so->cand_lower = bounds;
	so->ncand = n;
	so->cand_next = 0;
	so->tail = last_round || n == 0 ? get_float8_infinity() : bounds[n - 1];
	so->lazy = true;
}

/*
 * The next row of a lazy round, nearest first: fetches candidates in bound
 * order while the next bound (or the round's tail) lies below the nearest
 * row fetched and not yet returned. false when the round is done: rows
 * fetched but past its tail wait in pending for the next, wider round (its
 * candidates skip them: seen). With strict order, rows nearer than the last
 * row returned (found by a wider round) are skipped, as ChooseReturned does.
 */
static bool
LazyNext(IndexScanDesc scan, GpuIvfpqHit *out)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	GpuIvfpqRerankSpec spec;

	ScanRerankSpec(so, &spec);
	for (;;)
	{
		double		t = so->cand_next < so->ncand ? so->cand_lower[so->cand_next] : so->tail;

		/* Past an infinite tail every row is final, NaN distances (sorted last) too. */
		if (so->npending > 0 &&
			(t == get_float8_infinity() || (!isnan(so->pending[0].dist) && so->pending[0].dist <= t)))
		{
			GpuIvfpqHit h = PendingPop(so);

			if (ReturnsLate(scan, &h))
			{
				so->skipped_late++;
				continue;
			}
			*out = h;
			return true;
		}
		if (so->cand_next < so->ncand)
		{
			GpuIvfpqHit h;
			int64		fetched = 0;
			instr_time	start,
						end;
			const bool	timed = so->timed;

			/* Two clock reads a row were 1.4% of a backend's CPU: only for the report. */
			INSTR_TIME_SET_ZERO(start);
			if (timed)
				INSTR_TIME_SET_CURRENT(start);
			if (GpuIvfpqRerankOne(&so->hf, &spec, so->cand_labels[so->cand_next], &h, &fetched))
				PendingPush(so, &h);
			else
				so->invisible += fetched;
			if (timed)
			{
				INSTR_TIME_SET_CURRENT(end);
				INSTR_TIME_ACCUM_DIFF(so->rerank_time, end, start);
			}
			so->cand_next++;
			so->reranked += fetched;
			so->heap_reranked += fetched;
			continue;
		}
		so->lazy = false;
		return false;
	}
}

/*
 * Takes candidates already re-ranked (by the GPU or from the list pages'
 * vector copies: exact distances, in exact order) as the next batch of
 * results. Visibility is the executor's: it fetches each row it is given.
 */
static void
TakeExact(IndexScanDesc scan, const int64 *labels, const double *exact, int n)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;

	so->results = (GpuIvfpqHit *) MemoryContextAllocHuge(so->batchctx, sizeof(GpuIvfpqHit) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		so->results[i].dist = exact[i];
		GpuIvfpqLabelToTid(labels[i], &so->results[i].tid);
	}
	so->nresults = n;
	so->next = 0;
	/* Each round's candidates contain the last round's: the bound counts distinct ones. */
	so->reranked = Max(so->reranked, (int64) n);
}

/*
 * One round on the CPU engine: the want best entries of the probed lists by
 * ADC distance, into labels (allocated here, in the batch context); exact
 * (room for want) receives what GpuIvfpqAnswerDists the round returns says:
 * in an index with vector copies, exact distances (re-ranked); with RaBitQ
 * codes, the lower bounds the entries are ranked by.
 */
static GpuIvfpqAnswerDists
CpuRound(IndexScanDesc scan, int want, int64 **labels, double *exact, int *nlabels)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	bool		rabitq = GpuIvfpqIsRabitq(&so->meta);
	bool		vectors = GpuIvfpqLayoutOf(&so->meta).vdim > 0;
	MemoryContext roundctx;
	gpuivfpq::TopK *topk;

	/*
	 * Each round asks the cache again: between rounds other scans may have
	 * evicted (and freed) the model this scan used before.
	 */
	so->model = rabitq ? NULL : GpuIvfpqGetModel(scan->indexRelation, &so->meta);
	/*
	 * The query is prepared for the lists this round probes, and again when a
	 * later round probes more (the lists nearest by the coarse quantizer, as
	 * the GPU picks them): ordering every list up front cost more than a
	 * first round's list scan at 4096 lists. (RaBitQ codes: prepared per
	 * round, GpuIvfpqRabitqRankLists.)
	 */
	if (!rabitq &&
		(!so->query_prepared || so->prepared->lists.size() < (size_t) Min(so->probes, (int) so->meta.lists)))
	{
		if (so->prepared == NULL)
			so->prepared = GpuIvfpqMakeOwned<gpuivfpq::IvfPqQuery>(so->scanctx, "query preparation");
		GpuIvfpqGuard("query preparation", [&] {
			so->model->prepare_query(so->query, (size_t) Max(so->probes, 1), *so->prepared);
		});
		so->query_prepared = true;
	}
	GpuIvfpqCountCpuQuery();
	so->cpu_rounds++;
	/* The k-selection heap lives for this round only. */
	roundctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq scan round", ALLOCSET_SMALL_SIZES);
	topk = GpuIvfpqMakeOwned<gpuivfpq::TopK>(roundctx, "k-selection", (size_t) want);
	*labels = (int64 *) palloc_extended(sizeof(int64) * Max(want, 1), MCXT_ALLOC_HUGE);
	if (rabitq)
		/* Candidates by the bounds of the codes' estimates, re-ranked from the heap (LazyRound). */
		so->entries_seen = GpuIvfpqRabitqRankLists(scan->indexRelation, &so->meta, ScanListDir(scan), so->query,
												   so->probes, so->filtered ? &so->range : NULL, topk,
												   *labels, exact, nlabels);
	else
		so->entries_seen = GpuIvfpqRankLists(scan->indexRelation, &so->meta, ScanListDir(scan), so->model,
											 so->prepared, so->probes, so->filtered ? &so->range : NULL,
											 topk, so->query, *labels, vectors ? exact : NULL, nlabels);
	so->codes_scanned += so->entries_seen;
	MemoryContextDelete(roundctx);
	return vectors ? GPU_IVFPQ_DISTS_EXACT : rabitq ? GPU_IVFPQ_DISTS_LOWER : GPU_IVFPQ_DISTS_NONE;
}

/*
 * The most lists a filtered scan widens to: every list, and no more than the
 * GPU's per-round bound when the GPU service is wanted (a wider round would
 * leave the GPU, or fail with gpu_ivfpq.device = gpu).
 */
static int
FilteredProbesLimit(GpuIvfpqScanOpaque so)
{
	int			limit = (int) so->meta.lists;

	if (GpuIvfpqServiceWanted())
		limit = Min(limit, Max(so->probes, GPU_IVFPQ_SERVICE_MAX_K));
	return limit;
}

/*
 * The lists a filtered scan probes, from what its first round saw: matched
 * of the entries in so->probes lists passed the filter, a selectivity s of
 * about matched / (probes x rows per list). The rows that pass a filter are
 * a sparser set, and its k nearest lie as far out as the k / s nearest of
 * all rows; probes / s lists hold as many passing entries as probes lists
 * hold entries, which keeps recall near the unfiltered scan's whatever the
 * data (measured in the README). The entries that fail the filter cost a
 * key comparison each, on the GPU and in the CPU engine. The factor 1 / s
 * is rounded up to a power of two, so that scans of similar filters probe
 * alike and the GPU service batches them together (FilteredProbesLimit
 * bounds it).
 */
static int
FilteredProbes(IndexScanDesc scan, int64 matched)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	double		rows = GpuIvfpqRowsEstimate(scan->indexRelation, &so->meta);
	double		expected = Max(1.0, rows * so->probes / Max(so->meta.lists, 1));
	double		s = Min(1.0, Max((double) matched, 0.5) / expected);
	double		factor = pow(2.0, ceil(log2(1.0 / s) - 1e-9));

	return (int) Min(so->probes * factor, (double) FilteredProbesLimit(so));
}

/*
 * Produces the next batch of results. Round 1 probes gpu_ivfpq.probes lists
 * and re-ranks the gpu_ivfpq.rerank best ADC candidates. Each later round
 * doubles the probed lists and the candidates (never past the entries the
 * index can hold: GpuIvfpqEntriesBound), until gpu_ivfpq.max_scan_tuples
 * candidates were re-ranked or a round ranked every entry of every list.
 * Every entry of the probed lists is a candidate, its ADC distance finite
 * or not (gpuivfpq::rank_distance), so a round asks for no more than what
 * is there and the rounds end. What a round returns: ChooseReturned; a
 * round ranked by lower bounds (RaBitQ codes) returns its rows one by one
 * instead (LazyRound, LazyNext). Returns false when nothing is left.
 */
static bool
NextBatch(IndexScanDesc scan)
{
	GpuIvfpqScanOpaque so = (GpuIvfpqScanOpaque) scan->opaque;
	bool		vectors = GpuIvfpqLayoutOf(&so->meta).vdim > 0;

	if (!so->started)
		pgstat_count_index_scan(scan->indexRelation);
	/* A filter no value satisfies (x < 1 AND x > 5, x = NULL). */
	if (so->filtered && so->range.lo > so->range.hi)
		so->exhausted = true;
	while (!so->exhausted)
	{
		MemoryContext old = MemoryContextSwitchTo(so->batchctx);
		int64	   *labels = NULL;
		double	   *exact = NULL;
		GpuIvfpqAnswerDists dists = GPU_IVFPQ_DISTS_NONE;
		int			nlabels = 0;
		int64		matched = 0;	/* a filtered round: entries of its lists in range */

		if (!so->meta.trained || so->null_query || so->meta.dimensions == 0 || so->unranked)
		{
			/*
			 * No quantizers, no distances, or a query too long for the
			 * quantizers to rank: one exact pass over every entry.
			 */
			GpuIvfpqLabels all = {NULL, 0, 0};

			/* Nothing for the GPU to mirror: device = gpu says so, as for every case the GPU cannot serve. */
			if (!so->meta.trained && !so->null_query && gpu_ivfpq_device == GPU_IVFPQ_DEVICE_GPU)
				GpuIvfpqGpuRequiredError("scan", "The index has no trained quantizers (REINDEX it once its table holds rows)");
			so->probes = so->meta.lists;
			CollectAll(scan, &all);
			labels = all.labels;
			nlabels = (int) all.n;
			so->exhausted = true;
		}
		else
		{
			int			lists = (int) so->meta.lists;
			int64		bound = GpuIvfpqEntriesBound(scan->indexRelation, &so->meta);
			int			want;
			instr_time	start,
						end;

			if (!so->started)
			{
				so->probes = Min(gpu_ivfpq_probes, lists);
				so->candidates = (int) Min((int64) gpu_ivfpq_rerank, bound);
			}
			else if (so->widen_to > 0)
			{
				so->probes = so->widen_to;
				so->widen_to = 0;
				so->round_want = 0;
			}
			else
			{
				if (PastScanBound(so) || so->final_round)
				{
					so->exhausted = true;
					MemoryContextSwitchTo(old);
					break;
				}
				/*
				 * Twice the lists and twice the candidates: the lists near
				 * the query join before the rows returned reach far out
				 * (each round returns only its nearer half, ChooseReturned).
				 */
				{
					int			wider = Min(so->probes * 2, lists);

					/*
					 * The GPU's bound on probed lists, as on candidates below:
					 * a round that would pass it first probes the bound; the
					 * round after that one goes past it, to the CPU engine.
					 */
					if (GpuIvfpqServiceWanted() && wider > GPU_IVFPQ_SERVICE_MAX_K &&
						so->probes < GPU_IVFPQ_SERVICE_MAX_K)
						wider = GPU_IVFPQ_SERVICE_MAX_K;
					so->probes = wider;
				}
				so->candidates = (int) Min((int64) so->candidates * 2, bound);
			}
			want = (int) Min(Min((int64) so->candidates + (vectors ? 0 : so->reranked),
								 (int64) gpu_ivfpq_max_scan_tuples + so->invisible + so->candidates),
							 bound);
			/*
			 * The GPU's k-selection bound: a continued round that would pass
			 * it first asks for the bound (partial, ChooseReturned); a round
			 * after that one goes past it, to the CPU engine. (A first round
			 * asks for what gpu_ivfpq.rerank says, on the CPU above the bound.)
			 */
			if (GpuIvfpqServiceWanted() && vectors && so->started && want > GPU_IVFPQ_SERVICE_MAX_K &&
				so->round_want < GPU_IVFPQ_SERVICE_MAX_K)
				want = GPU_IVFPQ_SERVICE_MAX_K;
			/*
			 * No progress is possible: the round would repeat the last one
			 * (never expected: a guard against looping).
			 */
			if (so->started && want <= so->round_want && so->probes <= so->round_probes)
			{
				so->exhausted = true;
				MemoryContextSwitchTo(old);
				break;
			}
			so->round_want = want;
			so->round_probes = so->probes;
			INSTR_TIME_SET_CURRENT(start);
			labels = (int64 *) palloc_extended(sizeof(int64) * want, MCXT_ALLOC_HUGE);
			exact = (double *) palloc_extended(sizeof(double) * want, MCXT_ALLOC_HUGE);
			nlabels = -1;
			if (GpuIvfpqServiceWanted())
			{
				int			batch = 0;

				nlabels = GpuIvfpqServiceSearch(scan->indexRelation, &so->meta, so->query, want,
												so->probes, so->filtered ? &so->range : NULL,
												&matched, labels, exact, &dists, &batch);
				if (nlabels >= 0)
				{
					/*
					 * Fewer than asked: the probed lists hold no more entries
					 * (the CPU path's entries_seen); else at least one more.
					 */
					so->entries_seen = nlabels < want ? nlabels : (int64) nlabels + 1;
					so->gpu_rounds++;
					so->gpu_exact_rounds += dists == GPU_IVFPQ_DISTS_EXACT;
					so->gpu_batch_sum += batch;
				}
			}
			if (nlabels < 0)
			{
				pfree(labels);
				dists = CpuRound(scan, want, &labels, exact, &nlabels);
				matched = so->entries_seen;
			}
			INSTR_TIME_SET_CURRENT(end);
			INSTR_TIME_ACCUM_DIFF(so->adc_time, end, start);

			/*
			 * A filtered scan's first round sizes the probes to the filter
			 * (FilteredProbes); a round whose probed lists hold fewer
			 * matching entries than it ranks probes twice the lists. Either
			 * way the round is run again, wider, returning nothing yet.
			 */
			if (so->filtered)
			{
				int			widen = 0;

				if (!so->filter_sized)
				{
					so->filter_sized = true;
					widen = FilteredProbes(scan, matched);
				}
				if (widen <= so->probes && nlabels < want && so->probes < lists)
					widen = Min(so->probes * 2, FilteredProbesLimit(so));
				if (widen > so->probes)
				{
					so->started = true;
					so->widen_to = widen;
					MemoryContextSwitchTo(old);
					continue;
				}
			}
		}
		so->started = true;
		MemoryContextSwitchTo(old);
		so->heap_round = dists != GPU_IVFPQ_DISTS_EXACT;
		/* The last round: every list probed and every entry of them ranked. */
		so->final_round = so->exhausted ||
			(so->probes >= (int) so->meta.lists && so->entries_seen <= (int64) nlabels);
		if (dists == GPU_IVFPQ_DISTS_LOWER && !so->null_query)
		{
			LazyRound(scan, labels, exact, nlabels,
					  so->final_round || PastScanBound(so),
					  so->final_round);
			return true;
		}
		if (dists == GPU_IVFPQ_DISTS_EXACT)
			TakeExact(scan, labels, exact, nlabels);
		else
		{
			instr_time	start,
						end;

			INSTR_TIME_SET_CURRENT(start);
			HeapRerank(scan, labels, nlabels);
			INSTR_TIME_SET_CURRENT(end);
			INSTR_TIME_ACCUM_DIFF(so->rerank_time, end, start);
		}
		/* Only a round that another may follow holds its tail back. */
		ChooseReturned(scan, !so->final_round && !PastScanBound(so));
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
	GpuIvfpqHit *r;

	if (!ScanDirectionIsForward(dir))
		elog(ERROR, "gpu_ivfpq only supports forward scans");
	/*
	 * The executor found the row returned last dead to every snapshot (an
	 * insert rolled back, a deletion before VACUUM): rows taken from the
	 * vector copies are not checked here, and such rows do not count
	 * against the scan's bound.
	 */
	if (scan->kill_prior_tuple)
		so->invisible++;
	for (;;)
	{
		if (so->lazy)
		{
			if (LazyNext(scan, &so->lazy_hit))
			{
				r = &so->lazy_hit;
				break;
			}
		}
		else if (so->next < so->nresults)
		{
			r = &so->results[so->next++];
			break;
		}
		if (!NextBatch(scan))
		{
			/* No round follows: what a lazy round held back past its tail comes now. */
			if (so->npending == 0)
				return false;
			so->ncand = so->cand_next = 0;
			so->tail = get_float8_infinity();
			so->lazy = true;
		}
	}
	so->last = *r;
	so->returned_any = true;
	if (so->nreturned == so->returned_cap)
	{
		MemoryContext old = MemoryContextSwitchTo(so->batchctx);

		so->returned_cap = Max(so->returned_cap * 2, 64);
		so->returned = so->returned
			? (GpuIvfpqHit *) repalloc_huge(so->returned, sizeof(GpuIvfpqHit) * so->returned_cap)
			: (GpuIvfpqHit *) palloc(sizeof(GpuIvfpqHit) * so->returned_cap);
		so->returned_known = so->returned_known
			? (bool *) repalloc_huge(so->returned_known, sizeof(bool) * so->returned_cap)
			: (bool *) palloc(sizeof(bool) * so->returned_cap);
		MemoryContextSwitchTo(old);
	}
	so->returned[so->nreturned] = *r;
	/* Re-ranked from the heap (a heap round, a lazy one): visible to the snapshot. */
	so->returned_known[so->nreturned] = so->lazy || so->heap_round;
	so->nreturned++;
	/* Every returned row, whichever way its round re-ranked (a heap round entered it already). */
	(void) hash_search(so->seen, &r->tid, HASH_ENTER, NULL);
	scan->xs_heaptid = r->tid;
	/*
	 * A pushed-down filter holds for the row's filter key, which copies the
	 * row's column; the executor checks it again (cheap) because an int8
	 * filter key of PG_INT64_MIN may stand for NULL.
	 */
	scan->xs_recheck = so->filtered;
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
		elog(DEBUG1, "gpu_ivfpq scan of \"%s\" (GPU service: %d of %d rounds, %d re-ranked on the GPU, mean batch %.1f): %d lists probed, candidates in %.3f ms, %lld candidates re-ranked (%lld not visible), %lld from the heap in %.3f ms, %lld found late and skipped",
			 RelationGetRelationName(scan->indexRelation), so->gpu_rounds,
			 so->gpu_rounds + so->cpu_rounds, so->gpu_exact_rounds,
			 (double) so->gpu_batch_sum / so->gpu_rounds, so->probes,
			 INSTR_TIME_GET_MILLISEC(so->adc_time), (long long) so->reranked,
			 (long long) so->invisible, (long long) so->heap_reranked, INSTR_TIME_GET_MILLISEC(so->rerank_time),
			 (long long) so->skipped_late);
	else if (so->started)
		elog(DEBUG1, "gpu_ivfpq scan of \"%s\" (CPU engine): %d lists probed, %lld codes ranked in %.3f ms, %lld candidates re-ranked (%s; %lld not visible), %.3f ms in the heap, %lld found late and skipped",
			 RelationGetRelationName(scan->indexRelation), so->probes,
			 (long long) so->codes_scanned, INSTR_TIME_GET_MILLISEC(so->adc_time),
			 (long long) so->reranked,
			 GpuIvfpqLayoutOf(&so->meta).vdim > 0 ? "from the index's vector copies" : "from the heap",
			 (long long) so->invisible, INSTR_TIME_GET_MILLISEC(so->rerank_time), (long long) so->skipped_late);
	if (so->heap_open)
		GpuIvfpqHeapFetchEnd(&so->hf);
	MemoryContextDelete(so->scanctx);
	scan->opaque = NULL;
}
