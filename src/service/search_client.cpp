// The backends' side of the GPU service: search, load, train and encode
// requests through a shared-memory slot and a latch; the change log that
// keeps mirrors coherent (inserts append, VACUUM and rebuilds invalidate,
// DROP forgets); and gpu_ivfpq_prewarm().
#include "service/shmem.h"

extern "C" {
#include "access/xlog.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_class.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/syscache.h"
#include "utils/wait_event.h"

PG_FUNCTION_INFO_V1(gpu_ivfpq_prewarm);
}

#include "engine/ivfpq.h"

static GpuIvfpqSlot *my_slot = NULL;
static object_access_hook_type prev_object_access_hook = NULL;

/* ---- counters ---- */

void
GpuIvfpqCountCpuQuery(void)
{
	if (gpu_ivfpq_service != NULL)
		pg_atomic_fetch_add_u64(&gpu_ivfpq_service->queries_cpu, 1);
}

static void
CountFallback(void)
{
	pg_atomic_fetch_add_u64(&gpu_ivfpq_service->fallbacks, 1);
}

/* ---- availability ---- */

bool
GpuIvfpqServiceServing(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	bool		serving;

	if (s == NULL)
		return false;
	SpinLockAcquire(&s->mutex);
	serving = s->pid != 0 && (s->state == SERVICE_GPU || s->state == SERVICE_EMULATED);
	SpinLockRelease(&s->mutex);
	return serving;
}

/*
 * Why the GPU cannot serve this index, or NULL when it can. Indexes of a
 * standby are not mirrored: WAL replay changes their pages without the
 * change log.
 */
static const char *
NotServableReason(const GpuIvfpqMetaPageData *meta)
{
	if (gpu_ivfpq_service == NULL)
		return "The extension gpu_ivfpq is not in shared_preload_libraries";
	if (!GpuIvfpqServiceServing())
		return "The gpu_ivfpq service has no GPU or is not running";
	if (RecoveryInProgress())
		return "Indexes are not mirrored on a standby";
	if (!meta->trained)
		return "The index has no trained quantizers";
	if ((int) meta->dimensions > GPU_IVFPQ_SERVICE_MAX_DIM)
		return "The GPU path handles up to 8192 dimensions";
	if (meta->m > GPU_IVFPQ_SERVICE_MAX_M)
		return "The GPU path handles up to m = 64 sub-quantizers";
	return NULL;
}

/*
 * Should this scan or build try the service? With device = gpu always (it
 * then fails with the reason when the service cannot serve).
 */
bool
GpuIvfpqServiceWanted(void)
{
	return gpu_ivfpq_device == GPU_IVFPQ_DEVICE_GPU ||
		(gpu_ivfpq_device == GPU_IVFPQ_DEVICE_AUTO && gpu_ivfpq_service != NULL);
}

void
GpuIvfpqGpuRequiredError(const char *what, const char *reason)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("gpu_ivfpq.device is \"gpu\" but the GPU cannot serve this %s", what),
			 errdetail("%s.", reason),
			 errhint("Set gpu_ivfpq.device to \"auto\" to fall back to the CPU engine.")));
}

/* ---- slots ---- */

static void
ReleaseSlot(int code, Datum arg)
{
	GpuIvfpqSlot *slot = my_slot;

	if (slot == NULL)
		return;
	SpinLockAcquire(&slot->mutex);
	/* Unowned now; a request still in flight is freed by the service. */
	slot->owner = 0;
	if (slot->state == SLOT_PENDING || slot->state == SLOT_RUNNING)
		slot->state = SLOT_ABANDONED;
	else
		slot->state = SLOT_FREE;
	SpinLockRelease(&slot->mutex);
	my_slot = NULL;
}

/* This backend's slot, if it is free for a new request (else NULL). */
GpuIvfpqSlot *
GpuIvfpqAcquireSlot(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	if (my_slot == NULL)
	{
		for (int i = 0; i < s->nslots && my_slot == NULL; i++)
		{
			GpuIvfpqSlot *slot = &s->slots[i];

			SpinLockAcquire(&slot->mutex);
			if (slot->owner == 0 && slot->state == SLOT_FREE)
			{
				slot->owner = MyProcPid;
				my_slot = slot;
			}
			SpinLockRelease(&slot->mutex);
		}
		if (my_slot == NULL)
			return NULL;
		on_shmem_exit(ReleaseSlot, (Datum) 0);
	}
	{
		bool		ready;

		SpinLockAcquire(&my_slot->mutex);
		ready = my_slot->state == SLOT_FREE;
		SpinLockRelease(&my_slot->mutex);
		return ready ? my_slot : NULL;	/* still busy with an abandoned request */
	}
}

/*
 * Submits the filled slot and sleeps on the latch until the service answers.
 * A cancel or statement_timeout while waiting leaves the request to the
 * service (which frees the slot) and raises the error; a service that exits
 * answers RES_SERVICE_GONE. On return the slot is DONE: read it, then
 * GpuIvfpqFinishSlot.
 */
RequestResult
GpuIvfpqSubmitAndWait(GpuIvfpqSlot *slot)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	Latch	   *service_latch;

	SpinLockAcquire(&s->mutex);
	service_latch = s->pid != 0 ? s->latch : NULL;
	SpinLockRelease(&s->mutex);
	if (service_latch == NULL)
		return RES_SERVICE_GONE;

	SpinLockAcquire(&slot->mutex);
	slot->latch = MyLatch;
	slot->state = SLOT_PENDING;
	SpinLockRelease(&slot->mutex);
	SetLatch(service_latch);

	PG_TRY();
	{
		for (;;)
		{
			SlotState	st;
			int			pid;

			SpinLockAcquire(&slot->mutex);
			st = slot->state;
			SpinLockRelease(&slot->mutex);
			if (st == SLOT_DONE)
				break;
			SpinLockAcquire(&s->mutex);
			pid = s->pid;
			SpinLockRelease(&s->mutex);
			if (pid == 0)
			{
				/* Gone without answering (its exit hook answers; this is the backstop). */
				SpinLockAcquire(&slot->mutex);
				if (slot->state != SLOT_DONE)
				{
					slot->result = RES_SERVICE_GONE;
					slot->state = SLOT_DONE;
				}
				SpinLockRelease(&slot->mutex);
				break;
			}
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 100L,
							 PG_WAIT_EXTENSION);
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
	}
	PG_CATCH();
	{
		SpinLockAcquire(&slot->mutex);
		if (slot->state == SLOT_PENDING || slot->state == SLOT_DONE)
			slot->state = SLOT_FREE;
		else if (slot->state == SLOT_RUNNING)
			slot->state = SLOT_ABANDONED;
		SpinLockRelease(&slot->mutex);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return slot->result;
}

void
GpuIvfpqFinishSlot(GpuIvfpqSlot *slot)
{
	SpinLockAcquire(&slot->mutex);
	slot->state = SLOT_FREE;
	SpinLockRelease(&slot->mutex);
}

static void
FillKey(GpuIvfpqKey *key, Relation index, const GpuIvfpqMetaPageData *meta)
{
	key->db = MyDatabaseId;
	key->index = RelationGetRelid(index);
	key->relnode = index->rd_node.relNode;
	key->build = meta->build_id;
}

/* ---- change log ---- */

static uint64
LogPush(const GpuIvfpqLogEntry *entry)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	uint64		seq;

	LWLockAcquire(s->log_lock, LW_EXCLUSIVE);
	seq = s->log_head++;
	s->log[seq % GPU_IVFPQ_LOG_SIZE] = *entry;
	s->log[seq % GPU_IVFPQ_LOG_SIZE].seq = seq;
	LWLockRelease(s->log_lock);
	return seq;
}

/*
 * Called by aminsert after the entry is on its page: the mirror (if any)
 * gets it before the service serves a request sent after this point.
 */
void
GpuIvfpqServiceLogAppend(Relation index, const GpuIvfpqMetaPageData *meta, int list,
						 int64 label, const uint8 *code)
{
	GpuIvfpqLogEntry e;

	if (gpu_ivfpq_service == NULL || !meta->trained || meta->m > GPU_IVFPQ_SERVICE_MAX_M)
		return;
	memset(&e, 0, offsetof(GpuIvfpqLogEntry, code));
	FillKey(&e.key, index, meta);
	e.kind = LOG_APPEND;
	e.m = (uint8) meta->m;
	e.list = list;
	e.label = label;
	memcpy(e.code, code, meta->m);
	(void) LogPush(&e);
}

static void
LogInvalidate(Oid indexoid, bool wait)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	GpuIvfpqLogEntry e;
	uint64		seq;

	if (s == NULL)
		return;
	memset(&e, 0, sizeof(e));
	e.key.db = MyDatabaseId;
	e.key.index = indexoid;
	e.kind = LOG_INVALIDATE;
	seq = LogPush(&e);
	{
		Latch	   *latch;

		SpinLockAcquire(&s->mutex);
		latch = s->pid != 0 ? s->latch : NULL;
		SpinLockRelease(&s->mutex);
		if (latch != NULL)
			SetLatch(latch);	/* frees the memory now, not at the next request */
	}

	/* Wait until the service has applied it: no batch after that uses the old mirror. */
	while (wait)
	{
		Latch	   *latch;

		SpinLockAcquire(&s->mutex);
		latch = s->pid != 0 ? s->latch : NULL;
		SpinLockRelease(&s->mutex);
		if (latch == NULL || pg_atomic_read_u64(&s->log_applied) > seq)
			break;
		SetLatch(latch);
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10L,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * VACUUM removed or moved entries (before the heap may reuse their TIDs),
 * or a build wrote a new version: the mirror must go before any later search.
 */
void
GpuIvfpqServiceInvalidate(Relation index, bool wait)
{
	LogInvalidate(RelationGetRelid(index), wait);
}

/* DROP INDEX: the mirror of a dropped gpu_ivfpq index is freed. */
static void
ObjectAccess(ObjectAccessType access, Oid classId, Oid objectId, int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);
	if (access == OAT_DROP && classId == RelationRelationId && subId == 0 &&
		gpu_ivfpq_service != NULL)
	{
		HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(objectId));

		if (HeapTupleIsValid(tup))
		{
			Form_pg_class rel = (Form_pg_class) GETSTRUCT(tup);
			bool		ours = rel->relkind == RELKIND_INDEX &&
				rel->relam == get_index_am_oid("gpu_ivfpq", true);

			ReleaseSysCache(tup);
			if (ours)
				LogInvalidate(objectId, false);
		}
	}
}

void
GpuIvfpqServiceInstallHooks(void)
{
	prev_object_access_hook = object_access_hook;
	object_access_hook = ObjectAccess;
}

/* ---- mirror loading ---- */

/*
 * Reads every entry of the index from its pages into a DSM segment and asks
 * the service to mirror them. Changes logged after log_start are applied by
 * the service, so inserts running meanwhile are not lost.
 */
static RequestResult
LoadMirror(GpuIvfpqSlot *slot, Relation index, const GpuIvfpqMetaPageData *meta,
		   int64 *entries, char *error, Size errlen)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	gpuivfpq::IvfPqModel *model = GpuIvfpqGetModel(index, meta);
	GpuIvfpqListDirEntry *dir = GpuIvfpqReadListDir(index, meta);
	int			m = meta->m;
	int			esz = GpuIvfpqEntrySize(m);
	int64		n = 0;
	int64		cap = 1024;
	int32	   *lists = (int32 *) palloc(sizeof(int32) * cap);
	int64	   *labels = (int64 *) palloc(sizeof(int64) * cap);
	uint8	   *codes = (uint8 *) palloc((Size) cap * m);
	uint64		log_start;
	GpuIvfpqDsmHeader h;
	GpuIvfpqDsmLayout l;
	dsm_segment *seg;
	char	   *base;
	RequestResult result;

	LWLockAcquire(s->log_lock, LW_SHARED);
	log_start = s->log_head;
	LWLockRelease(s->log_lock);

	for (uint32 list = 0; list < meta->lists; list++)
		GpuIvfpqWalkList(index, dir[list].head, m, [&](const char *ent, int cnt) {
			if (n + cnt > cap)
			{
				cap = Max(cap * 2, n + cnt);
				lists = (int32 *) repalloc_huge(lists, sizeof(int32) * cap);
				labels = (int64 *) repalloc_huge(labels, sizeof(int64) * cap);
				codes = (uint8 *) repalloc_huge(codes, (Size) cap * m);
			}
			for (int i = 0; i < cnt; i++)
			{
				ItemPointerData tid;

				memcpy(&tid, ent + (Size) i * esz, GPU_IVFPQ_TID_BYTES);
				lists[n] = (int32) list;
				labels[n] = GpuIvfpqTidToLabel(&tid);
				memcpy(codes + (Size) n * m, ent + (Size) i * esz + GPU_IVFPQ_TID_BYTES, m);
				n++;
			}
		});

	memset(&h, 0, sizeof(h));
	h.d = meta->dimensions;
	h.lists = meta->lists;
	h.m = m;
	h.metric = meta->metric;
	h.n = n;
	l = GpuIvfpqDsmLayoutFor(REQ_LOAD, &h);
	seg = dsm_create(l.total, 0);
	base = (char *) dsm_segment_address(seg);
	memcpy(base, &h, sizeof(h));
	memcpy(base + l.centroids, model->centroids().data(), sizeof(float) * meta->lists * meta->dimensions);
	memcpy(base + l.codebooks, model->pq().codebooks().data(), sizeof(float) * 256 * meta->dimensions);
	memcpy(base + l.lists, lists, sizeof(int32) * n);
	memcpy(base + l.labels, labels, sizeof(int64) * n);
	memcpy(base + l.codes, codes, (Size) n * m);
	pfree(lists);
	pfree(labels);
	pfree(codes);

	slot->kind = REQ_LOAD;
	FillKey(&slot->key, index, meta);
	slot->n = n;
	slot->log_start = log_start;
	slot->dsm = dsm_segment_handle(seg);
	result = GpuIvfpqSubmitAndWait(slot);
	strlcpy(error, slot->error, errlen);
	GpuIvfpqFinishSlot(slot);
	dsm_detach(seg);
	*entries = n;
	return result;
}

/* ---- search ---- */

/*
 * One round of a scan on the GPU: the k best labels by ADC distance over
 * nprobe lists, as the CPU engine would rank them. Returns how many labels
 * came back, or -1 when the GPU did not serve the round (the caller then
 * runs it on the CPU; with gpu_ivfpq.device = gpu that is an error instead).
 */
int
GpuIvfpqServiceSearch(Relation index, const GpuIvfpqMetaPageData *meta, const float *query,
					  int k, int nprobe, int64 *labels, int *batch)
{
	bool		required = gpu_ivfpq_device == GPU_IVFPQ_DEVICE_GPU;
	const char *reason = NotServableReason(meta);
	GpuIvfpqSlot *slot;
	char		error[256];

	if (reason == NULL && k > GPU_IVFPQ_SERVICE_MAX_K)
		reason = "The GPU selects at most 2048 candidates per round";
	if (reason == NULL && (slot = GpuIvfpqAcquireSlot()) == NULL)
		reason = "No request slot is free";
	if (reason != NULL)
	{
		if (required)
			GpuIvfpqGpuRequiredError("scan", reason);
		return -1;
	}

	for (int attempt = 0; attempt < 2; attempt++)
	{
		RequestResult result;

		slot->kind = REQ_SEARCH;
		FillKey(&slot->key, index, meta);
		slot->dim = meta->dimensions;
		slot->k = k;
		slot->nprobe = nprobe;
		memcpy(slot->payload.bytes, query, sizeof(float) * meta->dimensions);
		result = GpuIvfpqSubmitAndWait(slot);
		if (result == RES_OK)
		{
			const int64 *out = (const int64 *) slot->payload.bytes;
			int			n = 0;

			while (n < k && out[n] >= 0)
			{
				labels[n] = out[n];
				n++;
			}
			*batch = slot->batch;
			GpuIvfpqFinishSlot(slot);
			return n;
		}
		strlcpy(error, slot->error, sizeof(error));
		GpuIvfpqFinishSlot(slot);
		if (attempt == 0 && (result == RES_NOT_LOADED || (result == RES_LOADING && required)))
		{
			int64		entries;

			result = LoadMirror(slot, index, meta, &entries, error, sizeof(error));
			if (result == RES_OK)
			{
				elog(DEBUG1, "gpu_ivfpq: index \"%s\" mirrored to the GPU (%lld entries)",
					 RelationGetRelationName(index), (long long) entries);
				continue;
			}
		}
		if (result == RES_LOADING)
			reason = "The index's GPU mirror is being loaded by another session";
		else if (result == RES_NO_MEMORY)
		{
			ereport(WARNING,
					(errmsg("gpu_ivfpq: index \"%s\" does not fit in GPU memory, using the CPU",
							RelationGetRelationName(index)),
					 errdetail("%s", error),
					 errhint("Raise gpu_ivfpq.gpu_memory_budget or drop unused indexes.")));
			reason = "The index does not fit in GPU memory";
		}
		else if (result != RES_NOT_LOADED)
		{
			ereport(WARNING,
					(errmsg("gpu_ivfpq: the GPU failed to serve a scan of \"%s\", using the CPU",
							RelationGetRelationName(index)),
					 errdetail("%s", error[0] ? error : "the service exited")));
			reason = "The GPU service failed";
		}
		else
			reason = "The index could not be mirrored";
		break;
	}
	CountFallback();
	if (required)
		GpuIvfpqGpuRequiredError("scan", reason);
	return -1;
}

/*
 * Candidates for nq queries (the k best labels of each by ADC distance over
 * nprobe lists) in one GPU request; labels is nq x k, padded with -1.
 * Returns false when the GPU cannot serve it (the caller uses the CPU; with
 * gpu_ivfpq.device = gpu that is an error instead).
 */
bool
GpuIvfpqServiceSearchBatch(Relation index, const GpuIvfpqMetaPageData *meta, const float *queries,
						   int64 nq, int k, int nprobe, int64 *labels)
{
	bool		required = gpu_ivfpq_device == GPU_IVFPQ_DEVICE_GPU;
	const char *reason = NotServableReason(meta);
	GpuIvfpqSlot *slot = NULL;
	dsm_segment *seg;
	char	   *base;
	Size		loff;
	char		error[256];
	RequestResult result = RES_ERROR;

	if (!GpuIvfpqServiceWanted())
		return false;
	if (reason == NULL && k > GPU_IVFPQ_SERVICE_MAX_K)
		reason = "The GPU selects at most 2048 candidates per query";
	if (reason == NULL && (slot = GpuIvfpqAcquireSlot()) == NULL)
		reason = "No request slot is free";
	if (reason != NULL)
	{
		if (required)
			GpuIvfpqGpuRequiredError("batch search", reason);
		return false;
	}
	loff = GpuIvfpqBatchLabelsOffset(nq, meta->dimensions);
	seg = dsm_create(loff + (Size) nq * k * sizeof(int64), 0);
	base = (char *) dsm_segment_address(seg);
	memcpy(base + GPU_IVFPQ_BATCH_QUERIES, queries, (Size) nq * meta->dimensions * sizeof(float));
	for (int attempt = 0; attempt < 2; attempt++)
	{
		slot->kind = REQ_SEARCH_BATCH;
		FillKey(&slot->key, index, meta);
		slot->dim = meta->dimensions;
		slot->k = k;
		slot->nprobe = nprobe;
		slot->n = nq;
		slot->dsm = dsm_segment_handle(seg);
		result = GpuIvfpqSubmitAndWait(slot);
		strlcpy(error, slot->error, sizeof(error));
		GpuIvfpqFinishSlot(slot);
		if (result != RES_NOT_LOADED || attempt > 0)
			break;
		{
			int64		entries;

			result = LoadMirror(slot, index, meta, &entries, error, sizeof(error));
			if (result != RES_OK)
				break;
		}
	}
	if (result == RES_OK)
		memcpy(labels, base + loff, (Size) nq * k * sizeof(int64));
	dsm_detach(seg);
	if (result == RES_OK)
		return true;
	CountFallback();
	if (required)
		GpuIvfpqGpuRequiredError("batch search", error[0] ? error : "The GPU service failed");
	ereport(WARNING,
			(errmsg("gpu_ivfpq: batch search on \"%s\" ran on the CPU", RelationGetRelationName(index)),
			 errdetail("%s", error[0] ? error : "The GPU service failed.")));
	return false;
}

/* gpu_ivfpq_prewarm(index regclass): mirrors an index now; returns its entries. */
Datum
gpu_ivfpq_prewarm(PG_FUNCTION_ARGS)
{
	Oid			relid = PG_GETARG_OID(0);
	Relation	index = index_open(relid, AccessShareLock);
	GpuIvfpqMetaPageData meta;
	const char *reason;
	GpuIvfpqSlot *slot;
	int64		entries = 0;
	char		error[256];
	RequestResult result;

	if (index->rd_rel->relam != get_index_am_oid("gpu_ivfpq", false))
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a gpu_ivfpq index", RelationGetRelationName(index))));
	GpuIvfpqReadMeta(index, &meta);
	reason = NotServableReason(&meta);
	if (reason == NULL && (slot = GpuIvfpqAcquireSlot()) == NULL)
		reason = "No request slot is free";
	if (reason != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot mirror \"%s\" to the GPU", RelationGetRelationName(index)),
				 errdetail("%s.", reason)));
	result = LoadMirror(slot, index, &meta, &entries, error, sizeof(error));
	if (result != RES_OK)
		ereport(ERROR,
				(errcode(result == RES_NO_MEMORY ? ERRCODE_OUT_OF_MEMORY : ERRCODE_INTERNAL_ERROR),
				 errmsg("could not mirror \"%s\" to the GPU", RelationGetRelationName(index)),
				 errdetail("%s", error[0] ? error : "the service exited")));
	index_close(index, AccessShareLock);
	PG_RETURN_INT64(entries);
}
