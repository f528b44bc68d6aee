// The change log that keeps GPU mirrors coherent with the index pages:
// inserts append their entries after writing the page; VACUUM, rebuilds
// and DROP INDEX invalidate the mirror. The service applies the log before
// serving any request sent after an entry was logged.
#include "service/shmem.h"

extern "C" {
#include "catalog/objectaccess.h"
#include "catalog/pg_class.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "utils/syscache.h"
#include "utils/wait_event.h"
}

static object_access_hook_type prev_object_access_hook = NULL;

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
	GpuIvfpqFillKey(&e.key, index, meta);
	e.kind = LOG_APPEND;
	e.m = (uint8) meta->m;
	e.list = list;
	e.label = label;
	memcpy(e.code, code, meta->m);
	(void) LogPush(&e);
}

/* Wakes the service now (it frees memory at once) and, with wait, waits until it applied seq. */
static void
WakeAndWait(uint64 seq, bool wait)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

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

static void
LogInvalidate(Oid indexoid, bool wait)
{
	GpuIvfpqLogEntry e;

	if (gpu_ivfpq_service == NULL)
		return;
	memset(&e, 0, sizeof(e));
	e.key.db = MyDatabaseId;
	e.key.index = indexoid;
	e.kind = LOG_INVALIDATE;
	WakeAndWait(LogPush(&e), wait);
}

/*
 * VACUUM removed these entries (before the heap may reuse their TIDs): the
 * mirror of this index version loses them, in place, before any later
 * search, and VACUUM waits until it has. A mirror loading meanwhile sees
 * the removal in its window and is discarded (the next scan loads again).
 */
void
GpuIvfpqServiceRemove(Relation index, const int64 *labels, int n)
{
	GpuIvfpqMetaPageData meta;
	GpuIvfpqLogEntry e;
	uint64		seq = 0;

	if (gpu_ivfpq_service == NULL || n <= 0)
		return;
	GpuIvfpqReadMeta(index, &meta);
	if (!meta.trained || meta.m > GPU_IVFPQ_SERVICE_MAX_M)
		return;					/* no mirror can exist */
	memset(&e, 0, sizeof(e));
	GpuIvfpqFillKey(&e.key, index, &meta);
	e.kind = LOG_REMOVE;
	for (int i = 0; i < n; i += GPU_IVFPQ_LOG_REMOVE_LABELS)
	{
		int			count = Min(GPU_IVFPQ_LOG_REMOVE_LABELS, n - i);

		e.m = (uint8) count;
		memcpy(e.code, labels + i, sizeof(int64) * count);
		seq = LogPush(&e);
	}
	WakeAndWait(seq, true);
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

