// The GPU service process: a background worker that starts and supervises
// the GPU process (which owns the CUDA context, or the CPU emulation for
// tests, and the index mirrors), keeps the mirrors coherent through the
// change log, and answers the backends' requests, merging the searches that
// arrive together into one batch per index.
//
// The service itself never touches the device: a fault there (a signal, a
// sticky CUDA error, a hang) ends the GPU process, not a process attached to
// shared memory, so the postmaster does not reinitialise the cluster. The
// requests in flight are answered "service gone" (their backends use the
// CPU engine), and the process is started again after a backoff.
#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/error.h"
#include "gpu_process/gpu_process_client.h"
#include "gpu_process/reply_checks.h"
#include "common/guard.h"
#include "service/shmem.h"

extern "C" {
#include "access/heapam.h"
#include "access/xact.h"
#include "catalog/pg_database.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/pmsignal.h"
#include "storage/ipc.h"
#include "storage/lmgr.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/snapmgr.h"
#include "utils/wait_event.h"

PGDLLEXPORT void gpu_ivfpq_service_main(Datum arg);
}

using gpuivfpq::MirrorKey;
using gpuivfpq::gpuproc::GpuProcess;

/* Service-local state (this process only). */
static std::unique_ptr<GpuProcess> gpu;			/* null while none runs */
static std::map<MirrorKey, uint64> mirror_from;		/* log entries from here apply */
static std::map<MirrorKey, TimestampTz> load_claims;	/* a backend was told to load */
static uint64 log_cursor;
static char *log_vectors;		/* CopyLog's copies of logged vectors (the ring's size) */
static std::vector<MirrorKey> held_keys;	/* MirrorKeysHeld's answer */
static TimestampTz db_check_at;	/* when to look for mirrors of dropped databases */

/* Supervision of the GPU process. */
static bool gpu_expected = true;	/* false once the process said there is no device */
static bool gpu_ever_served;	/* a process served since the service started */
static TimestampTz gpu_restart_at;	/* when to start it again */
static TimestampTz gpu_started_at;
static std::vector<std::string> gpu_arguments;	/* the devices the process was started with */
static int	gpu_backoff_ms;

#define LOAD_CLAIM_MS 30000		/* how long others use the CPU while one loads */
#define DB_CHECK_MS 1000		/* how often mirrors of dropped databases are looked for */
#define GPU_BACKOFF_MIN_MS 1000 /* first restart after a death */
#define GPU_BACKOFF_MAX_MS 60000	/* doubling while it dies young */
#define GPU_STABLE_MS 60000		/* a process that lived this long resets the backoff */
#define GPU_START_TIMEOUT_S 120 /* opening a device (a CUDA context) takes a second or so */
#define GPU_PROCESS_PROGRAM "gpu_ivfpq_gpu_process"
/* Loads, builds and exact search move whole indexes: they get this many timeouts. */
#define GPU_BULK_TIMEOUT_FACTOR 10

/* The change log's head: where a process with no mirror starts reading. */
static uint64
LogHead(void)
{
	uint64		head;

	LWLockAcquire(gpu_ivfpq_service->log_lock, LW_SHARED);
	head = gpu_ivfpq_service->log_head;
	LWLockRelease(gpu_ivfpq_service->log_lock);
	return head;
}

/* The views' figures (mirrors, memory) are refreshed at most this often under writes. */
#define PUBLISH_EVERY_NS ((uint64) 100 * 1000 * 1000)
static uint64 published_at = 0;
static bool served_since_publish = false;	/* requests were answered since: publish at once */

/* A monotonic clock in nanoseconds, for the round's stage timings. */
static uint64
NowNs(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64) ts.tv_sec * 1000000000 + (uint64) ts.tv_nsec;
}

static bool
GpuUp(void)
{
	return gpu && gpu->alive();
}

static MirrorKey
ToKey(const GpuIvfpqKey &k)
{
	MirrorKey key;

	key.db = k.db;
	key.index = k.index;
	key.relnode = k.relnode;
	key.build = k.build;
	return key;
}

static void GpuProcessLost(void);

/* The GPU process, for a call (the service has at most one outstanding). */
static GpuProcess *
GpuSync(void)
{
	return gpu.get();
}

/*
 * Runs device code through the boundary's catch ladder (GpuIvfpqTry): an
 * exception becomes a message for the requester, never an ereport, because
 * the service must answer every request it took.
 */
template <typename F>
static bool
Engine(F &&f, std::string &err, bool *oom = nullptr)
{
	GpuIvfpqCaught caught;

	if (GpuIvfpqTry(std::forward<F>(f), &caught))
		return true;
	err = caught.message;
	if (oom != nullptr)
		*oom = caught.out_of_memory;
	return false;
}

/* The answer for a failed device call: the CPU engine, silently, if the GPU process died. */
static RequestResult
Failed(bool oom)
{
	if (!GpuUp())
		return RES_SERVICE_GONE;
	return oom ? RES_NO_MEMORY : RES_ERROR;
}

static void
RecordError(const std::string &err)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	SpinLockAcquire(&s->mutex);
	strlcpy(s->last_error, err.c_str(), sizeof(s->last_error));
	SpinLockRelease(&s->mutex);
	ereport(LOG, (errmsg("gpu_ivfpq service: %s", err.c_str())));
}

/* Answers a taken slot and wakes its owner (or frees it if abandoned). */
static void
Answer(GpuIvfpqSlot *slot, RequestResult result, const char *error)
{
	Latch	   *latch = NULL;

	slot->result = result;
	strlcpy(slot->error, error ? error : "", sizeof(slot->error));
	SpinLockAcquire(&slot->mutex);
	if (slot->state == SLOT_ABANDONED)
		slot->state = SLOT_FREE;	/* owner kept: a cancelled backend reuses it */
	else
	{
		slot->state = SLOT_DONE;
		latch = slot->latch;
	}
	SpinLockRelease(&slot->mutex);
	if (latch != NULL)
		SetLatch(latch);
}

/* Publishes the mirror list and memory figures for the status functions. */
static void
PublishStatus(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	gpuivfpq::gpuproc::StoreStatus st;
	std::vector<gpuivfpq::DeviceInfo> devs;
	std::string err;
	bool		known = GpuUp() && Engine([&] {
		st = GpuSync()->status();
		devs = GpuSync()->devices();
	}, err);

	/* Without an answer: no mirrors (none, or none reachable); the counts stand. */
	SpinLockAcquire(&s->mutex);
	s->nmirrors = 0;
	for (const auto &info : st.mirrors)
	{
		GpuIvfpqMirrorStatus *m;

		if (s->nmirrors >= GPU_IVFPQ_STATUS_MIRRORS)
			break;
		m = &s->mirrors[s->nmirrors++];
		m->key.db = info.key.db;
		m->key.index = info.key.index;
		m->key.relnode = info.key.relnode;
		m->key.build = info.key.build;
		m->entries = (int64) info.entries;
		m->bytes = (int64) info.bytes;
		m->queries = (int64) info.queries;
		m->vectors = info.vectors;
		m->filter_keys = info.filter_keys;
		m->placement = (int) info.placement;
		m->device_mask = info.device_mask;
		m->metric = info.kind == (uint32_t) gpuivfpq::MirrorKind::Metric;
		m->change_count = info.key.change;
	}
	s->ndevices = 0;
	for (const auto &info : devs)
	{
		GpuIvfpqDeviceStatus *d;

		if (s->ndevices >= GPU_IVFPQ_STATUS_DEVICES)
			break;
		d = &s->devices[s->ndevices++];
		d->device = (int) info.ordinal;
		d->alive = info.alive != 0;
		strlcpy(d->description, info.description, sizeof(d->description));
		d->memory_budget = (int64) info.budget;
		d->memory_used = (int64) info.bytes;
		d->queries = (int64) info.queries;
		d->batches = (int64) info.batches;
		d->busy_us = (int64) (info.busy_ns / 1000);
	}
	s->memory_used = (int64) st.bytes;
	if (known)
	{
		s->memory_budget = (int64) st.budget;
		s->evictions += (int64) st.evictions - s->evictions_base;
		s->evictions_base = (int64) st.evictions;
	}
	SpinLockRelease(&s->mutex);
}

/*
 * The mirror memory budget of each GPU: the setting, or 0 for the GPU
 * process's default, three quarters of each GPU (the rest is search
 * scratch, builds and other processes).
 */
static size_t
BudgetBytes(void)
{
	return (size_t) gpu_ivfpq_gpu_memory_budget_kb * 1024;
}

/* Drops a mirror whose update failed: it reloads from the pages on next use. */
static void
DropAfterFailure(const MirrorKey &key, const char *what, const std::string &err)
{
	std::string ignored;

	(void) Engine([&] { GpuSync()->drop_index(key.db, key.index); }, ignored);
	RecordError(std::string(what) + " failed, mirror dropped: " + err);
}

/*
 * Copies the change log from position from to its head (*head), only the
 * entries of one index when only is set, with the vectors that wanted(entry)
 * asks for: each such entry's vec_pos becomes the offset of its vector in
 * log_vectors, or its vdim -1 when writers overwrote the vector before this
 * read (its mirror cannot take the entry: the caller drops it). false when
 * writers lapped the log itself. entries must have room for the whole ring
 * reserved and wanted must not allocate: nothing may throw while the lock
 * is held. The copies hold until the next call.
 */
template <typename Wanted>
static bool
CopyLog(uint64 from, uint64 *head, const MirrorKey *only, std::vector<GpuIvfpqLogEntry> &entries,
		Wanted &&wanted)
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
		Size		bytes = sizeof(float) * Max(e->vdim, 0);

		if (only != NULL && (e->key.db != only->db || e->key.index != only->index))
			continue;
		entries.push_back(*e);
		if (bytes == 0)
			continue;
		if (!wanted(*e))
		{
			entries.back().vdim = 0;	/* not applied: its vector is not needed */
			continue;
		}
		/*
		 * Intact vectors lie in the ring's last GPU_IVFPQ_VECTOR_RING_BYTES,
		 * one region each: their copies fit log_vectors.
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
 * Appends logged entries (codes of m bytes, and their vectors when they
 * carry them, copied by CopyLog) to the mirror of key; false when the GPU
 * process holds no such mirror. Throws on a device error.
 */
static bool
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
		lists.push_back(e->list);
		labels.push_back(e->label);
		keys.push_back(e->filter_key);
		codes.insert(codes.end(), e->code, e->code + m);
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
static void
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
				(void) Engine([&] { GpuSync()->drop_index(key.db, key.index); }, err);
				removals = true;
				continue;
			}
			auto		from = mirror_from.find(key);

			if (from == mirror_from.end() || e.seq < from->second)
				continue;		/* no mirror, or one loaded after this change */
			if (e.vdim < 0)
			{
				std::string err;

				/* Its vector was overwritten before this read: the mirror reloads from the pages. */
				(void) Engine([&] { GpuSync()->drop_index(key.db, key.index); }, err);
				ereport(LOG,
						(errmsg("gpu_ivfpq service: the vector ring overflowed, the mirror of index %u dropped",
								key.index)));
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
	log_cursor = head;
	pg_atomic_write_u64(&s->log_applied, head);
	/* Commits and VACUUMs that waited for these changes go on; so do the searches queued after them. */
	GpuIvfpqLogAppliedAdvanced();
	GpuIvfpqQueueSetApplied(head);
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
		load_claims.erase(key);
	}
	return dropped;
}

/* Every DB_CHECK_MS: the mirrors of databases dropped since go (see above). */
static void
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

/* The requests taken by the current round (a plain array: it outlives an ERROR). */
static GpuIvfpqSlot **taken;
static int	ntaken;

/* Claims the pending requests, marking them running; returns how many. */
static int
Collect(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	for (int i = 0; i < s->nslots; i++)
	{
		GpuIvfpqSlot *slot = &s->slots[i];

		if (slot->state != SLOT_PENDING)	/* unlocked peek; rechecked below */
			continue;
		SpinLockAcquire(&slot->mutex);
		if (slot->state == SLOT_PENDING)
		{
			slot->state = SLOT_RUNNING;
			taken[ntaken++] = slot;
		}
		SpinLockRelease(&slot->mutex);
	}
	return ntaken;
}

static void
CountBatch(int n)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	int			bucket = 0;

	while (bucket < GPU_IVFPQ_BATCH_BUCKETS - 1 && (1 << (bucket + 1)) <= n)
		bucket++;
	pg_atomic_fetch_add_u64(&s->batches, 1);
	pg_atomic_fetch_add_u64(&s->queries_gpu, n);
	pg_atomic_fetch_add_u64(&s->batch_hist[bucket], 1);
}

static gpuivfpq::Placement
PlacementOf(int32 placement)
{
	switch (placement)
	{
		case GPU_IVFPQ_PLACEMENT_REPLICATE:
			return gpuivfpq::Placement::Replicate;
		case GPU_IVFPQ_PLACEMENT_SHARD:
			return gpuivfpq::Placement::Shard;
	}
	return gpuivfpq::Placement::Auto;
}

static gpuivfpq::MirrorSpec
SpecFrom(const GpuIvfpqDsmHeader *h, const char *base, const GpuIvfpqDsmLayout &l)
{
	gpuivfpq::MirrorSpec spec;

	spec.d = h->d;
	spec.lists = h->lists;
	spec.m = h->m;
	spec.metric = (gpuivfpq::Metric) h->metric;
	spec.centroids = (const float *) (base + l.centroids);
	spec.codebooks = (const float *) (base + l.codebooks);
	spec.vectors = h->vectors != 0;
	spec.filter_keys = h->filter_keys != 0;
	return spec;
}

/*
 * Builds a mirror from the entries a backend read from the pages, then
 * applies the changes logged since it started reading (skipping entries it
 * already saw). An invalidation in that window, or a lapped log, means the
 * pages changed under the reader: the mirror is not kept.
 */
static RequestResult
Load(GpuIvfpqSlot *slot, const char *base, std::string &err)
{
	const GpuIvfpqDsmHeader *h = (const GpuIvfpqDsmHeader *) base;
	GpuIvfpqDsmLayout l = GpuIvfpqDsmLayoutFor(REQ_LOAD, h);
	MirrorKey	key = ToKey(slot->key);
	gpuivfpq::MirrorSpec spec = SpecFrom(h, base, l);
	const int64 *labels = (const int64 *) (base + l.labels);
	std::vector<GpuIvfpqLogEntry> window;
	uint64		head;
	bool		oom = false;
	bool		changed = false;

	if (!Engine([&] {
			GpuSync()->load(key, spec, (size_t) h->n, (const int32_t *) (base + l.lists),
					  (const uint8_t *) (base + l.codes), (const int64_t *) labels,
					  spec.vectors ? (const float *) (base + l.vectors) : nullptr,
					  spec.filter_keys ? (const int64_t *) (base + l.keys) : nullptr,
					  PlacementOf(h->placement), true);
		}, err, &oom))
		return Failed(oom);

	/* Room for the whole ring first: nothing below may throw while the lock is held. */
	if (!Engine([&] { window.reserve(GPU_IVFPQ_LOG_SIZE); }, err, &oom))
		changed = true;
	else
		changed = !CopyLog(slot->log_start, &head, &key, window, [](const GpuIvfpqLogEntry &) { return true; });

	if (!changed && !Engine([&] {
			std::unordered_set<int64_t> seen;
			std::vector<const GpuIvfpqLogEntry *> fresh;

			for (const auto &e : window)
			{
				/*
				 * The pages changed under the reader beyond appends, or a
				 * vector was overwritten before it was read: load again later.
				 */
				if (e.kind == LOG_INVALIDATE || e.kind == LOG_REMOVE || e.vdim < 0)
				{
					changed = true;
					return;
				}
				if (!(ToKey(e.key) == key))
					continue;
				if (seen.empty())
					seen.insert(labels, labels + h->n);
				if (seen.insert(e.label).second)
					fresh.push_back(&e);
			}
			if (!AddLogged(key, h->m, fresh))
			{
				changed = true; /* evicted already: nothing to keep */
				return;
			}
			/*
			 * Everything before head is in; the main loop applies later
			 * entries, which searches queued after them wait for. Only now
			 * may the direct path search it (loaded hidden).
			 */
			if (!GpuSync()->reveal(key))
			{
				changed = true; /* evicted already: nothing to keep */
				return;
			}
			mirror_from[key] = head;
			load_claims.erase(key); /* a failed load keeps its claim: others use the CPU a while */
		}, err, &oom))
		changed = true;
	if (changed)
	{
		std::string ignored;

		/* No mirror without its log position: DrainLog would never update it. */
		(void) Engine([&] { GpuSync()->drop_index(key.db, key.index); }, ignored);
		if (err.empty())
		{
			/*
			 * Not a failure: VACUUM or a rebuild changed the pages under the
			 * reader. The CPU serves this scan quietly and the next scan of
			 * the index loads it again (no claim keeps others waiting).
			 */
			load_claims.erase(key);
			err = "the index changed while its mirror was loading; the next scan loads it again";
			return GpuUp() ? RES_LOADING : RES_SERVICE_GONE;
		}
		return Failed(oom);
	}
	PublishStatus();			/* before the answer, so the loader sees its mirror listed */
	return RES_OK;
}

static RequestResult
Train(char *base, std::string &err)
{
	const GpuIvfpqDsmHeader *h = (const GpuIvfpqDsmHeader *) base;
	GpuIvfpqDsmLayout l = GpuIvfpqDsmLayoutFor(REQ_TRAIN, h);
	gpuivfpq::IvfPqTrainParams params;
	bool		oom = false;

	params.iterations = h->iterations;
	params.seed = h->seed;
	params.max_points_per_centroid = h->max_points_per_centroid;
	if (!Engine([&] {
			GpuSync()->train((const float *) (base + l.rows), (size_t) h->n, h->d, h->lists, h->m,
					   (gpuivfpq::Metric) h->metric, params, (float *) (base + l.centroids),
					   (float *) (base + l.codebooks));
		}, err, &oom))
		return Failed(oom);
	return RES_OK;
}

static RequestResult
Encode(GpuIvfpqSlot *slot, char *base, std::string &err)
{
	const GpuIvfpqDsmHeader *h = (const GpuIvfpqDsmHeader *) base;
	GpuIvfpqDsmLayout l = GpuIvfpqDsmLayoutFor(REQ_ENCODE, h);
	gpuivfpq::MirrorSpec spec = SpecFrom(h, base, l);
	bool		oom = false;

	if (!Engine([&] {
			GpuSync()->encode(spec, (const float *) (base + l.rows), (size_t) Min(slot->n, h->n),
						(int32_t *) (base + l.lists), (uint8_t *) (base + l.codes));
		}, err, &oom))
		return Failed(oom);
	return RES_OK;
}

/*
 * Many queries of one backend (batch search) against a mirror (the GPU
 * process tiles them so the device's scratch space stays bounded); counted
 * as one batch.
 */
static RequestResult
SearchBatch(GpuIvfpqSlot *slot, char *base, std::string &err)
{
	MirrorKey	key = ToKey(slot->key);
	const float *queries = (const float *) (base + GPU_IVFPQ_BATCH_QUERIES);
	int64	   *labels = (int64 *) (base + GpuIvfpqBatchLabelsOffset(slot->n, slot->dim));
	double	   *exact = (double *) (base + GpuIvfpqBatchExactOffset(slot->n, slot->dim, slot->k));
	bool		oom = false;
	bool		found = false;
	bool		is_exact = false;

	if (!Engine([&] {
			found = GpuSync()->search(key, slot->dim, queries, slot->n, slot->k, slot->nprobe, nullptr, nullptr,
								nullptr, reinterpret_cast<int64_t *>(labels), exact, &is_exact, slot->brute);
		}, err, &oom))
		return Failed(oom);
	if (!found)
		return RES_NOT_LOADED;
	slot->exact = is_exact;
	CountBatch((int) Min(slot->n, (int64) INT_MAX));
	return RES_OK;
}

/* Exact k-NN of a backend's queries among the base rows it sent. */
static RequestResult
Exact(GpuIvfpqSlot *slot, char *base, std::string &err)
{
	const GpuIvfpqDsmHeader *h = (const GpuIvfpqDsmHeader *) base;
	GpuIvfpqExactLayout l = GpuIvfpqExactLayoutFor(h->m, h->n, h->d, slot->k);
	bool		oom = false;

	if (!Engine([&] {
			GpuSync()->exact_knn((const float *) (base + l.queries), h->m, (const float *) (base + l.base),
						   h->n, h->d, (gpuivfpq::Metric) h->metric, slot->k,
						   (float *) (base + l.dist), (int64_t *) (base + l.labels));
		}, err, &oom))
		return Failed(oom);
	return RES_OK;
}

/* A gpu_metric mirror's key: the index version and its metapage change count. */
static MirrorKey
MetricKey(const GpuIvfpqSlot *slot)
{
	MirrorKey	key = ToKey(slot->key);

	key.change = slot->change_count;
	return key;
}

/*
 * Mirrors a gpu_metric index from the state a backend read (its restored
 * copy, current for the change count in the key) into a DSM segment. No
 * change log: a later change makes another key, loaded anew.
 */
static RequestResult
MetricLoad(GpuIvfpqSlot *slot, const char *base, Size size, std::string &err)
{
	const GpuMetricLoadHeader *h = (const GpuMetricLoadHeader *) base;
	MirrorKey	key = MetricKey(slot);
	GpuMetricLoadLayout l;
	bool		oom = false;

	/* Checked before any size is computed from them: the layout must not overflow. */
	if (size < sizeof(*h) || h->n < 0 || h->ncps < 0 || h->clusters < 0 || (Size) h->n > size ||
		(Size) h->ncps > size || (Size) h->clusters > size ||
		(l = GpuMetricLoadLayoutFor(h)).total > size)
	{
		err = "a malformed gpu_metric mirror load";
		return RES_ERROR;
	}
	if (!Engine([&] {
			const bool	lc = h->method == 1;	/* GPU_METRIC_METHOD_LC */
			std::vector<int64_t> labels((size_t) h->n);
			gpuivfpq::MetricSpec spec;

			/* Labels are the object ids: the backend maps them to heap TIDs itself. */
			for (size_t i = 0; i < labels.size(); i++)
				labels[i] = (int64_t) i;
			spec.method = lc ? gpuivfpq::MetricMethod::ListOfClusters : gpuivfpq::MetricMethod::SparseSpatialSelection;
			spec.words.n = (size_t) h->n;
			spec.words.code_points = (const uint32_t *) (base + l.cps);
			spec.words.offsets = (const uint64_t *) (base + l.offsets);
			if (spec.words.offsets[h->n] > (uint64) h->ncps)
				throw gpuivfpq::Error(gpuivfpq::ErrorKind::InvalidArgument,
									  "a gpu_metric mirror load's offsets lie outside its code points");
			spec.labels = labels.data();
			spec.removed = (const uint8_t *) (base + l.removed);
			if (lc)
			{
				spec.bucket = (size_t) h->bucket;
				spec.clusters = (size_t) h->clusters;
				spec.centres = (const uint32_t *) (base + l.structure);
				spec.radii = spec.centres + h->clusters;
				spec.cluster_of = (const uint32_t *) (base + l.parts);
			}
			else
			{
				spec.alpha = h->alpha;
				spec.max_distance = h->max_distance;
				spec.pivots = (size_t) h->clusters;
				spec.pivot_ids = (const uint32_t *) (base + l.structure);
				spec.table = (const uint8_t *) (base + l.parts);
			}
			(void) GpuSync()->metric_load(key, spec);
		}, err, &oom))
		return Failed(oom);
	load_claims.erase(key);
	PublishStatus();			/* before the answer, so the loader sees its mirror listed */
	return RES_OK;
}

/* Whether a gpu_metric search request is sound in capacity bytes at base (metric_request.h); its layout into *l. */
static bool
MetricRequestValid(const GpuIvfpqSlot *slot, const char *base, Size capacity, GpuMetricSearchLayout *l)
{
	return gpuivfpq::metric_request_sound(slot->n, slot->ncps, slot->nradii, slot->k, base, capacity, l);
}

/* No mirror of key: the first asker loads it (RES_NOT_LOADED), the others use the CPU meanwhile. */
static RequestResult
MetricNotLoaded(const MirrorKey &key)
{
	TimestampTz now = GetCurrentTimestamp();
	auto		claim = load_claims.find(key);

	if (claim != load_claims.end() && !TimestampDifferenceExceeds(claim->second, now, LOAD_CLAIM_MS))
		return RES_LOADING;
	load_claims[key] = now;
	return RES_NOT_LOADED;
}

/*
 * Searches a gpu_metric mirror (range, or k-NN with slot->k > 0) with the
 * queries of a request of capacity bytes at base, writing the answer after
 * them; slot->needed says how many bytes it needs when they do not fit. No
 * mirror: the first asker loads it (RES_NOT_LOADED), the others use the
 * CPU meanwhile (RES_LOADING).
 */
static RequestResult
MetricSearch(GpuIvfpqSlot *slot, char *base, Size capacity, std::string &err)
{
	MirrorKey	key = MetricKey(slot);
	int64		nq = slot->n;
	GpuMetricSearchLayout l;
	bool		found = false;
	bool		oom = false;
	size_t		live = 0;

	slot->needed = 0;
	if (!MetricRequestValid(slot, base, capacity, &l))
	{
		err = "a malformed gpu_metric search request";
		return RES_ERROR;
	}
	if (!Engine([&] {
			gpuivfpq::MetricHits hits;
			gpuivfpq::MetricWords words;

			words.n = (size_t) nq;
			words.code_points = (const uint32_t *) (base + l.cps);
			words.offsets = (const uint64_t *) (base + l.offsets);
			found = GpuSync()->metric_search(key, words, (size_t) slot->k, (const uint32_t *) (base + l.radii),
											 (size_t) slot->nradii, hits, &live);
			if (found)
			{
				uint64_t	need = gpuivfpq::write_metric_answer(hits.offsets.data(), hits.ids.data(),
																 hits.distances.data(), hits.evaluations.data(),
																 hits.evaluations.size(), 0, (size_t) nq, base,
																 capacity, l, &slot->evaluations);

				slot->needed = need > capacity ? need : 0;
			}
		}, err, &oom))
		return Failed(oom);
	if (!found)
		return MetricNotLoaded(key);
	slot->live = (int64) live;
	if (slot->needed == 0)
		CountBatch((int) Min(nq, (int64) PG_INT32_MAX));
	return RES_OK;
}

/* Serves a request that carries a DSM segment (load, train, encode, batch search, exact). */
static void
ServeSegmentRequest(GpuIvfpqSlot *slot)
{
	dsm_segment *seg = NULL;
	RequestResult result = RES_ERROR;
	std::string err;
	GpuIvfpqCaught caught;

	/* dsm_attach can ERROR (the requester gave up and destroyed it): the reverse guard. */
	if (!GpuIvfpqTry([&] { GpuIvfpqPgCall([&] { seg = dsm_attach(slot->dsm); }); }, &caught) ||
		seg == NULL)
	{
		/*
		 * A failure after dsm_attach registered the segment (the worker has
		 * no resource owner to release it) would keep it alive: detach.
		 */
		(void) GpuIvfpqTry([&] {
			GpuIvfpqPgCall([&] {
				dsm_segment *half = dsm_find_mapping(slot->dsm);

				if (half != NULL)
					dsm_detach(half);
			});
		}, &caught);
		Answer(slot, RES_ERROR, "request segment is gone");
		return;
	}
	switch (slot->kind)
	{
		case REQ_LOAD:
			result = Load(slot, (char *) dsm_segment_address(seg), err);
			break;
		case REQ_TRAIN:
			result = Train((char *) dsm_segment_address(seg), err);
			break;
		case REQ_ENCODE:
			result = Encode(slot, (char *) dsm_segment_address(seg), err);
			break;
		case REQ_SEARCH_BATCH:
			result = SearchBatch(slot, (char *) dsm_segment_address(seg), err);
			break;
		case REQ_EXACT:
			result = Exact(slot, (char *) dsm_segment_address(seg), err);
			break;
		case REQ_METRIC_LOAD:
			result = MetricLoad(slot, (const char *) dsm_segment_address(seg), dsm_segment_map_length(seg), err);
			break;
		case REQ_METRIC_SEARCH:
			result = MetricSearch(slot, (char *) dsm_segment_address(seg), dsm_segment_map_length(seg), err);
			break;
		case REQ_SEARCH:
			/* Scan rounds go through the direct path (direct_path.cpp), never here. */
			err = "a scan round was sent to the service";
			break;
	}
	GpuIvfpqPgCall([&] { dsm_detach(seg); });
	if (result != RES_OK && result != RES_SERVICE_GONE && result != RES_LOADING && !err.empty())
		RecordError(err);
	Answer(slot, result, err.c_str());
}

/* Serves the taken requests in turn. */
static void
Serve(void)
{
	for (int i = 0; i < ntaken; i++)
	{
		ServeSegmentRequest(taken[i]);
		/* Long requests must not hold up DROP DATABASE and friends (their barriers). */
		GpuIvfpqPgCall([] {
			if (ProcSignalBarrierPending)
				ProcessProcSignalBarrier();
		});
	}
}

/*
 * One round over the taken requests, C++ code run under GpuIvfpqTry (its
 * PostgreSQL calls go through GpuIvfpqPgCall): whatever fails inside, the
 * round's requests still get an answer.
 */
static void
ServeRound(void)
{
	GpuIvfpqCaught caught;

	if (!GpuIvfpqTry([&] {
			if (!GpuUp())
			{
				/* Sent before the GPU process died: the CPU engine answers them. */
				for (int i = 0; i < ntaken; i++)
					Answer(taken[i], RES_SERVICE_GONE, "the GPU process is restarting");
				return;
			}
			/* After collecting: a change logged before a request was sent is applied first. */
			DrainLog();
			Serve();
		}, &caught))
	{
		RecordError(std::string("a request round failed: ") + caught.message);
		for (int i = 0; i < ntaken; i++)
			if (taken[i]->state == SLOT_RUNNING || taken[i]->state == SLOT_ABANDONED)
				Answer(taken[i], RES_ERROR, caught.message);
	}
}

/* Answers every request still open when the service exits, however it exits. */
static void
ServiceExit(int code, Datum arg)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	SpinLockAcquire(&s->mutex);
	s->pid = 0;
	s->latch = NULL;
	s->state = SERVICE_STOPPED;
	SpinLockRelease(&s->mutex);
	for (int i = 0; i < s->nslots; i++)
	{
		GpuIvfpqSlot *slot = &s->slots[i];
		SlotState	st;

		SpinLockAcquire(&slot->mutex);
		st = slot->state;
		SpinLockRelease(&slot->mutex);
		if (st == SLOT_PENDING || st == SLOT_RUNNING || st == SLOT_ABANDONED)
			Answer(slot, RES_SERVICE_GONE, "the gpu_ivfpq service exited");
	}
	/* Mirrors live in the GPU process's device memory: they go with it. */
	gpu.reset();
	GpuIvfpqQueueDestroy("the gpu_ivfpq service exited");
}

/* While a GPU call waits: give up (and end the GPU process) when the service must stop. */
static bool
StopWaiting(void)
{
	return ProcDiePending || !PostmasterIsAlive();
}

/* Publishes the state, the device and the GPU process's pid. */
static void
PublishState(ServiceState state, const char *device)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	SpinLockAcquire(&s->mutex);
	s->state = state;
	if (device != NULL)
		strlcpy(s->device, device, sizeof(s->device));
	s->gpu_pid = GpuUp() ? gpu->pid() : 0;
	SpinLockRelease(&s->mutex);
}

/*
 * The GPU process's device arguments: the GPUs gpu_ivfpq.devices lists
 * (blanks dropped), among as many emulated ones as the test setting asks
 * for when the GPU is emulated.
 */
static std::vector<std::string>
DeviceArguments(void)
{
	std::vector<std::string> args;
	std::string list;

	if (gpu_ivfpq_service_emulate_gpu)
		args = {"--emulated-devices", std::to_string(gpu_ivfpq_service_emulate_devices)};
	for (const char *p = gpu_ivfpq_device_list; p != NULL && *p != '\0'; p++)
		if (*p != ' ')
			list += *p;
	if (!list.empty())
		args.insert(args.end(), {"--devices", list});
	return args;
}

/*
 * Starts the GPU process (the emulation if asked for, else every CUDA
 * device it may use) and gives it the memory budget. No device at all leaves the
 * service CPU-only for good; any other failure is retried after a backoff.
 */
static void
StartGpuProcess(void)
{
	char		program[MAXPGPATH];
	std::string err;
	bool		no_device = false;
	ServiceState state;

	snprintf(program, sizeof(program), "%s/%s", pkglib_path, GPU_PROCESS_PROGRAM);
	if (!Engine([&] {
			try
			{
				gpu_arguments = DeviceArguments();
				gpu = GpuProcess::start(program, "gpu_ivfpq: GPU process", gpu_ivfpq_service_emulate_gpu,
										StopWaiting, GPU_START_TIMEOUT_S, gpu_arguments, GpuIvfpqQueueFd());
			}
			catch (const gpuivfpq::gpuproc::StartError &e)
			{
				no_device = e.no_device();
				throw;
			}
			gpu->set_timeout(gpu_ivfpq_gpu_timeout_s, GPU_BULK_TIMEOUT_FACTOR);
			/* Mirrors hold heap TIDs: a search answering anything else is malformed. */
			gpu->set_label_check(gpuivfpq::replycheck::tid_label);
			GpuSync()->set_budget(BudgetBytes());
		}, err))
	{
		gpu.reset();
		/*
		 * No device at all: CPU-only for good, unless a device served
		 * before (a GPU can vanish for a while after a fault or a driver
		 * reset): then retry, at the longest backoff.
		 */
		if (no_device && gpu_ever_served)
			gpu_backoff_ms = GPU_BACKOFF_MAX_MS;
		else if (no_device)
		{
			gpu_expected = false;
			ereport(LOG, (errmsg("gpu_ivfpq service: no usable GPU: %s", err.c_str())));
			/* The process says "none (why)"; a missing program gets the same form. */
			if (err.compare(0, 4, "none") != 0)
				err = "none (" + err + ")";
			PublishState(SERVICE_CPU_ONLY, err.c_str());
			return;
		}
		gpu_restart_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), gpu_backoff_ms);
		gpu_backoff_ms = Min(gpu_backoff_ms * 2, GPU_BACKOFF_MAX_MS);
		RecordError("the GPU process failed to start: " + err);
		PublishState(SERVICE_RESTARTING, NULL);
		return;
	}
	gpu_expected = true;
	gpu_ever_served = true;
	gpu_started_at = GetCurrentTimestamp();
	/* A new process holds no mirror: changes logged so far are in the pages. */
	mirror_from.clear();
	load_claims.clear();
	log_cursor = LogHead();
	GpuIvfpqQueueSetApplied(log_cursor);
	SpinLockAcquire(&gpu_ivfpq_service->mutex);
	gpu_ivfpq_service->evictions_base = 0;
	SpinLockRelease(&gpu_ivfpq_service->mutex);
	state = gpu->kind() == gpuivfpq::gpuproc::Kind::Gpu ? SERVICE_GPU : SERVICE_EMULATED;
	PublishStatus();			/* its devices, before the state says it serves */
	published_at = NowNs();
	PublishState(state, gpu->description().c_str());
	ereport(LOG, (errmsg("gpu_ivfpq service: GPU process %d serving on %s",
						 (int) gpu->pid(), gpu->description().c_str())));
}

/*
 * After the GPU process died (noticed by a failed call or while idle):
 * count it and its cause, forget its mirrors, and schedule the restart,
 * sooner when it had run a while, later when it keeps dying young.
 */
static void
GpuProcessLost(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	TimestampTz now = GetCurrentTimestamp();
	std::string cause = gpu->cause();

	gpu.reset();
	/* What it held or was queued for it: the CPU engine answers. */
	GpuIvfpqQueueFailAll("the GPU process is restarting");
	mirror_from.clear();
	load_claims.clear();
	if (TimestampDifferenceExceeds(gpu_started_at, now, GPU_STABLE_MS))
		gpu_backoff_ms = GPU_BACKOFF_MIN_MS;
	gpu_restart_at = TimestampTzPlusMilliseconds(now, gpu_backoff_ms);
	SpinLockAcquire(&s->mutex);
	s->gpu_restarts++;
	strlcpy(s->last_gpu_exit, cause.c_str(), sizeof(s->last_gpu_exit));
	s->last_gpu_exit_at = now;
	SpinLockRelease(&s->mutex);
	ereport(LOG,
			(errmsg("gpu_ivfpq service: the GPU process %s", cause.c_str()),
			 errdetail("Scans use the CPU engine until it restarts, in %d ms; mirrors reload on demand.",
					   gpu_backoff_ms)));
	gpu_backoff_ms = Min(gpu_backoff_ms * 2, GPU_BACKOFF_MAX_MS);
	PublishState(SERVICE_RESTARTING, NULL);
	PublishStatus();
}

/*
 * The service's main loop. SIGTERM ends it with FATAL (exit code 1), so the
 * postmaster starts it again after bgw_restart_time unless it is shutting
 * down; an ERROR inside the loop is logged, answers the requests in hand,
 * and the loop goes on.
 */
void
gpu_ivfpq_service_main(Datum arg)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	sigjmp_buf	local_sigjmp_buf;
	MemoryContext loopctx;
	static std::string err;	/* static: survives the sigsetjmp below */

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	/* The GPU process is this process's child: its exit status tells why it died. */
	pqsignal(SIGCHLD, SIG_DFL);
	BackgroundWorkerUnblockSignals();
	/* No database: this only makes the service visible in pg_stat_activity. */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_activity(STATE_IDLE, NULL);
	before_shmem_exit(ServiceExit, (Datum) 0);
	loopctx = AllocSetContextCreate(TopMemoryContext, "gpu_ivfpq service loop", ALLOCSET_DEFAULT_SIZES);

	/* Requests left by an earlier incarnation get an answer now. */
	for (int i = 0; i < s->nslots; i++)
	{
		GpuIvfpqSlot *slot = &s->slots[i];

		if (slot->state == SLOT_PENDING || slot->state == SLOT_RUNNING || slot->state == SLOT_ABANDONED)
			Answer(slot, RES_SERVICE_GONE, "the gpu_ivfpq service restarted");
	}
	log_cursor = LogHead();		/* no mirror exists yet: older changes are in the pages */

	SpinLockAcquire(&s->mutex);
	s->pid = MyProcPid;
	s->latch = MyLatch;
	s->starts++;
	s->started_at = GetCurrentTimestamp();
	s->state = SERVICE_STARTING;
	s->last_error[0] = '\0';
	SpinLockRelease(&s->mutex);
	gpu_backoff_ms = GPU_BACKOFF_MIN_MS;
	{
		char		qerr[256];

		/* Without it scans use the CPU engine; builds, loads and batch functions still use the GPU. */
		if (!GpuIvfpqQueueCreate(qerr, sizeof(qerr)))
			ereport(LOG, (errmsg("gpu_ivfpq service: no direct path for scans: %s", qerr)));
	}
	StartGpuProcess();
	PublishStatus();

	taken = (GpuIvfpqSlot **) MemoryContextAlloc(TopMemoryContext, sizeof(GpuIvfpqSlot *) * s->nslots);
	ntaken = 0;
	log_vectors = (char *) MemoryContextAllocHuge(TopMemoryContext, GPU_IVFPQ_VECTOR_RING_BYTES);
	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
	{
		/*
		 * An ERROR in the loop's PostgreSQL part (the C++ part runs under
		 * GpuIvfpqTry, so no C++ frame lies between here and the error):
		 * report it, answer what was in hand, go on.
		 */
		ErrorData  *edata;

		HOLD_INTERRUPTS();
		error_context_stack = NULL;
		pgstat_report_wait_end();
		LWLockReleaseAll();
		/* The check of pg_database runs in a transaction (CheckDroppedDatabases). */
		AbortCurrentTransaction();
		MemoryContextSwitchTo(loopctx);
		edata = CopyErrorData();
		FlushErrorState();
		RecordError(edata->message ? edata->message : "error");
		for (int i = 0; i < ntaken; i++)
			if (taken[i]->state == SLOT_RUNNING || taken[i]->state == SLOT_ABANDONED)
				Answer(taken[i], RES_ERROR, "the gpu_ivfpq service failed");
		ntaken = 0;
		MemoryContextReset(loopctx);
		RESUME_INTERRUPTS();
	}
	PG_exception_stack = &local_sigjmp_buf;

	for (;;)
	{
		MemoryContextSwitchTo(loopctx);
		MemoryContextReset(loopctx);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			/* Another list of GPUs: a new process opens them; mirrors reload there on demand. */
			if (DeviceArguments() != gpu_arguments)
			{
				ereport(LOG, (errmsg("gpu_ivfpq service: gpu_ivfpq.devices changed, restarting the GPU process")));
				gpu.reset();
				GpuIvfpqQueueFailAll("the GPU process is restarting");
				mirror_from.clear();
				load_claims.clear();
				gpu_expected = true;
				gpu_backoff_ms = GPU_BACKOFF_MIN_MS;
				gpu_restart_at = GetCurrentTimestamp();
				gpu_arguments = DeviceArguments();
				PublishState(SERVICE_RESTARTING, NULL);
				PublishStatus();
			}
			GpuIvfpqQueueSettings(gpu_ivfpq_batch_size, gpu_ivfpq_batch_wait_us, gpu_ivfpq_batches_in_flight,
								  gpu_ivfpq_gpu_poll_us);
			if (GpuUp())
				(void) Engine([&] {
					gpu->set_timeout(gpu_ivfpq_gpu_timeout_s, GPU_BULK_TIMEOUT_FACTOR);
					GpuSync()->set_budget(BudgetBytes());
					GpuSync()->enforce_budget();
				}, err);
		}
		/*
		 * Supervision: a direct-path search queued, or a batch running,
		 * longer than gpu_timeout means a hung GPU process.
		 */
		if (GpuUp() && gpu_ivfpq_gpu_timeout_s > 0)
		{
			uint64		since = GpuIvfpqQueueStalledSinceNs();

			if (since != 0 && GpuIvfpqQueueNowNs() - since > (uint64) gpu_ivfpq_gpu_timeout_s * 1000000000)
				gpu->kill_hung("did not answer within " + std::to_string(gpu_ivfpq_gpu_timeout_s) + " s");
		}
		/* Notice a death while idle; restart when the backoff is over. */
		if (gpu && (gpu->check_exit() || !gpu->alive()))
			GpuProcessLost();
		if (!gpu && gpu_expected && GetCurrentTimestamp() >= gpu_restart_at)
			StartGpuProcess();
		if (!gpu)
			GpuIvfpqQueueFailAll("the GPU process is restarting");	/* queued as it went */
		CheckDroppedDatabases();
		ResetLatch(MyLatch);
		ntaken = 0;
		(void) Collect();
		if (ntaken == 0)
		{
			long		timeout = 1000L;
			uint64		now = NowNs();
			bool		publish = served_since_publish || now - published_at >= PUBLISH_EVERY_NS;

			/*
			 * Writers wake the service for each change (commits wait for
			 * it): the log is applied at once, the views (calls to the GPU
			 * process) follow at most every PUBLISH_EVERY_NS; after
			 * requests (loads, batch functions, gpu_metric) at once.
			 */
			(void) Engine([&] {
				DrainLog();
				if (publish)
					PublishStatus();
			}, err);
			if (publish)
			{
				published_at = now;
				served_since_publish = false;
			}
			else
				timeout = PUBLISH_EVERY_NS / 1000000;
			if (!gpu && gpu_expected)
				timeout = Max(10L, Min(timeout, (long) ((gpu_restart_at - GetCurrentTimestamp()) / 1000)));
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout,
							 PG_WAIT_EXTENSION);
			continue;
		}
		ServeRound();
		ntaken = 0;
		served_since_publish = true;
	}
}
