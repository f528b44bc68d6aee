// CREATE INDEX's full reads of the table over parallel workers: each worker
// scans its share of the blocks (a parallel table scan, as PostgreSQL's own
// parallel index builds do), decodes and checks every indexed vector and
// its filter key, and sends the rows, many to a message, through a queue of
// its own to the leader, which hands them to the build one at a time. The
// leader only receives: what it does with a row (keeping it, sampling,
// encoding) is the build's, and stays in one process.
#include "am/am.h"
#include "common/parallel_text.h"

extern "C" {
#include "access/parallel.h"
#include "access/table.h"
#include "access/xact.h"
#include "optimizer/optimizer.h"
#include "storage/shm_mq.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/snapmgr.h"
#include "utils/wait_event.h"
}

/* Keys of the parallel context's table of contents. */
#define READ_KEY_SHARED		UINT64CONST(0xB1D0000000000001)
#define READ_KEY_QUEUES		UINT64CONST(0xB1D0000000000002)
#define READ_KEY_QUERY_TEXT UINT64CONST(0xB1D0000000000003)
#define READ_KEY_USAGE		UINT64CONST(0xB1D0000000000004)

/* Each worker's queue to the leader, and the rows a message gathers. */
#define READ_QUEUE_BYTES	((Size) 1 << 20)
#define READ_MESSAGE_BYTES	((Size) 64 << 10)

/* What the leader and its workers share; the parallel table scan follows. */
typedef struct BuildReadShared
{
	Oid			heaprelid;
	Oid			indexrelid;
	bool		concurrent;
	slock_t		mutex;
	double		heap_tuples;	/* rows the workers saw, NULLs included */
	bool		broken_hot_chain;	/* a worker's ii_BrokenHotChain, ORed */
} BuildReadShared;

#define BuildReadScan(shared) \
	((ParallelTableScanDesc) ((char *) (shared) + BUFFERALIGN(sizeof(BuildReadShared))))

/* One row in a message, its vector's floats after it (the record MAXALIGNed). */
typedef struct BuildReadRow
{
	int64		key;			/* filter key (0 without a filter column) */
	ItemPointerData tid;
	int32		dim;
} BuildReadRow;

#define READ_ROW_HEADER		MAXALIGN(sizeof(BuildReadRow))
#define ReadRowBytes(dim)	MAXALIGN(READ_ROW_HEADER + (Size) (dim) * sizeof(float))

/* A worker's state while it scans. */
typedef struct BuildReadWorker
{
	GpuIvfpqVectorFormat format;
	bool		keyed;
	shm_mq_handle *queue;
	char	   *message;		/* rows gathered, MAXALIGNed */
	Size		used;
	Size		cap;
	double		seen;
	MemoryContext rowctx;		/* reset per row */
} BuildReadWorker;

extern "C" PGDLLEXPORT void gpu_ivfpq_build_read_main(dsm_segment *seg, shm_toc *toc);

/* Sends the rows gathered so far to the leader. */
static void
SendRows(BuildReadWorker *w)
{
	if (w->used == 0)
		return;
	if (shm_mq_send(w->queue, w->used, w->message, false, true) != SHM_MQ_SUCCESS)
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("the leader of a parallel gpu_ivfpq build stopped receiving rows")));
	w->used = 0;
}

/* A worker's IndexBuildCallback: one row into the message, sent when full. */
static void
WorkerRow(Relation index, ItemPointer tid, Datum *values, bool *isnull, bool tupleIsAlive, void *state)
{
	BuildReadWorker *w = (BuildReadWorker *) state;
	MemoryContext old;
	const float *v;
	int			dim;
	BuildReadRow row;
	Size		bytes;

	w->seen++;
	if (isnull[0])
		return;
	old = MemoryContextSwitchTo(w->rowctx);
	v = GpuIvfpqDatumVector(values[0], w->format, &dim, "indexed vector");
	/* Before the copy: the message holds one row of the largest dimension. */
	GpuIvfpqCheckIndexableDim(dim);
	row.key = w->keyed ? GpuIvfpqFilterKeyOf(index, values[1], isnull[1]) : 0;
	row.tid = *tid;
	row.dim = dim;
	bytes = ReadRowBytes(dim);
	if (w->used + bytes > w->cap)
		SendRows(w);
	memcpy(w->message + w->used, &row, sizeof(row));
	memcpy(w->message + w->used + READ_ROW_HEADER, v, (Size) dim * sizeof(float));
	w->used += bytes;
	MemoryContextSwitchTo(old);
	MemoryContextReset(w->rowctx);
}

/* The lock modes index.c holds for a build, plain or concurrent. */
static void
BuildLockModes(bool concurrent, LOCKMODE *heap_mode, LOCKMODE *index_mode)
{
	*heap_mode = concurrent ? ShareUpdateExclusiveLock : ShareLock;
	*index_mode = concurrent ? RowExclusiveLock : AccessExclusiveLock;
}

/* A parallel worker: scans its share of the table into its queue. */
void
gpu_ivfpq_build_read_main(dsm_segment *seg, shm_toc *toc)
{
	BuildReadShared *shared = (BuildReadShared *) shm_toc_lookup(toc, READ_KEY_SHARED, false);
	char	   *queues = (char *) shm_toc_lookup(toc, READ_KEY_QUEUES, false);
	shm_mq	   *mq = (shm_mq *) (queues + (Size) ParallelWorkerNumber * READ_QUEUE_BYTES);
	LOCKMODE	heap_mode;
	LOCKMODE	index_mode;
	Relation	heap;
	Relation	index;
	IndexInfo  *indexInfo;
	BuildReadWorker w;
	TableScanDesc scan;

	GpuIvfpqParallelTextRestore(toc, READ_KEY_QUERY_TEXT);
	GpuIvfpqParallelUsageStart();
	BuildLockModes(shared->concurrent, &heap_mode, &index_mode);
	heap = table_open(shared->heaprelid, heap_mode);
	index = index_open(shared->indexrelid, index_mode);
	indexInfo = BuildIndexInfo(index);
	indexInfo->ii_Concurrent = shared->concurrent;

	shm_mq_set_sender(mq, MyProc);
	memset(&w, 0, sizeof(w));
	w.queue = shm_mq_attach(mq, seg, NULL);
	w.format = GpuIvfpqIndexFormat(index);
	w.keyed = GpuIvfpqHasFilterColumn(index);
	w.cap = READ_MESSAGE_BYTES + ReadRowBytes(GPU_IVFPQ_MAX_DIM);
	w.message = (char *) palloc(w.cap);
	w.rowctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq parallel read row",
									 ALLOCSET_DEFAULT_SIZES);

	scan = table_beginscan_parallel(heap, BuildReadScan(shared));
	(void) table_index_build_scan(heap, index, indexInfo, true, false, WorkerRow, &w, scan);
	SendRows(&w);

	SpinLockAcquire(&shared->mutex);
	shared->heap_tuples += w.seen;
	shared->broken_hot_chain |= indexInfo->ii_BrokenHotChain;
	SpinLockRelease(&shared->mutex);
	shm_mq_detach(w.queue);
	index_close(index, index_mode);
	table_close(heap, heap_mode);
	GpuIvfpqParallelUsageEnd(toc, READ_KEY_USAGE);
}

/* Ends what GpuIvfpqBuildReadParallel began (also when it backs out). */
static void
EndParallelRead(ParallelContext *pcxt, Snapshot snapshot)
{
	if (IsMVCCSnapshot(snapshot))
		UnregisterSnapshot(snapshot);
	DestroyParallelContext(pcxt);
	ExitParallelMode();
}

/* Hands the rows of one message to the build. */
static void
TakeRows(const char *data, Size nbytes, GpuIvfpqBuildRowFn fn, void *state)
{
	Size		at = 0;

	while (at < nbytes)
	{
		BuildReadRow row;

		if (nbytes - at < READ_ROW_HEADER)
			elog(ERROR, "truncated row in a parallel gpu_ivfpq build's message");
		memcpy(&row, data + at, sizeof(row));
		if (row.dim < 1 || row.dim > GPU_IVFPQ_MAX_DIM || ReadRowBytes(row.dim) > nbytes - at)
			elog(ERROR, "malformed row in a parallel gpu_ivfpq build's message");
		fn(state, &row.tid, (const float *) (data + at + READ_ROW_HEADER), row.dim, row.key);
		at += ReadRowBytes(row.dim);
	}
}

/*
 * Reads every row of heap that CREATE INDEX indexes (the snapshot and rules
 * of table_index_build_scan) over parallel workers, as many as
 * plan_create_index_workers allows, and calls fn for each non-NULL vector
 * (its dimension unchecked: the caller checks it) in no particular order.
 * Returns false, having read nothing, when no worker can be had: the caller
 * then reads the table itself. *heap_tuples gets the rows seen, NULLs
 * included. An error in a worker (a vector that cannot be indexed) is
 * raised here.
 */
bool
GpuIvfpqBuildReadParallel(Relation heap, Relation index, IndexInfo *indexInfo, GpuIvfpqBuildRowFn fn,
						  void *state, double *heap_tuples)
{
	int			request;
	ParallelContext *pcxt;
	Snapshot	snapshot;
	Size		shared_bytes;
	BuildReadShared *shared;
	char	   *queues;
	int			nworkers;
	shm_mq_handle **handles;
	int			open;

	if (RelationUsesLocalBuffers(heap))
		return false;
	request = plan_create_index_workers(RelationGetRelid(heap), RelationGetRelid(index));
	/* No queue for workers that cannot start (a table's parallel_workers may ask for 1024). */
	request = Min(request, max_parallel_workers);
	if (request <= 0)
		return false;

	EnterParallelMode();
	pcxt = CreateParallelContext("gpu_ivfpq", "gpu_ivfpq_build_read_main", request);
	/* As PostgreSQL's own parallel builds: any tuple for a plain build, an MVCC snapshot for a concurrent one. */
	snapshot = indexInfo->ii_Concurrent ? RegisterSnapshot(GetTransactionSnapshot()) : SnapshotAny;
	shared_bytes = add_size(BUFFERALIGN(sizeof(BuildReadShared)), table_parallelscan_estimate(heap, snapshot));
	shm_toc_estimate_chunk(&pcxt->estimator, shared_bytes);
	shm_toc_estimate_chunk(&pcxt->estimator, mul_size(READ_QUEUE_BYTES, request));
	shm_toc_estimate_keys(&pcxt->estimator, 2);
	GpuIvfpqParallelTextEstimate(pcxt);
	GpuIvfpqParallelUsageEstimate(pcxt);
	InitializeParallelDSM(pcxt);
	if (pcxt->seg == NULL)
	{
		/* No dynamic shared memory to be had: read serially. */
		EndParallelRead(pcxt, snapshot);
		return false;
	}

	shared = (BuildReadShared *) shm_toc_allocate(pcxt->toc, shared_bytes);
	shared->heaprelid = RelationGetRelid(heap);
	shared->indexrelid = RelationGetRelid(index);
	shared->concurrent = indexInfo->ii_Concurrent;
	SpinLockInit(&shared->mutex);
	shared->heap_tuples = 0;
	shared->broken_hot_chain = false;
	table_parallelscan_initialize(heap, BuildReadScan(shared), snapshot);
	shm_toc_insert(pcxt->toc, READ_KEY_SHARED, shared);
	queues = (char *) shm_toc_allocate(pcxt->toc, mul_size(READ_QUEUE_BYTES, request));
	for (int i = 0; i < request; i++)
		shm_mq_set_receiver(shm_mq_create(queues + (Size) i * READ_QUEUE_BYTES, READ_QUEUE_BYTES), MyProc);
	shm_toc_insert(pcxt->toc, READ_KEY_QUEUES, queues);
	GpuIvfpqParallelTextStore(pcxt, READ_KEY_QUERY_TEXT);
	GpuIvfpqParallelUsageStore(pcxt, READ_KEY_USAGE);

	LaunchParallelWorkers(pcxt);
	nworkers = pcxt->nworkers_launched;
	if (nworkers == 0)
	{
		EndParallelRead(pcxt, snapshot);
		return false;
	}
	elog(DEBUG1, "gpu_ivfpq build: reading table \"%s\" with %d parallel workers",
		 RelationGetRelationName(heap), nworkers);

	/* A worker that dies unattached detaches its queue: the handle tells. */
	handles = (shm_mq_handle **) palloc(sizeof(shm_mq_handle *) * nworkers);
	for (int i = 0; i < nworkers; i++)
		handles[i] = shm_mq_attach((shm_mq *) (queues + (Size) i * READ_QUEUE_BYTES), pcxt->seg,
								   pcxt->worker[i].bgwhandle);
	open = nworkers;
	while (open > 0)
	{
		bool		took = false;

		for (int i = 0; i < nworkers; i++)
		{
			Size		nbytes;
			void	   *data;
			shm_mq_result res;

			if (handles[i] == NULL)
				continue;
			res = shm_mq_receive(handles[i], &nbytes, &data, true);
			if (res == SHM_MQ_SUCCESS)
			{
				TakeRows((const char *) data, nbytes, fn, state);
				took = true;
			}
			else if (res == SHM_MQ_DETACHED)
			{
				/* Done, or failed: a failure is raised by the checks below. */
				shm_mq_detach(handles[i]);
				handles[i] = NULL;
				open--;
			}
		}
		CHECK_FOR_INTERRUPTS();
		if (!took && open > 0)
		{
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_EXIT_ON_PM_DEATH, -1L,
							 WAIT_EVENT_PARALLEL_CREATE_INDEX_SCAN);
			ResetLatch(MyLatch);
		}
	}
	pfree(handles);
	/* Raises a worker's error, if any. */
	WaitForParallelWorkersToFinish(pcxt);
	GpuIvfpqParallelUsageAccum(pcxt, READ_KEY_USAGE);
	*heap_tuples = shared->heap_tuples;
	/* As the workers found the HOT chains: pg_index.indcheckxmin follows. */
	if (shared->broken_hot_chain)
		indexInfo->ii_BrokenHotChain = true;
	EndParallelRead(pcxt, snapshot);
	return true;
}
