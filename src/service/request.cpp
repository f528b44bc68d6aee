// The request protocol between backends and the GPU service: one slot per
// backend in shared memory, a latch each way; whether the service can serve
// an index at all; and the query counters.
#include <sys/statvfs.h>

#include "service/shmem.h"

extern "C" {
#include "access/xact.h"
#include "access/xlog.h"
#include "miscadmin.h"
#include "storage/dsm_impl.h"
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
	/*
	 * RaBitQ rows of any size are mirrored (the change log carries wide
	 * ones in its vector ring); the GPU itself may refuse a shape, which
	 * the load then reports.
	 */
	if (GpuIvfpqIsRabitq(meta))
		return NULL;
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
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s: the GPU failed to serve a %s of \"%s\", using the CPU",
						am, noun, RelationGetRelationName(index)),
				 errdetail("%s", error[0] ? error : "the service exited"),
				 errhint("gpu_ivfpq_status shows the service's last error; gpu_ivfpq.device = cpu keeps this index off the GPU.")));
		/* The real reason, also where device = gpu turns this into an error. */
		reason = error[0] ? psprintf("The GPU service failed: %s", error) : "The GPU service failed";
	}
	GpuIvfpqCountFallback();
	if (required)
		GpuIvfpqGpuRequiredError(what, reason);
}

/*
 * Loads the mirror of index that a search of this backend was told to load
 * (answered RES_NOT_LOADED, or RES_LOADING where the GPU is required), with
 * load and its arg; load sets *count, what the DEBUG1 line counts in unit
 * ("<am>: index ... mirrored to the GPU (<count> <unit>)"). *slot is this
 * backend's request slot, or NULL: then it is acquired here. Returns false,
 * loading nothing, when the slot still serves a request this session
 * cancelled: the load is given up for the next search, and the caller's
 * search goes to the CPU. Else true with *result the load's answer (RES_OK:
 * the caller searches again).
 */
bool
GpuIvfpqLoadToldMirror(GpuIvfpqSlot **slot, GpuIvfpqMirrorLoader load, const void *arg, Relation index,
					   const char *am, const char *unit, RequestResult *result, char *error, Size errlen)
{
	volatile RequestResult loaded = RES_ERROR;
	int64		count = 0;

	if (*slot == NULL && (*slot = GpuIvfpqAcquireSlot()) == NULL)
	{
		/*
		 * Its slot still serves a request this session cancelled: the load
		 * goes to the next search, this one to the CPU.
		 */
		GpuIvfpqQueueGiveUpLoad(false);
		return false;
	}
	/* A cancel or an exit while loading gives the load up for the next search to claim. */
	GpuIvfpqQueueLoading(true);
	PG_TRY();
	{
		loaded = load(*slot, index, arg, &count, error, errlen);
	}
	PG_CATCH();
	{
		GpuIvfpqQueueLoading(false);
		GpuIvfpqQueueGiveUpLoad(true);
		PG_RE_THROW();
	}
	PG_END_TRY();
	GpuIvfpqQueueLoading(false);
	*result = loaded;
	if (loaded == RES_OK)
		elog(DEBUG1, "%s: index \"%s\" mirrored to the GPU (%lld %s)",
			 am, RelationGetRelationName(index), (long long) count, unit);
	return true;
}

/*
 * The slot a prewarm function loads index's mirror with: raises an error
 * (with hint, unless NULL) when it cannot, for reason (the caller's; NULL:
 * none) or for want of a free slot.
 */
GpuIvfpqSlot *
GpuIvfpqPrewarmSlot(Relation index, const char *reason, const char *hint)
{
	GpuIvfpqSlot *slot = NULL;

	if (reason == NULL && (slot = GpuIvfpqAcquireSlot()) == NULL)
		reason = "No request slot is free";
	if (reason != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("cannot mirror \"%s\" to the GPU", RelationGetRelationName(index)),
				 errdetail("%s.", reason),
				 hint != NULL ? errhint("%s", hint) : 0));
	return slot;
}

/* Raises a prewarm function's error unless its load of index's mirror answered RES_OK. */
void
GpuIvfpqPrewarmLoaded(Relation index, RequestResult result, const char *error)
{
	if (result != RES_OK)
		ereport(ERROR,
				(errcode(result == RES_NO_MEMORY ? ERRCODE_OUT_OF_MEMORY : ERRCODE_INTERNAL_ERROR),
				 errmsg("could not mirror \"%s\" to the GPU", RelationGetRelationName(index)),
				 errdetail("%s", error[0] ? error : "the service exited"),
				 result == RES_NO_MEMORY ? errhint("Raise gpu_ivfpq.gpu_memory_budget or drop unused indexes.") : 0));
}

/* ---- slots ---- */

static void
ReleaseSlot(int code, Datum arg)
{
	GpuIvfpqSlot *slot = my_slot;

	if (slot == NULL)
		return;
	/* Terminated while loading a mirror it was told to load: the next search loads it. */
	GpuIvfpqQueueExitGiveUp();
	SpinLockAcquire(&slot->mutex);
	/*
	 * Unowned now. A request the service took is freed by the service
	 * once it answers it; so is one this backend abandoned before (a
	 * cancel): freed here, the slot would go to another backend, and the
	 * service's answer to the old request would then be taken as the
	 * answer to the new one. A request not taken yet (Collect takes it
	 * under this lock) is simply withdrawn: the service frees only what it
	 * took, so an abandoned one it never takes would stay lost.
	 */
	slot->owner = 0;
	if (slot->state == SLOT_RUNNING)
		slot->state = SLOT_ABANDONED;
	else if (slot->state != SLOT_ABANDONED)
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
 * The index of this backend's request slot (claimed on first use), which
 * is also its slot in the direct path's segment; -1 when none is free.
 */
int
GpuIvfpqMySlotIndex(void)
{
	if (my_slot == NULL && GpuIvfpqAcquireSlot() == NULL && my_slot == NULL)
		return -1;
	return (int) (my_slot - gpu_ivfpq_service->slots);
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

	slot->dists = GPU_IVFPQ_DISTS_NONE;	/* set by a search with distances */
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
	key->relnode = GpuIvfpqRelFileNumberOf(index);
	key->build = meta->build_id;
}


/* A segment made in parallel mode leaves this share (1/n) of its file system free. */
#define GPU_IVFPQ_SHM_KEEP_FREE 8

/* The WARNING of a request that runs on the CPU for want of a segment (hint: NULL for none). */
static void
NoSegmentWarning(const char *what, const char *detail, const char *hint)
{
	ereport(WARNING,
			(errmsg("gpu_ivfpq: %s on the CPU: no shared memory for the GPU request", what),
			 errdetail("%s", detail),
			 hint != NULL ? errhint("%s", hint) : 0));
}

/*
 * Why the OS would likely refuse a segment of bytes now, or NULL (*dir:
 * where segments go). Where segments are files (dynamic_shared_memory_type
 * posix: /dev/shm on Linux; mmap: pg_dynshmem in the data directory), a
 * segment that would leave less than 1/GPU_IVFPQ_SHM_KEEP_FREE of their
 * file system free is refused: room for what others (parallel queries,
 * other loads) may be taking meanwhile. sysv segments and a file system
 * that cannot be asked are not checked; nor is the region of
 * min_dynamic_shared_memory, which dsm_create tries first and whose free
 * room cannot be asked.
 */
static const char *
SegmentSpaceShortage(Size bytes, const char **dir)
{
	struct statvfs fs;
	double		size;
	double		avail;

	if (dynamic_shared_memory_type == DSM_IMPL_POSIX)
		*dir = "/dev/shm";
	else if (dynamic_shared_memory_type == DSM_IMPL_MMAP)
		*dir = PG_DYNSHMEM_DIR;
	else
		return NULL;
	if (statvfs(*dir, &fs) != 0)
		return NULL;
	size = (double) fs.f_blocks * fs.f_frsize;
	avail = (double) fs.f_bavail * fs.f_frsize;
	if (avail - (double) bytes >= size / GPU_IVFPQ_SHM_KEEP_FREE)
		return NULL;
	return psprintf("The request needs %.1f MB of shared memory; %s has %.1f MB of %.1f MB free, "
					"and a segment made during a parallel query must leave 1/%d of it free.",
					bytes / 1048576.0, *dir, avail / 1048576.0, size / 1048576.0, GPU_IVFPQ_SHM_KEEP_FREE);
}

/*
 * dsm_create for a request, or NULL with a WARNING when shared memory is
 * short (the caller then runs on the CPU).
 *
 * Outside parallel mode the attempt runs in a subtransaction, as
 * PL/pgSQL's exception blocks do, so a failed create releases what it had
 * registered instead of leaking it to commit.
 *
 * In parallel mode (a scan in a parallel worker, or in the leader while a
 * parallel plan runs) PostgreSQL 15 starts no subtransaction, so a failed
 * create cannot be caught and undone, and would end the query. There it is
 * done as core does for the segment of a parallel query
 * (InitializeParallelDSM): dsm_create answers NULL when the server's
 * segment slots are all taken, and the request then runs on the CPU, as a
 * parallel query then runs without workers. The other refusal, the OS's
 * (a full /dev/shm, the usual one in containers), is checked before
 * (SegmentSpaceShortage) and also answered on the CPU. That check cannot
 * hold the space: a segment taken by another process between the check
 * and the create still ends the query with the OS's error, as it would end
 * a parallel query whose own segment came at that moment. Answering every
 * parallel-mode request on the CPU instead would never load a mirror for
 * the parallel plans that large tables get by default.
 */
dsm_segment *
GpuIvfpqCreateSegment(Size bytes, const char *what)
{
	MemoryContext cxt = CurrentMemoryContext;
	ResourceOwner owner = CurrentResourceOwner;
	dsm_segment *volatile seg = NULL;

	if (IsInParallelMode())
	{
		const char *dir;
		const char *shortage = SegmentSpaceShortage(bytes, &dir);

		if (shortage != NULL)
		{
			NoSegmentWarning(what, shortage,
							 psprintf("Give %s more room. Outside parallel queries a request may use more of it: "
									  "gpu_ivfpq_prewarm and gpu_metric_prewarm load a mirror there.", dir));
			return NULL;
		}
		seg = dsm_create(bytes, DSM_CREATE_NULL_IF_MAXSEGMENTS);
		if (seg == NULL)
			NoSegmentWarning(what, "Too many dynamic shared memory segments are in use.", NULL);
		return seg;
	}

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
		NoSegmentWarning(what, edata->message,
						 "Check the size of /dev/shm, or set dynamic_shared_memory_type = mmap.");
		FreeErrorData(edata);
		seg = NULL;
	}
	PG_END_TRY();
	return seg;
}
