// The one re-rank module: candidates (heap TIDs as 64-bit labels) -> the
// rows visible to a snapshot -> exact distances -> (distance, TID) order.
// The index scan and every search function use it, so they agree on
// visibility and on order (NaN distances, a cosine with a zero vector, last).
#pragma once

#include "am/am.h"

/* One re-ranked row. */
typedef struct GpuIvfpqHit
{
	double		dist;
	ItemPointerData tid;
} GpuIvfpqHit;

/*
 * The total order of results: by exact distance with NaN after every number
 * (as float8 sorts in SQL), then by TID so equal distances come back in the
 * same order every time.
 */
static inline bool
GpuIvfpqHitLess(const GpuIvfpqHit &a, const GpuIvfpqHit &b)
{
	bool		anan = isnan(a.dist);
	bool		bnan = isnan(b.dist);

	if (anan != bnan)
		return bnan;
	if (!anan && a.dist != b.dist)
		return a.dist < b.dist;
	return ItemPointerCompare((ItemPointer) &a.tid, (ItemPointer) &b.tid) < 0;
}

/* Sorts hits in GpuIvfpqHitLess order. */
extern void GpuIvfpqSortHits(GpuIvfpqHit *hits, int64 n);

/*
 * Hits of any number in GpuIvfpqHitLess order within work_mem: a tuplesort
 * of (distance, TID) that spills to disk past it, and with a bound keeps
 * only the bound nearest (tuplesort's bounded heap). For functions whose
 * answers are not bounded by k (range search).
 */
typedef struct GpuIvfpqHitSort GpuIvfpqHitSort;

/* bound 0: every hit. */
extern GpuIvfpqHitSort *GpuIvfpqHitSortBegin(int64 bound);
extern void GpuIvfpqHitSortPut(GpuIvfpqHitSort *s, const GpuIvfpqHit *hit);
/* After the last put: the next hit in order, a hit equal to the one before skipped; false at the end. */
extern bool GpuIvfpqHitSortNext(GpuIvfpqHitSort *s, GpuIvfpqHit *hit);
extern void GpuIvfpqHitSortEnd(GpuIvfpqHitSort *s);

/* Heap access by TID for re-ranking (one per scan or function call). */
typedef struct GpuIvfpqHeapFetch
{
	Snapshot	snapshot;
	IndexInfo  *indexInfo;
	GpuIvfpqVectorFormat format;	/* of the indexed vector */
	EState	   *estate;
	TupleTableSlot *slot;
	IndexFetchTableData *fetch;
	MemoryContext rowctx;		/* reset per row */
	Relation	heap;			/* its owner runs the index's expressions */
	bool		as_owner;		/* within GpuIvfpqRerank's owner scope */
} GpuIvfpqHeapFetch;

/*
 * The index's key columns of the row in slot (FormIndexDatum) into values
 * and isnull, and whether the row satisfies predicate (NULL: none). An
 * index's expressions and predicate are its table owner's code: they run
 * as heap's owner (GpuIvfpqBecomeOwner), never with the caller's
 * privileges. Plain columns and no predicate need none of it.
 */
extern bool GpuIvfpqFormIndexRow(IndexInfo *indexInfo, ExprState *predicate, TupleTableSlot *slot,
								 EState *estate, Relation heap, Datum *values, bool *isnull);

extern void GpuIvfpqHeapFetchBegin(GpuIvfpqHeapFetch *hf, Relation heap, Relation index,
								   Snapshot snapshot);
/*
 * The indexed vector of the row at tid if visible and not NULL (valid until
 * the next call). An index's TID of a HOT chain is the chain's root: on
 * return *tid is the visible row's own TID (its ctid).
 */
extern const float *GpuIvfpqHeapFetchVector(GpuIvfpqHeapFetch *hf, ItemPointer tid, int *dim);
extern void GpuIvfpqHeapFetchEnd(GpuIvfpqHeapFetch *hf);
/* Whether a row at tid is visible to hf's snapshot; *tid becomes the visible row's own TID. */
extern bool GpuIvfpqHeapFetchVisible(GpuIvfpqHeapFetch *hf, ItemPointer tid);

/* What GpuIvfpqRerank measures against and keeps. */
typedef struct GpuIvfpqRerankSpec
{
	int			metric;
	const float *query;			/* NULL: no distances (NaN), rows in heap order */
	int			dim;
	bool		bounded;		/* keep only rows with distance <= radius */
	double		radius;
	HTAB	   *seen;			/* if set: TIDs re-ranked before are skipped, new ones added */
	/*
	 * Hits keep the index's TIDs (an index scan's, which the executor
	 * follows along a HOT chain from its root), else the rows' own TIDs
	 * (functions, whose callers join on ctid).
	 */
	bool		index_tids;
} GpuIvfpqRerankSpec;

/*
 * Re-ranks n candidate labels (sorted in place: heap order, duplicates
 * skipped): fetches each row visible to hf's snapshot, computes its exact
 * distance, and writes the kept rows to hits (room for n) in
 * GpuIvfpqHitLess order. Returns how many were kept; *fetched (if not NULL)
 * counts the candidates looked up.
 */
extern int64 GpuIvfpqRerank(GpuIvfpqHeapFetch *hf, const GpuIvfpqRerankSpec *spec, int64 *labels,
							int64 n, GpuIvfpqHit *hits, int64 *fetched);

/*
 * Re-ranks one candidate label as GpuIvfpqRerank re-ranks each (seen,
 * visibility, dimension, radius): true with *hit set when the row is kept.
 */
extern bool GpuIvfpqRerankOne(GpuIvfpqHeapFetch *hf, const GpuIvfpqRerankSpec *spec, int64 label,
							  GpuIvfpqHit *hit, int64 *fetched);

/*
 * A lower bound of the GPU or the CPU engine (RaBitQ codes rank candidates
 * by them, in the metric's ranking units: squared for L2) as a bound of the
 * exact distance the operators return; -inf for a value that is not a
 * number (then it prunes nothing).
 */
extern double GpuIvfpqLowerToExact(int metric, double lower);

/*
 * Re-ranks the candidates of nq queries (queries: nq x spec->dim; query q's
 * are labels[q * stride ...] and their lower bounds lower[q * stride ...],
 * counts[q] of them, ascending, in ranking units: squared for L2) by those
 * bounds: for each query, as if it fetched its candidates in that order
 * and stopped before the first whose bound exceeds the k-th smallest exact
 * distance kept so far (where the bounds hold, the k nearest visible rows
 * of the candidates are among those kept). The rows are fetched in rounds
 * in heap order, a row that several queries reach once a round; the
 * answers are those of one query at a time. Writes query q's k nearest
 * kept rows to hits[q * k ...] in GpuIvfpqHitLess order (a label given
 * twice once) and their number to nhits[q]; *fetched (if not NULL) counts
 * the rows fetched. spec->query and spec->seen are not used (seen must be
 * NULL). Memory: about 40 bytes per candidate slot (nq x stride) and 8 per
 * query and k, freed on return; time linear in the candidates fetched
 * (besides each round's sort).
 */
extern void GpuIvfpqRerankBoundedBatch(GpuIvfpqHeapFetch *hf, const GpuIvfpqRerankSpec *spec,
									   const float *queries, int64 nq, const int64 *labels, const double *lower,
									   int64 stride, const int *counts, int64 k, GpuIvfpqHit *hits,
									   int64 *nhits, int64 *fetched);

/*
 * The TIDs of the rows of a table visible to a snapshot, one bit per line
 * pointer of each block: a function that checks the visibility of many
 * candidates of the whole table (the k-NN graph: k of every row) reads the
 * table once instead of fetching each candidate.
 */
typedef struct GpuIvfpqVisibleRows
{
	BlockNumber nblocks;
	uint64	   *bits;			/* nblocks x GPU_IVFPQ_VISIBLE_WORDS */
} GpuIvfpqVisibleRows;

#define GPU_IVFPQ_VISIBLE_WORDS ((MaxHeapTuplesPerPage + 63) / 64)

/*
 * The rows of heap visible to snapshot, by their own TIDs (a HOT chain's
 * visible member, not its root: a root in the set is a visible row itself);
 * NULL when the set would need more than limit bytes.
 */
extern GpuIvfpqVisibleRows *GpuIvfpqVisibleRowsBuild(Relation heap, Snapshot snapshot, Size limit);

/*
 * Whether the row at tid was visible. false also for a TID the set cannot
 * hold, and for the root of a HOT chain whose visible member lies at
 * another offset: callers then fetch the row (which finds the member).
 */
static inline bool
GpuIvfpqVisibleRowsHas(const GpuIvfpqVisibleRows *v, ItemPointer tid)
{
	BlockNumber blk = ItemPointerGetBlockNumberNoCheck(tid);
	OffsetNumber off = ItemPointerGetOffsetNumberNoCheck(tid);

	if (blk >= v->nblocks || off < 1 || off > MaxHeapTuplesPerPage)
		return false;
	return (v->bits[(Size) blk * GPU_IVFPQ_VISIBLE_WORDS + (off - 1) / 64] >> ((off - 1) % 64)) & 1;
}

/*
 * For candidates already re-ranked (exact[i] the exact distance of
 * labels[i], in GpuIvfpqHitLess order: from the GPU or the index's vector
 * copies): the first rows visible to hf's snapshot, at most limit, into
 * hits in that order (duplicates skipped). Only visibility is checked; no
 * distance is computed: a row in visible (if given, built with hf's
 * snapshot) is taken as is, any other is fetched. A kept row's TID is the
 * visible row's own (for a HOT chain, its member, as ctid shows it), so
 * callers can join on ctid. Returns how many were kept.
 */
extern int64 GpuIvfpqKeepVisible(GpuIvfpqHeapFetch *hf, const GpuIvfpqVisibleRows *visible,
								 const int64 *labels, const double *exact, int64 n, int64 limit,
								 GpuIvfpqHit *hits);

/* A hash set of TIDs for GpuIvfpqRerankSpec.seen, in cxt. */
extern HTAB *GpuIvfpqTidSetCreate(MemoryContext cxt);
