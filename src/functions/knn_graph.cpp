// gpu_ivfpq_knn_graph: the k-NN graph of a whole table, one batch search per
// chunk of its rows.
#include <cmath>

#include "functions/batch_search.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "catalog/index.h"
#include "executor/executor.h"
#include "funcapi.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(gpu_ivfpq_knn_graph);
}

typedef struct GraphOut
{
	Tuplestorestate *store;
	TupleDesc	desc;
	ItemPointerData *src;		/* the chunk's rows, by query number */
	int		   *emitted;		/* neighbours emitted per query */
	int			k;
	int64		edges;
} GraphOut;

/* One neighbour of a row; the row itself is skipped, k kept. */
static void
EmitGraphRow(void *arg, int64 query, int rank, ItemPointer tid, double dist)
{
	GraphOut   *out = (GraphOut *) arg;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};

	if (ItemPointerEquals(tid, &out->src[query]) || out->emitted[query] >= out->k)
		return;
	values[0] = PointerGetDatum(&out->src[query]);
	values[1] = Int32GetDatum(++out->emitted[query]);
	values[2] = PointerGetDatum(tid);
	values[3] = Float8GetDatum(dist);
	tuplestore_putvalues(out->store, out->desc, values, nulls);
	out->edges++;
}

/*
 * gpu_ivfpq_knn_graph(index, k): the k nearest other rows of every row of
 * the index's table: (src, rank, dst, distance). Rows are read in chunks and
 * each chunk is one batch search (one GPU request per chunk); progress goes
 * out as NOTICEs every tenth of the table; a cancel stops it between chunks.
 */
Datum
gpu_ivfpq_knn_graph(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	int32		k = PG_GETARG_INT32(1);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	const int	chunk = 16384;
	Relation	index;
	Relation	heap;
	GpuIvfpqMetaPageData meta;
	GpuIvfpqVectorFormat format;
	GpuIvfpqBatchSearch bs;
	GraphOut	out;
	IndexInfo  *indexInfo;
	EState	   *estate;
	ExprState  *predicate;
	GpuIvfpqSavedUser owner;
	TupleTableSlot *slot;
	TableScanDesc scan;
	MemoryContext rowctx;
	float	   *vecs = NULL;
	int			n = 0;
	int64		rows = 0;
	double		total;
	int			next_report = 1;
	double		visible_secs;
	instr_time	start,
				now;

	GpuIvfpqCheckBatchK(k);
	InitMaterializedSRF(fcinfo, 0);
	GpuIvfpqOpenIndexChecked(indexoid, "gpu_ivfpq", "gpu_ivfpq_knn_graph", true, &index, &heap);
	format = GpuIvfpqIndexFormat(index);
	GpuIvfpqReadMeta(index, &meta);
	/* The index's and the table's counts (a table never analyzed has reltuples -1). */
	total = Max(GpuIvfpqRowsEstimate(index, &meta), 1.0);
	memset(&out, 0, sizeof(out));
	out.store = rsinfo->setResult;
	out.desc = rsinfo->setDesc;
	out.k = k;
	out.src = (ItemPointerData *) palloc(sizeof(ItemPointerData) * chunk);
	out.emitted = (int *) palloc(sizeof(int) * chunk);
	if (meta.dimensions == 0)
	{
		/* No row has a vector yet: no graph. */
		table_close(heap, AccessShareLock);
		relation_close(index, AccessShareLock);
		PG_RETURN_VOID();
	}
	/* One more than k: each row usually finds itself first. */
	GpuIvfpqBatchBegin(&bs, index, heap, meta.dimensions, k + 1, Max(k + 1, gpu_ivfpq_rerank));
	/*
	 * Every row's k neighbours are checked for visibility: one pass over the
	 * table (its bitmap bounded by maintenance_work_mem) answers most of
	 * them, instead of a fetch each.
	 */
	INSTR_TIME_SET_CURRENT(start);
	bs.visible = GpuIvfpqVisibleRowsBuild(heap, GetActiveSnapshot(), (Size) maintenance_work_mem * 1024);
	INSTR_TIME_SET_CURRENT(now);
	INSTR_TIME_SUBTRACT(now, start);
	visible_secs = INSTR_TIME_GET_DOUBLE(now);
	vecs = (float *) palloc_extended(sizeof(float) * (Size) chunk * meta.dimensions, MCXT_ALLOC_HUGE);
	indexInfo = BuildIndexInfo(index);
	estate = CreateExecutorState();
	slot = table_slot_create(heap, NULL);
	GetPerTupleExprContext(estate)->ecxt_scantuple = slot;
	/*
	 * A partial index: only rows that satisfy its predicate are in the graph,
	 * as in the index. Prepared as the owner, who runs it (the functions it
	 * calls are the owner's to execute, not the caller's).
	 */
	GpuIvfpqBecomeOwner(heap, &owner);
	predicate = ExecPrepareQual(indexInfo->ii_Predicate, estate);
	GpuIvfpqRestoreUser(&owner);
	rowctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq graph row", ALLOCSET_DEFAULT_SIZES);
	scan = table_beginscan(heap, GetActiveSnapshot(), 0, NULL);
	INSTR_TIME_SET_CURRENT(start);
	for (;;)
	{
		bool		more = table_scan_getnextslot(scan, ForwardScanDirection, slot);

		if (more)
		{
			Datum		values[INDEX_MAX_KEYS];
			bool		isnull[INDEX_MAX_KEYS];
			MemoryContext old = MemoryContextSwitchTo(rowctx);

			ResetExprContext(GetPerTupleExprContext(estate));
			if (GpuIvfpqFormIndexRow(indexInfo, predicate, slot, estate, heap, values, isnull) &&
				!isnull[0])
			{
				int			dim;
				const float *v = GpuIvfpqStoredVector(values[0], format, &dim);

				if ((uint32) dim == meta.dimensions)
				{
					memcpy(vecs + (Size) n * dim, v, sizeof(float) * dim);
					out.src[n] = slot->tts_tid;
					out.emitted[n] = 0;
					n++;
				}
			}
			MemoryContextSwitchTo(old);
			MemoryContextReset(rowctx);
		}
		if (n == chunk || (!more && n > 0))
		{
			GpuIvfpqBatchRun(&bs, vecs, n, EmitGraphRow, &out);
			rows += n;
			n = 0;
			/* An estimate short of the rows read so far: then it is the rows read. */
			total = Max(total, (double) rows);
			if (rows >= next_report * total / 10 && next_report <= 10)
			{
				next_report = (int) Min(10.0, floor(rows * 10.0 / total)) + 1;
				INSTR_TIME_SET_CURRENT(now);
				INSTR_TIME_SUBTRACT(now, start);
				ereport(NOTICE,
						(errmsg("gpu_ivfpq_knn_graph: %lld rows done (%.0f%% of about %.0f), %.1f s",
								(long long) rows, 100.0 * rows / total, total,
								INSTR_TIME_GET_DOUBLE(now))));
			}
		}
		if (!more)
			break;
		CHECK_FOR_INTERRUPTS();
	}
	table_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	FreeExecutorState(estate);
	GpuIvfpqBatchEnd(&bs);
	INSTR_TIME_SET_CURRENT(now);
	INSTR_TIME_SUBTRACT(now, start);
	elog(DEBUG1, "gpu_ivfpq_knn_graph on \"%s\": %lld rows, %lld edges, %lld rows searched on the GPU; "
		 "visibility pass %.3f s, reading rows %.3f s, searching %.3f s, visibility and edges %.3f s; %lld wider searches",
		 RelationGetRelationName(index), (long long) rows, (long long) out.edges,
		 (long long) bs.gpu_queries, visible_secs,
		 INSTR_TIME_GET_DOUBLE(now) - bs.search_secs - bs.finish_secs, bs.search_secs, bs.finish_secs,
		 (long long) bs.widened);
	table_close(heap, AccessShareLock);
	relation_close(index, AccessShareLock);
	PG_RETURN_VOID();
}
