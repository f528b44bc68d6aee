// The requests the service serves: those that carry a DSM segment (mirror
// loads, k-means and encoding for builds, batch searches, exact search,
// gpu_metric loads and searches too large for a queue slot), taken from the
// slots in PostgreSQL's shared memory each round and answered in turn.
#include <algorithm>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine/error.h"
#include "service/worker.h"

extern "C" {
#include "miscadmin.h"
#include "storage/ipc.h"
#include "storage/procsignal.h"
}

namespace svc {

/* Claims the pending requests, marking them running; returns how many. */
int
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
	/* RaBitQ codes: the blob in the codebooks' place is their model. */
	spec.rabitq_bits = h->rabitq_bits;
	if (h->rabitq_bits != 0)
	{
		spec.codebooks = nullptr;
		spec.rabitq_model = base + l.codebooks;
	}
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

	/* Listed before the catch-up reads the log's head: commits appending to it from here wait. */
	PublishMirrored(&key);
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
				 * vector or wide code was overwritten in the vector ring
				 * before it was read: load again later.
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
			mirrors_version++;
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
	GpuIvfpqAnswerDists dists = GPU_IVFPQ_DISTS_NONE;

	if (!Engine([&] {
			found = GpuSync()->search(key, slot->dim, queries, slot->n, slot->k, slot->nprobe, nullptr, nullptr,
								nullptr, reinterpret_cast<int64_t *>(labels), exact, &dists, slot->brute);
		}, err, &oom))
		return Failed(oom);
	if (!found)
		return RES_NOT_LOADED;
	slot->dists = (uint8) dists;
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

/*
 * No mirror of key: the first asker (slot) loads it (RES_NOT_LOADED), the
 * others use the CPU meanwhile, until the claim lapses or the claimant gave
 * the load up (a cancel: GpuIvfpqQueueGiveUpLoad).
 */
static RequestResult
MetricNotLoaded(const MirrorKey &key, const GpuIvfpqSlot *slot)
{
	TimestampTz now = GetCurrentTimestamp();
	auto		claim = load_claims.find(key);
	int			i = (int) (slot - gpu_ivfpq_service->slots);

	if (claim != load_claims.end() && !TimestampDifferenceExceeds(claim->second.at, now, LOAD_CLAIM_MS) &&
		GpuIvfpqQueueLoadsGivenUp(claim->second.slot) == claim->second.given_up)
		return RES_LOADING;
	load_claims[key] = LoadClaim{now, i, GpuIvfpqQueueLoadsGivenUp(i)};
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
			/* The room the backend gave the answer, a first guess of the hits. */
			found = GpuSync()->metric_search(key, words, (size_t) slot->k, (const uint32_t *) (base + l.radii),
											 (size_t) slot->nradii, hits, &live,
											 (capacity - l.hits) / sizeof(gpuivfpq::MetricHit));
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
		return MetricNotLoaded(key, slot);
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
		/*
		 * Changes logged while the round's earlier requests ran are applied
		 * before the next: commits into a mirrored index wait for them, and
		 * should wait for one request at most, not for the whole round.
		 */
		if (i > 0 && LogHead() != log_cursor)
			DrainLog();
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
void
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

}								/* namespace svc */
