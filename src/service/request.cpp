// The request protocol between backends and the GPU service: one slot per
// backend in shared memory, a latch each way; whether the service can serve
// an index at all; and the query counters.
#include "service/shmem.h"

extern "C" {
#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "storage/ipc.h"
#include "utils/wait_event.h"
}

static GpuIvfpqSlot *my_slot = NULL;

/* ---- counters ---- */

void
GpuIvfpqCountCpuQuery(void)
{
	if (gpu_ivfpq_service != NULL)
		pg_atomic_fetch_add_u64(&gpu_ivfpq_service->queries_cpu, 1);
}

void
GpuIvfpqCountFallback(void)
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
 * Why the GPU cannot serve this index, or NULL when it can. On a standby,
 * WAL replay pushes the primary's announced changes into the change log
 * (wal_announce.cpp), so mirrors follow the pages; an index whose
 * metapage says that changes went unannounced is served from its pages.
 */
const char *
GpuIvfpqNotServableReason(const GpuIvfpqMetaPageData *meta)
{
	if (gpu_ivfpq_service == NULL)
		return "The extension gpu_ivfpq is not in shared_preload_libraries";
	if (!GpuIvfpqServiceServing())
		return "The gpu_ivfpq service has no GPU or is not running";
	if (!meta->trained)
		return "The index has no trained quantizers";
	if ((meta->flags & GPU_IVFPQ_META_UNANNOUNCED) && RecoveryInProgress())
		return "The index was changed on a primary that did not preload gpu_ivfpq, so a GPU mirror on this standby could miss those changes; "
			"REINDEX it on a primary that preloads gpu_ivfpq (or change it there: its next insert or VACUUM clears this)";
	if ((int) meta->dimensions > GPU_IVFPQ_SERVICE_MAX_DIM)
		return psprintf("The GPU path handles up to %d dimensions", GPU_IVFPQ_SERVICE_MAX_DIM);
	if (meta->m > GPU_IVFPQ_SERVICE_MAX_M)
		return psprintf("The GPU path handles up to m = %d sub-quantizers", GPU_IVFPQ_SERVICE_MAX_M);
	return NULL;
}

/* Whether the service could mirror and serve this index now. */
bool
GpuIvfpqServiceCanServe(const GpuIvfpqMetaPageData *meta)
{
	return GpuIvfpqNotServableReason(meta) == NULL;
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

/*
 * A search of index that the GPU did not serve after the service answered
 * result (error: its message): says why where it is worth a WARNING (out of
 * GPU memory, a failure), counts the fallback to the CPU and, when the GPU
 * is required, raises GpuIvfpqGpuRequiredError for what. am and noun name
 * the index's kind and the search in the warnings ("gpu_ivfpq", "scan").
 */
void
GpuIvfpqSearchFellBack(Relation index, RequestResult result, const char *error, const char *am,
					   const char *noun, const char *what, bool required)
{
	const char *reason;

	if (result == RES_LOADING)
		reason = "The index's GPU mirror is being loaded by another session";
	else if (result == RES_SERVICE_GONE)
		reason = "The GPU process is restarting";	/* counted and logged by the service */
	else if (result == RES_NOT_LOADED)
		reason = "The index could not be mirrored";
	else if (result == RES_NO_MEMORY)
	{
		ereport(WARNING,
				(errmsg("%s: index \"%s\" does not fit in GPU memory, using the CPU",
						am, RelationGetRelationName(index)),
				 errdetail("%s", error),
				 errhint("Raise gpu_ivfpq.gpu_memory_budget or drop unused indexes.")));
		reason = "The index does not fit in GPU memory";
	}
	else
	{
		ereport(WARNING,
				(errmsg("%s: the GPU failed to serve a %s of \"%s\", using the CPU",
						am, noun, RelationGetRelationName(index)),
				 errdetail("%s", error[0] ? error : "the service exited")));
		reason = "The GPU service failed";
	}
	GpuIvfpqCountFallback();
	if (required)
		GpuIvfpqGpuRequiredError(what, reason);
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

	slot->exact = false;		/* set by a search the service re-ranked */
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

/* The identity of an index version, as mirrors and log entries carry it. */
void
GpuIvfpqFillKey(GpuIvfpqKey *key, Relation index, const GpuIvfpqMetaPageData *meta)
{
	key->db = MyDatabaseId;
	key->index = RelationGetRelid(index);
	key->relnode = index->rd_node.relNode;
	key->build = meta->build_id;
}


/*
 * dsm_create for a request, or NULL with a WARNING when shared memory is
 * short (the caller then runs on the CPU). The attempt runs in a
 * subtransaction, as PL/pgSQL's exception blocks do, so a failed create
 * releases what it had registered instead of leaking it to commit.
 */
dsm_segment *
GpuIvfpqCreateSegment(Size bytes, const char *what)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	dsm_segment *volatile seg = NULL;

	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(cxt);
	PG_TRY();
	{
		seg = dsm_create(bytes, 0);
		/* Out of the subtransaction's resource owner (which its commit would detach) ... */
		dsm_pin_mapping(seg);
		ReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		/* ... and into the caller's, as a plain dsm_create would have left it. */
		dsm_unpin_mapping(seg);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		FlushErrorState();
		RollbackAndReleaseCurrentSubTransaction();
		MemoryContextSwitchTo(cxt);
		CurrentResourceOwner = owner;
		ereport(WARNING,
				(errmsg("gpu_ivfpq: %s on the CPU: no shared memory for the GPU request", what),
				 errdetail("%s", edata->message),
				 errhint("Check the size of /dev/shm, or set dynamic_shared_memory_type = mmap.")));
		FreeErrorData(edata);
		seg = NULL;
	}
	PG_END_TRY();
	return seg;
}
