// The service's side of the change log: the appends and removals that
// writers log are applied to the GPU process's mirrors, in log order, before
// a request that may need them is served and whenever writers wake the
// service; invalidations drop mirrors. Also the mirrors of dropped
// databases, which no log entry announces.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "engine/error.h"
#include "service/worker.h"

extern "C" {
#include "access/heapam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "storage/lmgr.h"
#include "utils/snapmgr.h"
}

namespace svc {

static std::vector<MirrorKey> held_keys;	/* MirrorKeysHeld's answer */
static TimestampTz db_check_at;	/* when to look for mirrors of dropped databases */
static uint64 published_mirrors = UINT64_MAX;	/* mirrors_version that PublishMirrored listed */

#define DB_CHECK_MS 1000		/* how often mirrors of dropped databases are looked for */

/*
 * Copies the change log from position from to its head (*head), only the
 * entries of one index when only is set, with the ring bytes (vectors, and
 * codes too long for an entry) that wanted(entry) asks for: each such
 * entry's vec_pos becomes the offset of its bytes in log_vectors
 * (LoggedCode finds its code), or its vdim -1 when writers overwrote them
 * before this read (its mirror cannot take the entry: the caller drops
 * it). false when writers lapped the log itself. entries must have room
 * for the whole ring reserved and wanted must not allocate: nothing may
 * throw while the lock is held. The copies hold until the next call.
 */
bool
CopyLog(uint64 from, uint64 *head, const MirrorKey *only, std::vector<GpuIvfpqLogEntry> &entries,
		bool (*wanted)(const GpuIvfpqLogEntry &))
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	Size		used = 0;
	bool		lapped;

	LWLockAcquire(s->log_lock, LW_SHARED);
	*head = s->log_head;
	lapped = *head - from > GPU_IVFPQ_LOG_SIZE;
	for (uint64 seq = from; !lapped && seq < *head; seq++)
	{
		const GpuIvfpqLogEntry *e = &s->log[seq % GPU_IVFPQ_LOG_SIZE];
		Size		bytes = GpuIvfpqLogRingBytes(e);

		if (only != NULL && (e->key.db != only->db || e->key.index != only->index))
			continue;
		entries.push_back(*e);
		if (bytes == 0)
			continue;
		if (!wanted(*e))
		{
			entries.back().vdim = 0;	/* not applied: its ring bytes are not needed */
			continue;
		}
		/*
		 * Intact regions lie in the ring's last GPU_IVFPQ_VECTOR_RING_BYTES,
		 * one per entry: their copies fit log_vectors.
		 */
		if (s->vec_head - e->vec_pos > GPU_IVFPQ_VECTOR_RING_BYTES)
		{
			entries.back().vdim = -1;
			continue;
		}
		memcpy(log_vectors + used, s->vec_ring + e->vec_pos % GPU_IVFPQ_VECTOR_RING_BYTES, bytes);
		entries.back().vec_pos = used;
		used += bytes;
	}
	LWLockRelease(s->log_lock);
	return !lapped;
}

/*
 * The code of an append that CopyLog copied: in the entry, or after its
 * vector in log_vectors when too long for the entry.
 */
static const uint8 *
LoggedCode(const GpuIvfpqLogEntry *e)
{
	if (e->m <= GPU_IVFPQ_LOG_INLINE_CODE)
		return e->code;
	return (const uint8 *) (log_vectors + e->vec_pos + sizeof(float) * (Size) Max(e->vdim, 0));
}

/*
 * Appends logged entries (codes of m bytes, and their vectors when they
 * carry them, copied by CopyLog) to the mirror of key; false when the GPU
 * process holds no such mirror. Throws on a device error.
 */
bool
AddLogged(const MirrorKey &key, size_t m, const std::vector<const GpuIvfpqLogEntry *> &entries)
{
	std::vector<int32_t> lists;
	std::vector<int64_t> labels;
	std::vector<uint8_t> codes;
	std::vector<float> vectors;
	std::vector<int64_t> keys;
	size_t		d = entries.empty() ? 0 : (size_t) Max(entries.front()->vdim, 0);

	for (const GpuIvfpqLogEntry *e : entries)
	{
		const uint8 *code = LoggedCode(e);

		/* One index version has one code size: a mismatch is a bug, the mirror is dropped. */
		if (e->m != m || e->vdim < 0)
			throw gpuivfpq::Error(gpuivfpq::ErrorKind::Internal, "logged codes of another size, or lost");
		lists.push_back(e->list);
		labels.push_back(e->label);
		keys.push_back(e->filter_key);
		codes.insert(codes.end(), code, code + m);
		if (d > 0)
		{
			const float *v = (const float *) (log_vectors + e->vec_pos);

			/* One index version has one dimension: a mismatch is a bug, the mirror is dropped. */
			if ((size_t) e->vdim != d)
				throw gpuivfpq::Error(gpuivfpq::ErrorKind::Internal, "logged vectors of different dimensions");
			vectors.insert(vectors.end(), v, v + d);
		}
	}
	/* Every entry carries a filter key (0 without a filter column): a mirror without them ignores them. */
	uint64		start = NowNs();
	bool		found = GpuSync()->add(key, m, lists.size(), lists.data(), codes.data(), labels.data(),
								 d > 0 ? vectors.data() : nullptr, d, keys.data());
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	/* Calls that carried entries: a load's empty catch-up is no append. */
	if (!lists.empty())
	{
		pg_atomic_fetch_add_u64(&s->append_calls, 1);
		pg_atomic_fetch_add_u64(&s->time_append_ns, NowNs() - start);
		pg_atomic_fetch_add_u64(&s->time_append_device_ns, gpu->last_busy_ns());
	}
	return found;
}

/*
 * Applies a run of logged changes of one kind to a mirror: appends (a mirror
 * evicted meanwhile takes none) or VACUUM's removals, in place.
 */
static void
ApplyRun(const MirrorKey &key, const std::vector<const GpuIvfpqLogEntry *> &run)
{
	std::string err;

	if (run.front()->kind == LOG_APPEND)
	{
		if (!Engine([&] { (void) AddLogged(key, run.front()->m, run); }, err))
			DropAfterFailure(key, "appending to a mirror", err);
		return;
	}

	/* One removal call for the run: each call passes over the whole mirror. */
	std::vector<int64_t> labels;

	for (const GpuIvfpqLogEntry *e : run)
	{
		int			n = Min((int) e->m, GPU_IVFPQ_LOG_REMOVE_LABELS);
		const int64 *from = (const int64 *) e->code;

		labels.insert(labels.end(), from, from + n);
	}
	if (!Engine([&] { (void) GpuSync()->remove(key, labels.size(), labels.data()); }, err))
		DropAfterFailure(key, "removing entries from a mirror", err);
}

/*
 * Applies the change log from log_cursor to its head: appends reach their
 * mirrors, invalidations drop them. If the writers lapped the service, some
 * changes are lost: every mirror goes (they reload from the pages).
 */
void
DrainLog(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	std::vector<GpuIvfpqLogEntry> entries;
	uint64		head;
	bool		lapped;

	/* Room for the whole ring first: nothing may throw while the lock is held. */
	entries.reserve(GPU_IVFPQ_LOG_SIZE);
	/* Vectors only for entries that a mirror takes (DrainLog applies no others). */
	lapped = !CopyLog(log_cursor, &head, NULL, entries, [](const GpuIvfpqLogEntry &e) {
		auto		from = mirror_from.find(ToKey(e.key));

		return from != mirror_from.end() && e.seq >= from->second;
	});

	if (!GpuUp())
	{
		/* No mirrors to keep: just acknowledge (VACUUM waits for it). */
	}
	else if (lapped)
	{
		std::string err;

		(void) Engine([&] { GpuSync()->drop_all(); }, err);
		ereport(LOG, (errmsg("gpu_ivfpq service: the change log overflowed, mirrors dropped")));
	}
	else if (!entries.empty())
	{
		std::map<MirrorKey, std::vector<const GpuIvfpqLogEntry *>> runs;
		bool		removals = false;

		/*
		 * In log order per index, consecutive changes of one kind gathered
		 * into one call: a run of appends ends before a removal from the
		 * same mirror and the reverse (a TID removed by VACUUM may be
		 * appended again once the heap reuses it, and must stay).
		 */
		for (const auto &e : entries)
		{
			MirrorKey	key = ToKey(e.key);

			if (!GpuUp())
				break;			/* died meanwhile: nothing left to update */
			if (e.kind == LOG_INVALIDATE)
			{
				std::string err;

				/* Runs of the dropped mirror (earlier or later) find no mirror: add says so. */
				if (Engine([&] { GpuSync()->drop_index(key.db, key.index); }, err))
				{
					/* Every version of the index went: none is listed as mirrored any more. */
					for (auto it = mirror_from.begin(); it != mirror_from.end();)
						it = it->first.db == key.db && it->first.index == key.index ? mirror_from.erase(it) : std::next(it);
					mirrors_version++;
				}
				removals = true;
				continue;
			}
			auto		from = mirror_from.find(key);

			if (from == mirror_from.end() || e.seq < from->second)
				continue;		/* no mirror, or one loaded after this change */
			if (e.vdim < 0)
			{
				std::string err;

				/* Its vector or wide code was overwritten before this read: the mirror reloads from the pages. */
				if (!Engine([&] { GpuSync()->drop_index(key.db, key.index); }, err))
					continue;	/* still listed: its commits keep waiting, a later entry tries again */
				ereport(LOG,
						(errmsg("gpu_ivfpq service: the vector ring overflowed, the mirror of index %u dropped",
								key.index)));
				/* Its later entries find no mirror (one drop and one message, not one per entry). */
				mirror_from.erase(from);
				mirrors_version++;
				removals = true;
				continue;
			}
			auto		run = runs.find(key);

			if (run != runs.end() && run->second.front()->kind != e.kind)
			{
				ApplyRun(key, run->second);
				run->second.clear();
			}
			runs[key].push_back(&e);
			removals |= e.kind == LOG_REMOVE;
		}
		for (auto &kv : runs)
			if (!kv.second.empty() && GpuUp())
				ApplyRun(kv.first, kv.second);
		/* Before VACUUM and DROP see the log applied, the views show the result. */
		if (removals)
			PublishStatus();
	}
	if (mirrors_version != published_mirrors)
		PublishMirrored(NULL);
	log_cursor = head;
	pg_atomic_write_u64(&s->log_applied, head);
	/* Commits and VACUUMs that waited for these changes go on; so do the searches queued after them. */
	GpuIvfpqLogAppliedAdvanced();
	GpuIvfpqQueueSetApplied(head);
}

/*
 * Publishes the indexes of mirror_from, and loading (not NULL: a load under
 * way), as the mirrored ones (GpuIvfpqServiceShared.mirrored). A commit
 * that appended to none of them skips its wait for the change log. Safe
 * because a load lists its index before it reads the log's head for its
 * catch-up: a commit that found the index unlisted had logged its entries
 * before that read, so the catch-up applies them; one that found it listed
 * waits. An index listed without a mirror (a failed load, an eviction)
 * only makes its commits wait; the next DrainLog lists mirror_from again.
 */
void
PublishMirrored(const MirrorKey *loading)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	static GpuIvfpqIndexRef list[GPU_IVFPQ_MIRRORED_MAX];
	int			n = 0;
	bool		all = false;
	auto		add = [&](const MirrorKey &k) {
		for (int i = 0; i < n; i++)
			if (list[i].db == k.db && list[i].index == k.index)
				return;
		if (n == GPU_IVFPQ_MIRRORED_MAX)
		{
			all = true;
			return;
		}
		list[n].db = k.db;
		list[n].index = k.index;
		n++;
	};

	/* Built here, copied under the spinlock (which every insert and search also takes). */
	for (const auto &kv : mirror_from)
		add(kv.first);
	if (loading != NULL)
		add(*loading);
	SpinLockAcquire(&s->mutex);
	memcpy(s->mirrored, list, sizeof(list[0]) * n);
	s->nmirrored = n;
	s->mirrored_all = all;
	SpinLockRelease(&s->mutex);
	/* With a load listed, the next DrainLog lists mirror_from alone again. */
	published_mirrors = loading != NULL ? mirrors_version - 1 : mirrors_version;
}

/*
 * ---- mirrors of dropped databases ----
 *
 * DROP DATABASE drops no index one by one, so no change log entry tells the
 * service; the mirrors of its indexes would stay until evicted. Instead of
 * hooking the drop (which a standby replaying it, or a primary without the
 * preload, never runs), the service compares its mirrors' databases with
 * pg_database, a shared catalog that it reads without a database of its
 * own, every DB_CHECK_MS: whoever dropped the database and whenever, its
 * mirrors go within that time. (While the service is down no mirror
 * exists: they live in its GPU process, which dies with it.)
 */

/* The keys of the mirrors the GPU process holds, into held_keys; false if it cannot tell. */
static bool
MirrorKeysHeld(void)
{
	std::string err;

	held_keys.clear();
	return GpuUp() && Engine([&] {
		for (const auto &info : GpuSync()->status().mirrors)
			held_keys.push_back(info.key);
	}, err);
}

/*
 * The OIDs of the databases pg_database holds now (*n of them, palloc'd in
 * the caller's memory context), or NULL when another session holds a lock
 * on pg_database that a read waits for (VACUUM FULL): the service never
 * waits for a lock, it looks again next time. A seqscan of the catalog, as
 * autovacuum lists the databases: no index, whose lock could be a wait.
 * Errors go to the loop's handler, which aborts the transaction.
 */
static Oid *
ExistingDatabases(int *n)
{
	MemoryContext cxt = CurrentMemoryContext;
	Oid		   *oids = NULL;
	int			cap = 16;
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;

	*n = 0;
	StartTransactionCommand();
	if (ConditionalLockRelationOid(DatabaseRelationId, AccessShareLock))
	{
		/* Sets the horizon that pruning of the pages read respects. */
		(void) GetTransactionSnapshot();
		oids = (Oid *) MemoryContextAlloc(cxt, sizeof(Oid) * cap);
		rel = table_open(DatabaseRelationId, NoLock);
		scan = table_beginscan_catalog(rel, 0, NULL);
		while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
		{
			CHECK_FOR_INTERRUPTS();
			if (*n == cap)
			{
				cap *= 2;
				oids = (Oid *) repalloc(oids, sizeof(Oid) * cap);
			}
			oids[(*n)++] = ((Form_pg_database) GETSTRUCT(tup))->oid;
		}
		table_endscan(scan);
		table_close(rel, AccessShareLock);
	}
	CommitTransactionCommand();
	MemoryContextSwitchTo(cxt);
	return oids;
}

/* Drops the mirrors in held_keys of databases not among the n in dbs; how many went. */
static int
DropMirrorsOfGone(const Oid *dbs, int n)
{
	int			dropped = 0;

	for (const MirrorKey &key : held_keys)
	{
		std::string err;

		if (std::find(dbs, dbs + n, (Oid) key.db) != dbs + n || !GpuUp())
			continue;
		/* Every version of the index goes at once: a later key of it finds none. */
		(void) Engine([&] { dropped += (int) GpuSync()->drop_index(key.db, key.index); }, err);
		mirror_from.erase(key);
		mirrors_version++;
		load_claims.erase(key);
	}
	return dropped;
}

/* Every DB_CHECK_MS: the mirrors of databases dropped since go (see above). */
void
CheckDroppedDatabases(void)
{
	TimestampTz now = GetCurrentTimestamp();
	Oid		   *dbs;
	int			n;
	int			dropped;

	if (now < db_check_at)
		return;
	db_check_at = TimestampTzPlusMilliseconds(now, DB_CHECK_MS);
	if (!MirrorKeysHeld() || held_keys.empty())
		return;
	dbs = ExistingDatabases(&n);
	if (dbs == NULL)
		return;
	dropped = DropMirrorsOfGone(dbs, n);
	pfree(dbs);
	if (dropped > 0)
	{
		ereport(LOG, (errmsg("gpu_ivfpq service: %d mirrors of dropped databases freed", dropped)));
		PublishStatus();
	}
}

}								/* namespace svc */
