// Heap access by TID for the search functions (see heap_fetch.h).
#include "common/rerank.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "catalog/index.h"
#include "commands/defrem.h"
#include "executor/executor.h"
}

void
GpuIvfpqHeapFetchBegin(GpuIvfpqHeapFetch *hf, Relation heap, Relation index, Snapshot snapshot)
{
	hf->heap = heap;
	hf->index = index;
	hf->snapshot = snapshot;
	hf->indexInfo = BuildIndexInfo(index);
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

	MemoryContextReset(hf->rowctx);
	old = MemoryContextSwitchTo(hf->rowctx);
	if (table_index_fetch_tuple(hf->fetch, tid, hf->snapshot, hf->slot, &call_again, &all_dead))
	{
		ResetExprContext(GetPerTupleExprContext(hf->estate));
		FormIndexDatum(hf->indexInfo, hf->slot, hf->estate, values, isnull);
		if (!isnull[0])
			v = GpuIvfpqStoredVector(DatumGetArrayTypeP(values[0]), dim);
		ExecClearTuple(hf->slot);
	}
	MemoryContextSwitchTo(old);
	return v;
}

void
GpuIvfpqHeapFetchEnd(GpuIvfpqHeapFetch *hf)
{
	table_index_fetch_end(hf->fetch);
	ExecDropSingleTupleTableSlot(hf->slot);
	FreeExecutorState(hf->estate);
	MemoryContextDelete(hf->rowctx);
}

Relation
GpuIvfpqOpenIndex(Oid relid)
{
	Relation	index = relation_open(relid, AccessShareLock);

	if (index->rd_rel->relkind != RELKIND_INDEX ||
		index->rd_rel->relam != get_index_am_oid("gpu_ivfpq", false))
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a gpu_ivfpq index", RelationGetRelationName(index)),
				 errhint("Pass an index created with USING gpu_ivfpq.")));
	return index;
}
