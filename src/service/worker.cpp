// The GPU service process: a background worker that owns the compute device
// (the CUDA context, or the CPU emulation for tests), keeps index mirrors
// coherent through the change log, and answers the backends' requests,
// merging the searches that arrive together into one batch per index.
#include <algorithm>
#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/error.h"
#include "service/device/mirror_store.h"
#include "common/guard.h"
#include "service/shmem.h"
#ifdef GPU_IVFPQ_WITH_CUDA
#include "service/device/cuda_device.h"
#endif

extern "C" {
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/wait_event.h"

PGDLLEXPORT void gpu_ivfpq_service_main(Datum arg);
}

using gpuivfpq::MirrorKey;

/* Service-local state (this process only). */
static std::unique_ptr<gpuivfpq::ComputeDevice> device;
static std::unique_ptr<gpuivfpq::MirrorStore> store;
static std::map<MirrorKey, uint64> mirror_from;		/* log entries from here apply */
static std::map<MirrorKey, TimestampTz> load_claims;	/* a backend was told to load */
static uint64 log_cursor;

#define LOAD_CLAIM_MS 30000		/* how long others use the CPU while one loads */

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
	std::vector<gpuivfpq::MirrorInfo> infos;
	std::string err;
	size_t		used = 0;

	if (!store)
		return;
	(void) Engine([&] { infos = store->list(); used = store->bytes(); }, err);
	SpinLockAcquire(&s->mutex);
	s->nmirrors = 0;
	for (const auto &info : infos)
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
	}
	s->memory_used = (int64) used;
	s->memory_budget = (int64) store->budget();
	s->evictions = (int64) store->evictions();
	SpinLockRelease(&s->mutex);
}

/* The mirror memory budget: the GUC, or a share of the device when 0. */
static size_t
BudgetBytes(void)
{
	if (gpu_ivfpq_gpu_memory_budget_kb > 0)
		return (size_t) gpu_ivfpq_gpu_memory_budget_kb * 1024;
	/* Leave a quarter for search scratch, builds and other processes. */
	return device->memory_capacity() / 4 * 3;
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
	LWLockAcquire(s->log_lock, LW_SHARED);
	head = s->log_head;
	lapped = head - log_cursor > GPU_IVFPQ_LOG_SIZE;
	if (!lapped)
		for (uint64 seq = log_cursor; seq < head; seq++)
			entries.push_back(s->log[seq % GPU_IVFPQ_LOG_SIZE]);
	LWLockRelease(s->log_lock);

	if (!store)
	{
		/* No mirrors to keep: just acknowledge (VACUUM waits for it). */
	}
	else if (lapped)
	{
		std::string err;

		(void) Engine([&] { store->drop_all(); }, err);
		ereport(LOG, (errmsg("gpu_ivfpq service: the change log overflowed, mirrors dropped")));
	}
	else if (!entries.empty())
	{
		std::string err;
		std::map<MirrorKey, std::vector<const GpuIvfpqLogEntry *>> appends;

		for (const auto &e : entries)
		{
			MirrorKey	key = ToKey(e.key);

			if (e.kind == LOG_INVALIDATE)
			{
				/* Appends to the dropped mirror (earlier or later) find no mirror below. */
				(void) Engine([&] { store->drop_index(key.db, key.index); }, err);
				continue;
			}
			auto		from = mirror_from.find(key);

			if (from != mirror_from.end() && e.seq >= from->second)
				appends[key].push_back(&e);
		}
		for (auto &kv : appends)
		{
			gpuivfpq::Mirror *mirror = store->find(kv.first);

			if (mirror == nullptr)
				continue;
			std::vector<int32_t> lists;
			std::vector<int64_t> labels;
			std::vector<uint8_t> codes;
			size_t		m = kv.second.front()->m;

			for (const GpuIvfpqLogEntry *e : kv.second)
			{
				lists.push_back(e->list);
				labels.push_back(e->label);
				codes.insert(codes.end(), e->code, e->code + m);
			}
			if (!Engine([&] { mirror->add(lists.size(), lists.data(), codes.data(), labels.data()); }, err))
			{
				(void) Engine([&] { store->drop_index(kv.first.db, kv.first.index); }, err);
				RecordError("appending to a mirror failed, mirror dropped: " + err);
			}
		}
	}
	log_cursor = head;
	pg_atomic_write_u64(&s->log_applied, head);
}

/* The requests taken by the current round (a plain array: it outlives an ERROR). */
static GpuIvfpqSlot **taken;
static int	ntaken;

/* Claims the pending requests (at most limit searches), marking them running. */
static int
Collect(int limit)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	int			searches = 0;

	for (int i = 0; i < s->nslots; i++)
	{
		GpuIvfpqSlot *slot = &s->slots[i];

		if (slot->state != SLOT_PENDING)	/* unlocked peek; rechecked below */
			continue;
		SpinLockAcquire(&slot->mutex);
		if (slot->state == SLOT_PENDING && (slot->kind != REQ_SEARCH || searches < limit))
		{
			slot->state = SLOT_RUNNING;
			taken[ntaken++] = slot;
			if (slot->kind == REQ_SEARCH)
				searches++;
		}
		SpinLockRelease(&slot->mutex);
	}
	return searches;
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

/* Serves searches for one index version and probe count in one device call. */
static void
SearchGroup(const std::vector<GpuIvfpqSlot *> &group)
{
	GpuIvfpqSlot *first = group.front();
	MirrorKey	key = ToKey(first->key);
	gpuivfpq::Mirror *mirror = store->find(key);
	size_t		nq = group.size();
	size_t		d = first->dim;
	size_t		k = 0;
	std::vector<float> queries, dist;
	std::vector<int64_t> labels;
	std::string err;
	bool		oom = false;

	if (mirror == nullptr)
	{
		TimestampTz now = GetCurrentTimestamp();
		auto		claim = load_claims.find(key);
		bool		claimed = claim != load_claims.end() &&
			!TimestampDifferenceExceeds(claim->second, now, LOAD_CLAIM_MS);

		/* The first asker loads the mirror; the others use the CPU meanwhile. */
		for (size_t i = 0; i < nq; i++)
			Answer(group[i], (i == 0 && !claimed) ? RES_NOT_LOADED : RES_LOADING, NULL);
		if (!claimed)
			load_claims[key] = now;
		return;
	}
	for (GpuIvfpqSlot *slot : group)
		k = Max(k, (size_t) slot->k);
	queries.resize(nq * d);
	for (size_t i = 0; i < nq; i++)
		memcpy(&queries[i * d], group[i]->payload.bytes, d * sizeof(float));
	dist.resize(nq * k);
	labels.resize(nq * k);
	if (!Engine([&] {
			mirror->search(queries.data(), nq, k, first->nprobe, dist.data(), labels.data());
			store->count_queries(key, nq);
		}, err, &oom))
	{
		RecordError("search failed: " + err);
		for (GpuIvfpqSlot *slot : group)
			Answer(slot, oom ? RES_NO_MEMORY : RES_ERROR, err.c_str());
		return;
	}
	CountBatch((int) nq);
	for (size_t i = 0; i < nq; i++)
	{
		GpuIvfpqSlot *slot = group[i];
		/* Rows of the batch are sorted: a smaller k takes the prefix (labels only: backends re-rank). */
		memcpy(slot->payload.bytes, &labels[i * k], (size_t) slot->k * sizeof(int64));
		slot->batch = (int) nq;
		Answer(slot, RES_OK, NULL);
	}
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
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	const GpuIvfpqDsmHeader *h = (const GpuIvfpqDsmHeader *) base;
	GpuIvfpqDsmLayout l = GpuIvfpqDsmLayoutFor(REQ_LOAD, h);
	MirrorKey	key = ToKey(slot->key);
	gpuivfpq::MirrorSpec spec = SpecFrom(h, base, l);
	const int64 *labels = (const int64 *) (base + l.labels);
	std::vector<GpuIvfpqLogEntry> window;
	uint64		head;
	bool		oom = false;
	bool		changed = false;
	gpuivfpq::Mirror *mirror = nullptr;

	if (!Engine([&] {
			mirror = store->load(key, spec, (size_t) h->n, (const int32_t *) (base + l.lists),
								 (const uint8_t *) (base + l.codes), (const int64_t *) labels);
		}, err, &oom))
		return oom ? RES_NO_MEMORY : RES_ERROR;

	/* Room for the whole ring first: nothing below may throw while the lock is held. */
	if (!Engine([&] { window.reserve(GPU_IVFPQ_LOG_SIZE); }, err, &oom))
		changed = true;
	else
	{
	LWLockAcquire(s->log_lock, LW_SHARED);
	head = s->log_head;
	if (head - slot->log_start > GPU_IVFPQ_LOG_SIZE)
		changed = true;
	else
		for (uint64 seq = slot->log_start; seq < head; seq++)
		{
			const GpuIvfpqLogEntry *e = &s->log[seq % GPU_IVFPQ_LOG_SIZE];

			if (e->key.db == key.db && e->key.index == key.index)
				window.push_back(*e);
		}
	LWLockRelease(s->log_lock);
	}

	if (!changed && !Engine([&] {
			std::unordered_set<int64_t> seen;
			std::vector<int32_t> lists;
			std::vector<int64_t> labs;
			std::vector<uint8_t> codes;

			for (const auto &e : window)
			{
				if (e.kind == LOG_INVALIDATE)
				{
					changed = true;
					return;
				}
				if (!(ToKey(e.key) == key))
					continue;
				if (seen.empty())
					seen.insert(labels, labels + h->n);
				if (!seen.insert(e.label).second)
					continue;
				lists.push_back(e.list);
				labs.push_back(e.label);
				codes.insert(codes.end(), e.code, e.code + h->m);
			}
			mirror->add(lists.size(), lists.data(), codes.data(), labs.data());
			/* Everything before head is in; the main loop applies later entries. */
			mirror_from[key] = head;
			load_claims.erase(key); /* a failed load keeps its claim: others use the CPU a while */
		}, err, &oom))
		changed = true;
	if (changed)
	{
		/* No mirror without its log position: DrainLog would never update it. */
		(void) Engine([&] { store->drop_index(key.db, key.index); }, err);
		if (err.empty())
			err = "the index changed while its mirror was loading; the next scan loads it again";
		return oom ? RES_NO_MEMORY : RES_ERROR;
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
			device->train((const float *) (base + l.rows), (size_t) h->n, h->d, h->lists, h->m,
						  (gpuivfpq::Metric) h->metric, params, (float *) (base + l.centroids),
						  (float *) (base + l.codebooks));
		}, err, &oom))
		return oom ? RES_NO_MEMORY : RES_ERROR;
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
			device->encode(spec, (const float *) (base + l.rows), (size_t) Min(slot->n, h->n),
						   (int32_t *) (base + l.lists), (uint8_t *) (base + l.codes));
		}, err, &oom))
		return oom ? RES_NO_MEMORY : RES_ERROR;
	return RES_OK;
}

/*
 * Many queries of one backend (batch search) against a mirror, tiled so the
 * device's scratch space stays bounded; counted as one batch.
 */
static RequestResult
SearchBatch(GpuIvfpqSlot *slot, char *base, std::string &err)
{
	MirrorKey	key = ToKey(slot->key);
	gpuivfpq::Mirror *mirror = store->find(key);
	const float *queries = (const float *) (base + GPU_IVFPQ_BATCH_QUERIES);
	int64	   *labels = (int64 *) (base + GpuIvfpqBatchLabelsOffset(slot->n, slot->dim));
	size_t		k = slot->k;
	size_t		d = slot->dim;
	const size_t tile = 4096;
	bool		oom = false;

	if (mirror == nullptr)
		return RES_NOT_LOADED;
	if (!Engine([&] {
			std::vector<float> dist(tile * k);

			for (size_t i = 0; i < (size_t) slot->n; i += tile)
			{
				size_t		nq = std::min(tile, (size_t) slot->n - i);

				mirror->search(queries + i * d, nq, k, slot->nprobe, dist.data(),
							   reinterpret_cast<int64_t *>(labels + i * k));
			}
			store->count_queries(key, slot->n);
		}, err, &oom))
		return oom ? RES_NO_MEMORY : RES_ERROR;
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
			device->exact_knn((const float *) (base + l.queries), h->m, (const float *) (base + l.base),
							  h->n, h->d, (gpuivfpq::Metric) h->metric, slot->k,
							  (float *) (base + l.dist), (int64_t *) (base + l.labels));
		}, err, &oom))
		return oom ? RES_NO_MEMORY : RES_ERROR;
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
		case REQ_SEARCH:
			/* Single searches carry no segment; Serve batches them. */
			err = "a search request carried a segment";
			break;
	}
	GpuIvfpqPgCall([&] { dsm_detach(seg); });
	if (result != RES_OK && !err.empty())
		RecordError(err);
	Answer(slot, result, err.c_str());
}

/* Groups the taken searches by (index version, probes, dim) and serves each group. */
static void
Serve(void)
{
	std::map<std::tuple<MirrorKey, int, int>, std::vector<GpuIvfpqSlot *>> groups;

	for (int i = 0; i < ntaken; i++)
	{
		GpuIvfpqSlot *slot = taken[i];

		if (slot->kind != REQ_SEARCH)
			continue;
		groups[std::make_tuple(ToKey(slot->key), slot->nprobe, slot->dim)].push_back(slot);
	}
	for (auto &kv : groups)
		SearchGroup(kv.second);
	for (int i = 0; i < ntaken; i++)
		if (taken[i]->kind != REQ_SEARCH)
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
ServeRound(int searches)
{
	GpuIvfpqCaught caught;

	if (!GpuIvfpqTry([&] {
			/* Waiting a little lets more connections join the batch (measured in the benchmarks). */
			if (gpu_ivfpq_batch_wait_us > 0 && searches > 0 && searches < gpu_ivfpq_batch_size)
			{
				pg_usleep(gpu_ivfpq_batch_wait_us);
				(void) Collect(gpu_ivfpq_batch_size - searches);
			}
			if (!store)
			{
				for (int i = 0; i < ntaken; i++)
					Answer(taken[i], RES_ERROR, "the gpu_ivfpq service has no GPU");
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
	/* Mirrors live in this process's device memory: they go with it. */
	store.reset();
	device.reset();
}

/* Opens the compute device: the emulation if asked for, else the first GPU. */
static ServiceState
OpenDevice(char *desc, size_t desclen, std::string &err)
{
	/* Everything that can throw runs in Engine: an escaped exception would abort the process. */
	if (gpu_ivfpq_service_emulate_gpu)
	{
		if (Engine([&] {
				device = gpuivfpq::make_cpu_emulation_device();
				snprintf(desc, desclen, "%s", device->description().c_str());
			}, err))
			return SERVICE_EMULATED;
		device.reset();
		snprintf(desc, desclen, "none (the emulation failed to start)");
		return SERVICE_CPU_ONLY;
	}
#ifdef GPU_IVFPQ_WITH_CUDA
	{
		int			count = 0;

		if (Engine([&] { count = gpuivfpq::cuda_device_count(); }, err) && count > 0 &&
			Engine([&] {
				device = gpuivfpq::make_cuda_device(0, 0);
				snprintf(desc, desclen, "%s", device->description().c_str());
			}, err))
			return SERVICE_GPU;
		device.reset();
		snprintf(desc, desclen, "%s", err.empty() ? "none (no CUDA device found)" : "none (CUDA error)");
		return SERVICE_CPU_ONLY;
	}
#else
	snprintf(desc, desclen, "none (extension built without CUDA)");
	return SERVICE_CPU_ONLY;
#endif
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
	ServiceState state;
	char		desc[128];
	static std::string err;	/* static: survives the sigsetjmp below */

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	BackgroundWorkerUnblockSignals();
	/* No database: this only makes the service visible in pg_stat_activity. */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_activity(STATE_IDLE, NULL);
	before_shmem_exit(ServiceExit, (Datum) 0);
	loopctx = AllocSetContextCreate(TopMemoryContext, "gpu_ivfpq service loop", ALLOCSET_DEFAULT_SIZES);

	state = OpenDevice(desc, sizeof(desc), err);
	if (!err.empty())
		ereport(LOG, (errmsg("gpu_ivfpq service: no usable GPU: %s", err.c_str())));
	if (device && !Engine([&] {
			store = std::make_unique<gpuivfpq::MirrorStore>(*device);
			store->set_budget(BudgetBytes());
		}, err))
	{
		ereport(LOG, (errmsg("gpu_ivfpq service: the mirror store failed to start: %s", err.c_str())));
		store.reset();
		device.reset();
		state = SERVICE_CPU_ONLY;
	}

	/* Requests left by an earlier incarnation get an answer now. */
	for (int i = 0; i < s->nslots; i++)
	{
		GpuIvfpqSlot *slot = &s->slots[i];

		if (slot->state == SLOT_PENDING || slot->state == SLOT_RUNNING || slot->state == SLOT_ABANDONED)
			Answer(slot, RES_SERVICE_GONE, "the gpu_ivfpq service restarted");
	}
	LWLockAcquire(s->log_lock, LW_SHARED);
	log_cursor = s->log_head;	/* no mirror exists yet: older changes are in the pages */
	LWLockRelease(s->log_lock);

	SpinLockAcquire(&s->mutex);
	s->pid = MyProcPid;
	s->latch = MyLatch;
	s->starts++;
	s->started_at = GetCurrentTimestamp();
	s->state = state;
	strlcpy(s->device, desc, sizeof(s->device));
	strlcpy(s->last_error, err.c_str(), sizeof(s->last_error));
	SpinLockRelease(&s->mutex);
	PublishStatus();

	taken = (GpuIvfpqSlot **) MemoryContextAlloc(TopMemoryContext, sizeof(GpuIvfpqSlot *) * s->nslots);
	ntaken = 0;
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
		int			searches;

		MemoryContextSwitchTo(loopctx);
		MemoryContextReset(loopctx);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			if (store)
				(void) Engine([&] {
					store->set_budget(BudgetBytes());
					store->enforce_budget();
				}, err);
		}
		ResetLatch(MyLatch);
		ntaken = 0;
		searches = Collect(gpu_ivfpq_batch_size);
		if (ntaken == 0)
		{
			(void) Engine([&] {
				DrainLog();
				PublishStatus();
			}, err);
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 1000L,
							 PG_WAIT_EXTENSION);
			continue;
		}
		ServeRound(searches);
		ntaken = 0;
	}
}
