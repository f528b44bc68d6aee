// The change log that keeps GPU mirrors coherent with the index pages:
// inserts append their entries after writing the page; VACUUM, rebuilds
// and DROP INDEX (when its transaction commits) invalidate the mirror. The service applies the log before
// serving any request sent after an entry was logged. Each change is also
// announced in WAL (wal_announce.cpp), whose replay pushes it here on
// standbys.
#include "service/shmem.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>

extern "C" {
#include "access/parallel.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/objectaccess.h"
#include "catalog/pg_class.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "pgstat.h"
#include "storage/ipc.h"
#include "storage/pmsignal.h"
#include "utils/memutils.h"
#include "utils/syscache.h"
#include "utils/wait_event.h"
}

static object_access_hook_type prev_object_access_hook = NULL;

/*
 * Indexes of ours dropped by the current transaction, invalidated when it
 * commits or prepares: a DROP INDEX that rolls back (or whose
 * subtransaction does) keeps its mirror. Kept in TopTransactionContext;
 * level: the (sub)transaction nesting level that dropped it.
 */
typedef struct PendingDrop
{
	Oid			index;
	bool		logged;
	int			level;
} PendingDrop;

static List *pending_drops = NIL;

/*
 * The log position after the last entry this transaction pushed (0: none):
 * its commit waits until the service has applied it, and its own searches
 * carry it.
 */
static uint64 xact_log_pos = 0;

/*
 * The indexes this transaction appended to (up to XACT_INDEXES; past that
 * xact_indexes_all): its commit waits for the log only where one of them
 * is listed as mirrored (XactAppendedToMirrored).
 */
#define XACT_INDEXES 8
static Oid	xact_indexes[XACT_INDEXES];
static int	nxact_indexes = 0;
static bool xact_indexes_all = false;

static void
ForgetXactIndexes(void)
{
	nxact_indexes = 0;
	xact_indexes_all = false;
}

static void
RememberXactIndex(Oid index)
{
	for (int i = 0; i < nxact_indexes; i++)
		if (xact_indexes[i] == index)
			return;
	if (nxact_indexes == XACT_INDEXES)
		xact_indexes_all = true;
	else
		xact_indexes[nxact_indexes++] = index;
}

/*
 * Whether an index this transaction appended to is listed as mirrored (or
 * loading) by the service. Read after the appends were logged: an index
 * the service lists only later has its load's catch-up apply them
 * (PublishMirrored says why).
 */
static bool
XactAppendedToMirrored(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	static GpuIvfpqIndexRef list[GPU_IVFPQ_MIRRORED_MAX];
	int			n;
	bool		all;

	if (xact_indexes_all)
		return true;
	/* Copied out: the spinlock is every insert's and search's too. */
	SpinLockAcquire(&s->mutex);
	all = s->mirrored_all;
	n = Min(s->nmirrored, GPU_IVFPQ_MIRRORED_MAX);
	memcpy(list, s->mirrored, sizeof(list[0]) * n);
	SpinLockRelease(&s->mutex);
	if (all)
		return true;
	for (int i = 0; i < n; i++)
		for (int j = 0; j < nxact_indexes; j++)
			if (list[i].db == MyDatabaseId && list[i].index == xact_indexes[j])
				return true;
	return false;
}

/*
 * Appends entry to the log, with its vector of entry->vdim floats (vector:
 * NULL for none) and, for an append, its code of entry->m bytes (code: NULL
 * when entry->code holds it already). A code too long for the entry goes to
 * the vector ring after the vector: one region per entry, which readers
 * copy whole or find overwritten.
 */
uint64
GpuIvfpqLogPush(const GpuIvfpqLogEntry *entry, const float *vector, const uint8 *code)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	bool		wide = entry->kind == LOG_APPEND && entry->m > GPU_IVFPQ_LOG_INLINE_CODE;
	uint64		seq;
	GpuIvfpqLogEntry *e;

	Assert(entry->m <= (entry->kind == LOG_APPEND ? GPU_IVFPQ_LOG_MAX_CODE : GPU_IVFPQ_LOG_INLINE_CODE));
	Assert(!wide || code != NULL);
	LWLockAcquire(s->log_lock, LW_EXCLUSIVE);
	seq = s->log_head++;
	pg_atomic_write_u64(&s->log_head_pub, s->log_head);
	e = &s->log[seq % GPU_IVFPQ_LOG_SIZE];
	*e = *entry;
	e->seq = seq;
	if (vector == NULL || e->vdim < 0)
		e->vdim = 0;
	if (code != NULL && !wide)
		memcpy(e->code, code, entry->m);
	if (e->vdim > 0 || wide)
	{
		Size		bytes = GpuIvfpqLogRingBytes(e);
		Size		at = s->vec_head % GPU_IVFPQ_VECTOR_RING_BYTES;
		Size		vbytes = sizeof(float) * (Size) e->vdim;

		/* Each region lies in one piece: a tail too short for it is skipped. */
		if (at + bytes > GPU_IVFPQ_VECTOR_RING_BYTES)
		{
			s->vec_head += GPU_IVFPQ_VECTOR_RING_BYTES - at;
			at = 0;
		}
		e->vec_pos = s->vec_head;
		if (vbytes > 0)
			memcpy(s->vec_ring + at, vector, vbytes);
		if (wide)
			memcpy(s->vec_ring + at + vbytes, code, entry->m);
		s->vec_head += bytes;
	}
	LWLockRelease(s->log_lock);
	return seq;
}

/*
 * Called by aminsert after the entry is on its page: the mirror (if any)
 * gets it, with its exact vector (vector: meta->dimensions floats, or NULL
 * in an index without vector copies) and its filter key (8 bytes, unaligned,
 * or NULL in an index without a filter column), before the service serves a
 * request sent after this point.
 */
void
GpuIvfpqServiceLogAppend(Relation index, const GpuIvfpqMetaPageData *meta, int list,
						 int64 label, const uint8 *code, const float *vector, const char *filter_key)
{
	GpuIvfpqLogEntry e;

	if (gpu_ivfpq_service == NULL || !GpuIvfpqLogsChanges(meta))
		return;
	memset(&e, 0, offsetof(GpuIvfpqLogEntry, code));
	GpuIvfpqFillKey(&e.key, index, meta);
	e.kind = LOG_APPEND;
	e.m = (uint16) meta->m;
	e.list = list;
	e.label = label;
	e.vdim = vector != NULL ? (int32) meta->dimensions : 0;
	e.vec_pos = 0;
	e.filter_key = 0;
	if (filter_key != NULL)
		memcpy(&e.filter_key, filter_key, sizeof(int64));
	xact_log_pos = GpuIvfpqLogPush(&e, vector, code) + 1;
	RememberXactIndex(RelationGetRelid(index));
	/* The commit (and this transaction's own searches) wait until the service applied it: now. */
	GpuIvfpqServiceWake();
	/*
	 * Announced after the push: should the WAL insert fail, the row's
	 * transaction aborts, and a mirror that took the entry only offers a TID
	 * whose row no snapshot sees (as when any inserting transaction aborts).
	 */
	GpuIvfpqWalAnnounceAppend(index, &e, vector, code);
}

/*
 * Logs VACUUM's removal of n labels from the mirror of key, in entries of
 * GPU_IVFPQ_LOG_REMOVE_LABELS; returns the position after the last.
 */
uint64
GpuIvfpqLogPushRemove(const GpuIvfpqKey *key, const int64 *labels, int n)
{
	GpuIvfpqLogEntry e;
	uint64		pos = 0;

	memset(&e, 0, sizeof(e));
	e.key = *key;
	e.kind = LOG_REMOVE;
	for (int i = 0; i < n; i += GPU_IVFPQ_LOG_REMOVE_LABELS)
	{
		int			count = Min(GPU_IVFPQ_LOG_REMOVE_LABELS, n - i);

		e.m = (uint16) count;
		memcpy(e.code, labels + i, sizeof(int64) * count);
		pos = GpuIvfpqLogPush(&e, NULL, NULL) + 1;
	}
	return pos;
}

/*
 * Makes the service drop every mirror, as when writers lap it: the head
 * jumps a whole log ahead, so every reader behind it (the service, a
 * loading backend) finds itself lapped, and the slots skipped are never
 * read. For changes that cannot be told index by index.
 */
void
GpuIvfpqLogDropAll(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	LWLockAcquire(s->log_lock, LW_EXCLUSIVE);
	s->log_head += GPU_IVFPQ_LOG_SIZE + 1;
	pg_atomic_write_u64(&s->log_head_pub, s->log_head);
	LWLockRelease(s->log_lock);
}

/*
 * The log's head, without its lock: a search carries it as the position
 * the mirrors must include before it is served (its own inserts among them).
 */
uint64
GpuIvfpqLogHead(void)
{
	return pg_atomic_read_u64(&gpu_ivfpq_service->log_head_pub);
}

/*
 * The change-log position a search must see applied before it runs. On a
 * primary, every transaction that inserted into a mirrored index waited at
 * commit until its entries were in the mirrors (DropsAtXactEnd), so a
 * search needs only the entries of its own transaction (read-your-writes);
 * other sessions' writes cost it nothing. A parallel worker searches for
 * its leader's transaction, whose position it does not know, and a standby
 * replays entries nobody waited for: both take the whole log.
 */
uint64
GpuIvfpqSearchLogPos(void)
{
	if (RecoveryInProgress() || IsParallelWorker())
		return GpuIvfpqLogHead();
	return xact_log_pos;
}

/* The service advanced log_applied: wakes whoever waits for it (GpuIvfpqServiceWaitApplied). */
void
GpuIvfpqLogAppliedAdvanced(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	pg_atomic_fetch_add_u32(&s->applied_seq, 1);
	(void) syscall(SYS_futex, &s->applied_seq.value, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Wakes the service, so that it applies (and frees memory) now, not at the next request. */
void
GpuIvfpqServiceWake(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	Latch	   *latch;

	SpinLockAcquire(&s->mutex);
	latch = s->pid != 0 ? s->latch : NULL;
	SpinLockRelease(&s->mutex);
	if (latch != NULL)
		SetLatch(latch);
}

/*
 * Waits until the service has applied the log up to position pos (a value
 * the Log functions returned; 0: nothing to wait for): no batch after that
 * sees the mirror as it was. A service that is not running, or runs no GPU
 * process, holds no mirror.
 */
void
GpuIvfpqServiceWaitApplied(uint64 pos)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	if (s == NULL || pos == 0)
		return;
	pgstat_report_wait_start(PG_WAIT_EXTENSION);
	for (int round = 0;; round++)
	{
		Latch	   *latch;
		uint32		seen = pg_atomic_read_u32(&s->applied_seq);
		struct timespec ts = {0, 10 * 1000 * 1000};

		SpinLockAcquire(&s->mutex);
		latch = s->pid != 0 ? s->latch : NULL;
		SpinLockRelease(&s->mutex);
		if (latch == NULL || pg_atomic_read_u64(&s->log_applied) >= pos)
			break;
		/*
		 * No GPU process, no mirror to update: a process started later
		 * loads mirrors from the pages, which hold these changes already.
		 */
		if (!GpuIvfpqServiceServing())
			break;
		/* The writer woke the service already; a reminder now and then (it may have missed it). */
		if (round % 10 == 0)
			SetLatch(latch);
		/* Woken by GpuIvfpqLogAppliedAdvanced (a futex on shared memory), or 10 ms on. */
		(void) syscall(SYS_futex, &s->applied_seq.value, FUTEX_WAIT, seen, &ts, NULL, 0);
		if (!PostmasterIsAlive())
			proc_exit(1);
		CHECK_FOR_INTERRUPTS();
	}
	pgstat_report_wait_end();
}

/*
 * Logs an invalidation of every mirror of the index, announced in WAL when
 * logged (the index is WAL-logged); returns the position after it.
 */
static uint64
LogInvalidate(Oid indexoid, bool logged)
{
	GpuIvfpqLogEntry e;
	uint64		pos;

	if (gpu_ivfpq_service == NULL)
		return 0;
	memset(&e, 0, sizeof(e));
	e.key.db = MyDatabaseId;
	e.key.index = indexoid;
	e.kind = LOG_INVALIDATE;
	pos = GpuIvfpqLogPush(&e, NULL, NULL) + 1;
	GpuIvfpqWalAnnounceInvalidate(&e.key, logged);
	GpuIvfpqServiceWake();
	return pos;
}

/*
 * VACUUM removed these entries from a page (before the heap may reuse
 * their TIDs): the mirror of this index version is to lose them, in place.
 * Returns the log position after them, for GpuIvfpqServiceWaitApplied once
 * the pass is over (0: nothing logged). Logged page by page, so that a
 * VACUUM that fails later has still told the mirror what it removed. A
 * mirror loading meanwhile sees the removal in its window and is discarded
 * (the next scan loads it again).
 */
uint64
GpuIvfpqServiceLogRemove(Relation index, const GpuIvfpqMetaPageData *meta, const int64 *labels, int n)
{
	GpuIvfpqKey key;
	uint64		pos;

	if (gpu_ivfpq_service == NULL || n <= 0 || !GpuIvfpqLogsChanges(meta))
		return 0;				/* no mirror can exist */
	GpuIvfpqFillKey(&key, index, meta);
	pos = GpuIvfpqLogPushRemove(&key, labels, n);
	GpuIvfpqWalAnnounceRemove(index, &key, labels, n);
	GpuIvfpqServiceWake();
	return pos;
}

/* The log position after everything logged so far (0 without the service). */
uint64
GpuIvfpqServiceLogPosition(void)
{
	return gpu_ivfpq_service != NULL ? GpuIvfpqLogHead() : 0;
}

/* The mirror goes (a large VACUUM); returns the log position after the invalidation. */
uint64
GpuIvfpqServiceLogInvalidate(Relation index)
{
	return LogInvalidate(RelationGetRelid(index), RelationNeedsWAL(index));
}

/*
 * A build wrote a new version (or VACUUM changed too much): the mirror must
 * go before any later search; with wait, returns once it has.
 */
void
GpuIvfpqServiceInvalidate(Relation index, bool wait)
{
	uint64		pos = LogInvalidate(RelationGetRelid(index), RelationNeedsWAL(index));

	if (wait)
		GpuIvfpqServiceWaitApplied(pos);
}

/* DROP INDEX: the mirror of a dropped gpu_ivfpq or gpu_metric index is freed at commit. */
static void
ObjectAccess(ObjectAccessType access, Oid classId, Oid objectId, int subId, void *arg)
{
	if (prev_object_access_hook)
		prev_object_access_hook(access, classId, objectId, subId, arg);
	/* ALTER INDEX ... SET: options a rebuild could not use are refused now. */
	if (access == OAT_POST_ALTER && classId == RelationRelationId && subId == 0)
		GpuIvfpqRelationAltered(objectId);
	if (access == OAT_DROP && classId == RelationRelationId && subId == 0 &&
		gpu_ivfpq_service != NULL)
	{
		HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(objectId));

		if (HeapTupleIsValid(tup))
		{
			Form_pg_class rel = (Form_pg_class) GETSTRUCT(tup);
			bool		ours = rel->relkind == RELKIND_INDEX &&
				(rel->relam == get_index_am_oid("gpu_ivfpq", true) ||
				 rel->relam == get_index_am_oid("gpu_metric", true));
			bool		logged = rel->relpersistence == RELPERSISTENCE_PERMANENT;

			ReleaseSysCache(tup);
			if (ours)
			{
				MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);
				PendingDrop *p = (PendingDrop *) palloc(sizeof(PendingDrop));

				p->index = objectId;
				p->logged = logged;
				p->level = GetCurrentTransactionNestLevel();
				pending_drops = lappend(pending_drops, p);
				MemoryContextSwitchTo(old);
			}
		}
	}
}

/* The drops of a committing (or preparing) transaction invalidate their mirrors. */
static void
DropsAtXactEnd(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			{
				List	   *drops = pending_drops;
				ListCell   *lc;

				/*
				 * Rows this transaction inserted are in the mirrors before
				 * anyone can see them committed: other sessions' searches
				 * then need not wait for the log (GpuIvfpqSearchLogPos).
				 */
				if (xact_log_pos != 0)
				{
					/* Not for indexes without a mirror: their next load reads these rows. */
					if (XactAppendedToMirrored())
						GpuIvfpqServiceWaitApplied(xact_log_pos);
					xact_log_pos = 0;
					ForgetXactIndexes();
				}
				/* Cleared first: an error below aborts, and the abort must not see them. */
				pending_drops = NIL;
				foreach(lc, drops)
				{
					PendingDrop *p = (PendingDrop *) lfirst(lc);

					(void) LogInvalidate(p->index, p->logged);
				}
				break;
			}
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
		case XACT_EVENT_PREPARE:
			/* The list lived in TopTransactionContext, which goes now. */
			pending_drops = NIL;
			xact_log_pos = 0;
			ForgetXactIndexes();
			break;
		default:
			break;
	}
}

/*
 * A subtransaction that aborts takes its drops back; one that commits hands
 * them to its parent.
 */
static void
DropsAtSubXactEnd(SubXactEvent event, SubTransactionId mySubid, SubTransactionId parentSubid, void *arg)
{
	int			level = GetCurrentTransactionNestLevel();
	ListCell   *lc;

	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		foreach(lc, pending_drops)
		{
			PendingDrop *p = (PendingDrop *) lfirst(lc);

			if (p->level >= level)
				pending_drops = foreach_delete_current(pending_drops, lc);
		}
	}
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		foreach(lc, pending_drops)
		{
			PendingDrop *p = (PendingDrop *) lfirst(lc);

			if (p->level >= level)
				p->level = level - 1;
		}
	}
}

void
GpuIvfpqServiceInstallHooks(void)
{
	prev_object_access_hook = object_access_hook;
	object_access_hook = ObjectAccess;
	RegisterXactCallback(DropsAtXactEnd, NULL);
	RegisterSubXactCallback(DropsAtSubXactEnd, NULL);
}

