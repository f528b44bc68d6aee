// The one re-rank module (rerank.h): heap fetch by TID, exact distance,
// visibility and the result order shared by the scan and the functions.
#include <algorithm>
#include <tuple>

#include "common/rerank.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "catalog/index.h"
#include "catalog/pg_operator_d.h"
#include "catalog/pg_type_d.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "utils/hsearch.h"
#include "utils/tuplesort.h"
}

void
GpuIvfpqSortHits(GpuIvfpqHit *hits, int64 n)
{
	/* A strict weak order for every input, NaN included: std::sort is safe. */
	std::sort(hits, hits + n, GpuIvfpqHitLess);
}

struct GpuIvfpqHitSort
{
	Tuplesortstate *state;
	TupleDesc	desc;			/* (dist float8, tid tid) */
	TupleTableSlot *in;			/* virtual: what is put */
	TupleTableSlot *out;		/* minimal: what comes back */
	bool		sorted;
	bool		have_last;
	GpuIvfpqHit last;
};

GpuIvfpqHitSort *
GpuIvfpqHitSortBegin(int64 bound)
{
	GpuIvfpqHitSort *s = (GpuIvfpqHitSort *) palloc0(sizeof(GpuIvfpqHitSort));
	AttrNumber	cols[2] = {1, 2};
	/* float8's < puts NaN after every number, tid's < is ItemPointerCompare: GpuIvfpqHitLess */
	Oid			ops[2] = {Float8LessOperator, TIDLessOperator};
	Oid			colls[2] = {InvalidOid, InvalidOid};
	bool		nulls_first[2] = {false, false};

	s->desc = CreateTemplateTupleDesc(2);
	TupleDescInitEntry(s->desc, 1, "dist", FLOAT8OID, -1, 0);
	TupleDescInitEntry(s->desc, 2, "tid", TIDOID, -1, 0);
	s->in = MakeSingleTupleTableSlot(s->desc, &TTSOpsVirtual);
	s->out = MakeSingleTupleTableSlot(s->desc, &TTSOpsMinimalTuple);
	s->state = tuplesort_begin_heap(s->desc, 2, cols, ops, colls, nulls_first, work_mem, NULL,
									bound > 0 ? TUPLESORT_ALLOWBOUNDED : TUPLESORT_NONE);
	if (bound > 0)
		tuplesort_set_bound(s->state, bound);
	return s;
}

void
GpuIvfpqHitSortPut(GpuIvfpqHitSort *s, const GpuIvfpqHit *hit)
{
	ItemPointerData tid = hit->tid;

	ExecClearTuple(s->in);
	s->in->tts_values[0] = Float8GetDatum(hit->dist);
	s->in->tts_isnull[0] = false;
	s->in->tts_values[1] = PointerGetDatum(&tid);
	s->in->tts_isnull[1] = false;
	ExecStoreVirtualTuple(s->in);
	/* copies the values into the sort's own memory */
	tuplesort_puttupleslot(s->state, s->in);
}

bool
GpuIvfpqHitSortNext(GpuIvfpqHitSort *s, GpuIvfpqHit *hit)
{
	if (!s->sorted)
	{
		tuplesort_performsort(s->state);
		s->sorted = true;
	}
	for (;;)
	{
		CHECK_FOR_INTERRUPTS();
		if (!tuplesort_gettupleslot(s->state, true, false, s->out, NULL))
			return false;
		slot_getallattrs(s->out);
		hit->dist = DatumGetFloat8(s->out->tts_values[0]);
		hit->tid = *(ItemPointer) DatumGetPointer(s->out->tts_values[1]);
		/* Equal hits sort next to each other (the same row, the same distance). */
		if (s->have_last && ItemPointerEquals(&s->last.tid, &hit->tid) &&
			(s->last.dist == hit->dist || (isnan(s->last.dist) && isnan(hit->dist))))
			continue;
		s->last = *hit;
		s->have_last = true;
		return true;
	}
}

void
GpuIvfpqHitSortEnd(GpuIvfpqHitSort *s)
{
	tuplesort_end(s->state);
	ExecDropSingleTupleTableSlot(s->in);
	ExecDropSingleTupleTableSlot(s->out);
	FreeTupleDesc(s->desc);
	pfree(s);
}

bool
GpuIvfpqFormIndexRow(IndexInfo *indexInfo, ExprState *predicate, TupleTableSlot *slot, EState *estate,
					 Relation heap, Datum *values, bool *isnull)
{
	GpuIvfpqSavedUser saved;
	bool		ok;

	if (indexInfo->ii_Expressions == NIL && predicate == NULL)
	{
		FormIndexDatum(indexInfo, slot, estate, values, isnull);
		return true;
	}
	GpuIvfpqBecomeOwner(heap, &saved);
	FormIndexDatum(indexInfo, slot, estate, values, isnull);
	ok = predicate == NULL || ExecQual(predicate, GetPerTupleExprContext(estate));
	GpuIvfpqRestoreUser(&saved);
	return ok;
}

void
GpuIvfpqHeapFetchBegin(GpuIvfpqHeapFetch *hf, Relation heap, Relation index, Snapshot snapshot)
{
	hf->snapshot = snapshot;
	hf->heap = heap;
	hf->as_owner = false;
	hf->indexInfo = BuildIndexInfo(index);
	hf->format = GpuIvfpqIndexFormat(index);
	hf->estate = CreateExecutorState();
	hf->slot = table_slot_create(heap, NULL);
	GetPerTupleExprContext(hf->estate)->ecxt_scantuple = hf->slot;
	hf->fetch = table_index_fetch_begin(heap);
	hf->rowctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq fetch row",
									   ALLOCSET_DEFAULT_SIZES);
}

const float *
GpuIvfpqHeapFetchVector(GpuIvfpqHeapFetch *hf, ItemPointer tid, int *dim)
{
	bool		call_again = false;
	bool		all_dead = false;
	Datum		values[INDEX_MAX_KEYS];
	bool		isnull[INDEX_MAX_KEYS];
	const float *v = NULL;
	MemoryContext old;

	/* Never a TID no row can have (block 0xFFFFFFFF reads as "extend the table"). */
	if (ItemPointerGetBlockNumberNoCheck(tid) == InvalidBlockNumber || ItemPointerGetOffsetNumberNoCheck(tid) == 0)
		return NULL;
	MemoryContextReset(hf->rowctx);
	old = MemoryContextSwitchTo(hf->rowctx);
	if (table_index_fetch_tuple(hf->fetch, tid, hf->snapshot, hf->slot, &call_again, &all_dead))
	{
		ResetExprContext(GetPerTupleExprContext(hf->estate));
		if (hf->as_owner)
			FormIndexDatum(hf->indexInfo, hf->slot, hf->estate, values, isnull);
		else
			(void) GpuIvfpqFormIndexRow(hf->indexInfo, NULL, hf->slot, hf->estate, hf->heap, values, isnull);
		if (!isnull[0])
			v = GpuIvfpqStoredVector(values[0], hf->format, dim);
		ExecClearTuple(hf->slot);
	}
	MemoryContextSwitchTo(old);
	return v;
}

bool
GpuIvfpqHeapFetchVisible(GpuIvfpqHeapFetch *hf, ItemPointer tid)
{
	bool		call_again = false;
	bool		all_dead = false;
	bool		found;

	/* Never a TID no row can have (block 0xFFFFFFFF reads as "extend the table"). */
	if (ItemPointerGetBlockNumberNoCheck(tid) == InvalidBlockNumber || ItemPointerGetOffsetNumberNoCheck(tid) == 0)
		return false;
	MemoryContextReset(hf->rowctx);
	found = table_index_fetch_tuple(hf->fetch, tid, hf->snapshot, hf->slot, &call_again, &all_dead);
	if (found)
		ExecClearTuple(hf->slot);
	return found;
}

void
GpuIvfpqHeapFetchEnd(GpuIvfpqHeapFetch *hf)
{
	table_index_fetch_end(hf->fetch);
	ExecDropSingleTupleTableSlot(hf->slot);
	FreeExecutorState(hf->estate);
	MemoryContextDelete(hf->rowctx);
}

/*
 * The exact distance of a fetched row's vector v (NULL: none visible) to
 * spec's query into *dist; false where GpuIvfpqRerankOne drops the row (no
 * vector, another dimension, outside the radius).
 */
static bool
KeepRow(const GpuIvfpqRerankSpec *spec, const float *query, const float *v, int vdim, double *dist)
{
	if (v == NULL || (query != NULL && vdim != spec->dim))
		return false;
	*dist = query != NULL ? GpuIvfpqExactDistance(spec->metric, query, v, spec->dim) : get_float8_nan();
	/* NaN is never within a radius. */
	return !spec->bounded || *dist <= spec->radius;
}

bool
GpuIvfpqRerankOne(GpuIvfpqHeapFetch *hf, const GpuIvfpqRerankSpec *spec, int64 label, GpuIvfpqHit *hit,
				  int64 *fetched)
{
	ItemPointerData tid;
	ItemPointerData row_tid;
	int			vdim = 0;
	const float *v;
	double		dist;

	/* Before the seen test too: a round can find every candidate seen before. */
	CHECK_FOR_INTERRUPTS();
	GpuIvfpqLabelToTid(label, &tid);
	if (spec->seen != NULL)
	{
		bool		found;

		(void) hash_search(spec->seen, &tid, HASH_ENTER, &found);
		if (found)
			return false;
	}
	(*fetched)++;
	row_tid = tid;
	v = GpuIvfpqHeapFetchVector(hf, &row_tid, &vdim);
	if (!KeepRow(spec, spec->query, v, vdim, &dist))
		return false;
	hit->dist = dist;
	hit->tid = spec->index_tids ? tid : row_tid;
	return true;
}

int64
GpuIvfpqRerank(GpuIvfpqHeapFetch *hf, const GpuIvfpqRerankSpec *spec, int64 *labels, int64 n,
			   GpuIvfpqHit *hits, int64 *fetched)
{
	int64		nhits = 0;
	int64		looked = 0;
	GpuIvfpqSavedUser saved;
	bool		scope = hf->indexInfo->ii_Expressions != NIL && !hf->as_owner;

	/* Labels sort as (block, offset): fetching in that order reads the heap sequentially. */
	std::sort(labels, labels + n);

	/*
	 * An expression index: the owner's scope (GpuIvfpqBecomeOwner) once for
	 * the loop, which runs no code of the caller's, rather than once a row
	 * (switching the settings and search_path there and back for each row
	 * cost a 32-d scan re-ranking 100 rows from the table 17% of its rate).
	 * An error unwinds the user and settings with the (sub)transaction, and
	 * the flag here, so that no later fetch takes itself for the owner's.
	 */
	if (scope)
	{
		GpuIvfpqBecomeOwner(hf->heap, &saved);
		hf->as_owner = true;
	}
	PG_TRY();
	{
		for (int64 i = 0; i < n; i++)
		{
			if (i > 0 && labels[i] == labels[i - 1])
				continue;
			if (GpuIvfpqRerankOne(hf, spec, labels[i], &hits[nhits], &looked))
				nhits++;
		}
	}
	PG_FINALLY();
	{
		if (scope)
			hf->as_owner = false;
	}
	PG_END_TRY();
	if (scope)
		GpuIvfpqRestoreUser(&saved);
	if (spec->query != NULL)
		GpuIvfpqSortHits(hits, nhits);
	if (fetched != NULL)
		*fetched = looked;
	return nhits;
}

double
GpuIvfpqLowerToExact(int metric, double lower)
{
	if (isnan(lower))
		return -get_float8_infinity();
	/* L2 ranks by the square of the distance the operator returns. */
	if ((gpuivfpq::Metric) metric == gpuivfpq::Metric::L2)
		return lower > 0.0 ? sqrt(lower) : 0.0;
	return lower;
}

/* The k-th smallest exact distance kept: a max-heap of k distances (NaN as +inf). */
static void
KthPush(double *heap, int64 *n, int64 k, double d)
{
	int64		i;

	if (isnan(d))
		d = get_float8_infinity();
	if (*n == k)
	{
		/* Replace the largest if d is smaller, then sift it down. */
		if (!(d < heap[0]))
			return;
		i = 0;
		for (;;)
		{
			int64		c = 2 * i + 1;

			if (c >= k)
				break;
			if (c + 1 < k && heap[c + 1] > heap[c])
				c++;
			if (!(heap[c] > d))
				break;
			heap[i] = heap[c];
			i = c;
		}
		heap[i] = d;
		return;
	}
	i = (*n)++;
	while (i > 0 && heap[(i - 1) / 2] < d)
	{
		heap[i] = heap[(i - 1) / 2];
		i = (i - 1) / 2;
	}
	heap[i] = d;
}

/* What the bounded re-rank knows of a candidate (its state). */
#define BOUNDED_UNKNOWN 0		/* not fetched yet */
#define BOUNDED_DROPPED 1		/* fetched: not kept (not visible, no vector, ...) */
#define BOUNDED_KEPT	2		/* fetched and kept, at dist */

/* A candidate to fetch in a round: its label, and whose candidate it is. */
typedef struct BoundedRequest
{
	int64		label;
	int64		query;			/* in the group */
	int64		slot;			/* candidate number of that query */
} BoundedRequest;

static bool
BoundedRequestLess(const BoundedRequest &a, const BoundedRequest &b)
{
	return std::tie(a.label, a.query, a.slot) < std::tie(b.label, b.query, b.slot);
}

/*
 * The rule of a bounded re-rank, one query at a time: walks its n
 * candidates (state, dist; in the order of their bounds lower) from *pos on
 * as a fetch in that order would, pushing each kept distance into the k-th
 * heap kth (*nkth entries), and stops before the first candidate whose
 * bound exceeds the k-th smallest distance kept, or past the last (both:
 * returns true), or at the first not fetched yet (false). *pos is then
 * where it stopped; candidates before it were walked.
 */
static bool
BoundedWalk(int metric, const uint8 *state, const double *dist, const double *lower, int64 n, int64 k,
			double *kth, int64 *nkth, int64 *pos)
{
	for (; *pos < n; (*pos)++)
	{
		int64		i = *pos;

		/* Past the k-th exact distance: no later candidate can be nearer (where bounds hold). */
		if (k > 0 && *nkth == k && GpuIvfpqLowerToExact(metric, lower[i]) > kth[0])
			return true;
		if (state[i] == BOUNDED_UNKNOWN)
			return false;
		if (state[i] == BOUNDED_KEPT && k > 0)
			KthPush(kth, nkth, k, dist[i]);
	}
	return true;
}

/* Candidates a query may ask for in one round past the k it needs first. */
#define BOUNDED_AHEAD 8

void
GpuIvfpqRerankBoundedBatch(GpuIvfpqHeapFetch *hf, const GpuIvfpqRerankSpec *spec, const float *queries,
						   int64 nq, const int64 *labels, const double *lower, int64 stride, const int *counts,
						   int64 k, GpuIvfpqHit *hits, int64 *nhits, int64 *fetched)
{
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq bounded re-rank",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	int64		total = 0;
	int64		looked = 0;
	int64		slots = Max(nq * stride, 1);
	uint8	   *state = (uint8 *) palloc_extended(slots, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	double	   *dist = (double *) palloc_extended(sizeof(double) * slots, MCXT_ALLOC_HUGE);
	ItemPointerData *row_tids = (ItemPointerData *) palloc_extended(sizeof(ItemPointerData) * slots,
																	 MCXT_ALLOC_HUGE);
	bool	   *done = (bool *) palloc0(sizeof(bool) * Max(nq, 1));
	int64	   *pos = (int64 *) palloc0(sizeof(int64) * Max(nq, 1));
	int64	   *nkth = (int64 *) palloc0(sizeof(int64) * Max(nq, 1));
	double	   *kth = (double *) palloc_extended(sizeof(double) * Max(nq * k, 1), MCXT_ALLOC_HUGE);
	BoundedRequest *req;
	GpuIvfpqHit *mine = (GpuIvfpqHit *) palloc(sizeof(GpuIvfpqHit) * Max(stride, 1));

	Assert(spec->seen == NULL && queries != NULL);
	for (int64 q = 0; q < nq; q++)
		total += Min(Max(counts[q], 0), stride);
	/* A candidate is asked for once at most: the known ones are a prefix. */
	req = (BoundedRequest *) palloc_extended(sizeof(BoundedRequest) * Max(total, 1), MCXT_ALLOC_HUGE);

	/*
	 * Rounds: each query still short walks on from where it stopped and
	 * asks for the candidates a fetch in the order of their bounds is bound
	 * to reach next (the k - kept it lacks, or once it has k those whose
	 * bound is within its k-th distance, up to BOUNDED_AHEAD); the round
	 * fetches the rows asked for in heap order, each once however many
	 * queries asked, and computes each asker's distance. A query's answer
	 * is what its walk keeps: the rows a fetch one at a time in the order of
	 * the bounds keeps, so the answers do not depend on the queries grouped
	 * together (a row fetched for one query and not reached by another's
	 * walk is never its answer). Each round advances every query it asks
	 * for, and a walk never goes back: the rounds' work is linear in the
	 * candidates.
	 */
	for (;;)
	{
		int64		nreq = 0;

		for (int64 q = 0; q < nq; q++)
		{
			int64		n = Min(Max(counts[q], 0), stride);
			const double *lq = lower + q * stride;
			double	   *kq = kth + q * k;
			int64		at;
			int64		ask;

			CHECK_FOR_INTERRUPTS();
			if (done[q])
				continue;
			done[q] = BoundedWalk(spec->metric, state + q * stride, dist + q * stride, lq, n, k, kq, &nkth[q],
								  &pos[q]);
			if (done[q])
				continue;
			at = pos[q];
			if (nkth[q] < k)
				ask = k - nkth[q];
			else if (k == 0)
				ask = n - at;
			else
			{
				/* Every candidate from at whose bound is within the k-th distance, or the first. */
				ask = 1;
				while (ask < BOUNDED_AHEAD && at + ask < n && GpuIvfpqLowerToExact(spec->metric, lq[at + ask]) <= kq[0])
					ask++;
			}
			for (int64 i = at; i < Min(at + ask, n); i++)
			{
				req[nreq].label = labels[q * stride + i];
				req[nreq].query = q;
				req[nreq].slot = i;
				nreq++;
			}
		}
		if (nreq == 0)
			break;
		/* Labels sort as (block, offset): the round reads the heap in order. */
		std::sort(req, req + nreq, BoundedRequestLess);
		for (int64 r = 0; r < nreq;)
		{
			ItemPointerData tid;
			ItemPointerData row_tid;
			int			vdim = 0;
			const float *v;
			int64		e;

			CHECK_FOR_INTERRUPTS();
			for (e = r + 1; e < nreq && req[e].label == req[r].label; e++)
				;
			GpuIvfpqLabelToTid(req[r].label, &tid);
			row_tid = tid;
			v = GpuIvfpqHeapFetchVector(hf, &row_tid, &vdim);
			looked++;
			for (; r < e; r++)
			{
				int64		at = req[r].query * stride + req[r].slot;

				state[at] = KeepRow(spec, queries + req[r].query * spec->dim, v, vdim, &dist[at])
					? BOUNDED_KEPT : BOUNDED_DROPPED;
				row_tids[at] = spec->index_tids ? tid : row_tid;
			}
		}
	}

	/* Each query's kept rows, those its walk passed, in GpuIvfpqHitLess order, a row once. */
	for (int64 q = 0; q < nq; q++)
	{
		int64		nm = 0;
		int64		kept = 0;

		for (int64 i = 0; i < pos[q]; i++)
			if (state[q * stride + i] == BOUNDED_KEPT)
			{
				mine[nm].dist = dist[q * stride + i];
				mine[nm].tid = row_tids[q * stride + i];
				nm++;
			}
		GpuIvfpqSortHits(mine, nm);
		/* A label twice (never from a sound index): equal rows sort next to each other. */
		for (int64 i = 0; i < nm && kept < k; i++)
			if (kept == 0 || !ItemPointerEquals(&hits[q * k + kept - 1].tid, &mine[i].tid))
				hits[q * k + kept++] = mine[i];
		nhits[q] = kept;
		CHECK_FOR_INTERRUPTS();
	}
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	if (fetched != NULL)
		*fetched = looked;
}

int64
GpuIvfpqKeepVisible(GpuIvfpqHeapFetch *hf, const GpuIvfpqVisibleRows *visible, const int64 *labels,
					const double *exact, int64 n, int64 limit, GpuIvfpqHit *hits)
{
	int64		nhits = 0;

	for (int64 i = 0; i < n && nhits < limit; i++)
	{
		bool		dup = false;
		ItemPointerData tid;

		GpuIvfpqLabelToTid(labels[i], &tid);
		/* A TID twice (never in a sound index): equal rows are adjacent in this order. */
		for (int64 j = nhits - 1; j >= 0 && hits[j].dist == exact[i]; j--)
			dup |= ItemPointerEquals(&hits[j].tid, &tid);
		if (dup)
			continue;
		if (visible != NULL && GpuIvfpqVisibleRowsHas(visible, &tid))
		{
			hits[nhits].dist = exact[i];
			hits[nhits].tid = tid;
			nhits++;
			continue;
		}
		if (GpuIvfpqHeapFetchVisible(hf, &tid))
		{
			hits[nhits].dist = exact[i];
			hits[nhits].tid = tid;
			nhits++;
		}
		CHECK_FOR_INTERRUPTS();
	}
	return nhits;
}

GpuIvfpqVisibleRows *
GpuIvfpqVisibleRowsBuild(Relation heap, Snapshot snapshot, Size limit)
{
	BlockNumber nblocks = RelationGetNumberOfBlocks(heap);
	Size		bytes = (Size) nblocks * GPU_IVFPQ_VISIBLE_WORDS * sizeof(uint64);
	GpuIvfpqVisibleRows *v;
	TableScanDesc scan;
	TupleTableSlot *slot;

	if (bytes > limit)
		return NULL;
	v = (GpuIvfpqVisibleRows *) palloc(sizeof(GpuIvfpqVisibleRows));
	v->nblocks = nblocks;
	v->bits = (uint64 *) palloc_extended(Max(bytes, sizeof(uint64)), MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	slot = table_slot_create(heap, NULL);
	scan = table_beginscan(heap, snapshot, 0, NULL);
	while (table_scan_getnextslot(scan, ForwardScanDirection, slot))
	{
		BlockNumber blk = ItemPointerGetBlockNumber(&slot->tts_tid);
		OffsetNumber off = ItemPointerGetOffsetNumber(&slot->tts_tid);

		/* Blocks added since the size was read: their rows are fetched instead. */
		if (blk < nblocks && off <= MaxHeapTuplesPerPage)
			v->bits[(Size) blk * GPU_IVFPQ_VISIBLE_WORDS + (off - 1) / 64] |= UINT64CONST(1) << ((off - 1) % 64);
		CHECK_FOR_INTERRUPTS();
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	return v;
}

HTAB *
GpuIvfpqTidSetCreate(MemoryContext cxt)
{
	HASHCTL		hctl;

	memset(&hctl, 0, sizeof(hctl));
	hctl.keysize = sizeof(ItemPointerData);
	hctl.entrysize = sizeof(ItemPointerData);
	hctl.hcxt = cxt;
	return hash_create("gpu_ivfpq seen TIDs", 256, &hctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}
