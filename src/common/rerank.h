// Fetching indexed vectors from heap rows by TID, for the functions that
// re-rank or filter candidates with exact distances (range and batch search).
#pragma once

#include "am/am.h"

typedef struct GpuIvfpqHeapFetch
{
	Relation	heap;
	Relation	index;
	Snapshot	snapshot;
	IndexInfo  *indexInfo;
	EState	   *estate;
	TupleTableSlot *slot;
	IndexFetchTableData *fetch;
	MemoryContext rowctx;		/* reset per row */
} GpuIvfpqHeapFetch;

extern void GpuIvfpqHeapFetchBegin(GpuIvfpqHeapFetch *hf, Relation heap, Relation index,
								   Snapshot snapshot);
/* The indexed vector of the row at tid if visible and not NULL (valid until the next call). */
extern const float *GpuIvfpqHeapFetchVector(GpuIvfpqHeapFetch *hf, ItemPointer tid, int *dim);
extern void GpuIvfpqHeapFetchEnd(GpuIvfpqHeapFetch *hf);

/* Opens a gpu_ivfpq index (AccessShareLock), or errors for another kind of relation. */
extern Relation GpuIvfpqOpenIndex(Oid relid);
