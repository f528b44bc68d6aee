// The gpu_metric access method's searches on the GPU service: a batch of
// range or k-NN queries as one request (through the direct path's slot when
// it fits, else through the service in a DSM segment, grown when a range
// answer needs more room), and
// loading an index's mirror from the backend's restored copy of it (also
// gpu_metric_prewarm). A mirror is of one change count of its index: after
// any insert or VACUUM the next search loads a new one (docs/gpu-service.md).
// Every path returns "not served" so the caller runs the CPU engine, unless
// gpu_ivfpq.device = gpu asks for an error.
#include "service/metric_client.h"

#include <cstddef>

#include "common/guard.h"
#include "engine/metric/lc_index.h"
#include "engine/metric/sss_index.h"
#include "gpu_process/reply_checks.h"
#include "service/shmem.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "miscadmin.h"

PG_FUNCTION_INFO_V1(gpu_metric_prewarm);
}

static_assert(sizeof(gpuivfpq::MetricHit) == 2 * sizeof(uint32) && offsetof(gpuivfpq::MetricHit, id) == 0,
			  "hits travel as (id, distance) pairs");

/* Why the service cannot serve gpu_metric indexes now, or NULL. */
static const char *
MetricNotServableReason(void)
{
	if (gpu_ivfpq_service == NULL)
		return "The extension gpu_ivfpq is not in shared_preload_libraries";
	if (!GpuIvfpqServiceServing())
		return "The gpu_ivfpq service has no GPU or is not running";
	return NULL;
}

/* The mirror's index version (its change count, meta->change_count, goes beside it). */
static void
FillMetricKey(GpuIvfpqKey *key, Relation index, const GpuMetricMetaPageData *meta)
{
	key->db = MyDatabaseId;
	key->index = RelationGetRelid(index);
	key->relnode = GpuIvfpqRelFileNumberOf(index);
	key->build = meta->build_id;
}

/*
 * Copies entry's index (current for meta) into a DSM segment and asks the
 * service to mirror it; *live gets its live objects.
 */
static RequestResult
LoadMetricMirror(GpuIvfpqSlot *slot, Relation index, GpuMetricCached *entry, const GpuMetricMetaPageData *meta,
				 int64 *live, char *error, Size errlen)
{
	const gpuivfpq::MetricIndex &mi = entry->engine->index();
	const gpuivfpq::ListOfClusters *lc = entry->engine->lc();
	const gpuivfpq::SparseSpatialSelection *sss = entry->engine->sss();
	GpuMetricLoadHeader h;
	GpuMetricLoadLayout l;
	dsm_segment *seg;
	char	   *base;
	RequestResult result;

	*live = (int64) mi.live();
	if ((uint64) mi.size() != meta->objects)
	{
		strlcpy(error, "the backend's copy of the index is not current", errlen);
		return RES_ERROR;
	}
	memset(&h, 0, sizeof(h));
	h.method = entry->engine->method();
	h.n = (int64) mi.size();
	h.ncps = (int64) mi.words().offsets()[h.n];
	if (lc != NULL)
	{
		h.clusters = (int64) lc->clusters();
		h.bucket = (int32) lc->bucket_size();
	}
	else
	{
		h.clusters = (int64) sss->pivots();
		h.alpha = sss->alpha();
		h.max_distance = sss->max_distance();
	}
	l = GpuMetricLoadLayoutFor(&h);
	seg = GpuIvfpqCreateSegment(l.total, "loading the gpu_metric mirror");
	if (seg == NULL)
	{
		strlcpy(error, "no shared memory for the mirror's words", errlen);
		return RES_ERROR;
	}
	base = (char *) dsm_segment_address(seg);
	/* The engine's accessors allocate (cluster_assignment): inside the guard. */
	GpuIvfpqGuard("reading a gpu_metric index for its GPU mirror", [&] {
		uint8	   *removed = (uint8 *) (base + l.removed);
		uint32	   *structure = (uint32 *) (base + l.structure);

		memcpy(base, &h, sizeof(h));
		memcpy(base + l.cps, mi.words().code_points(), sizeof(uint32) * h.ncps);
		memcpy(base + l.offsets, mi.words().offsets(), sizeof(uint64) * (h.n + 1));
		for (int64 i = 0; i < h.n; i++)
			removed[i] = mi.is_removed((uint32_t) i) ? 1 : 0;
		if (lc != NULL)
		{
			std::vector<uint32_t> cluster_of = lc->cluster_assignment();

			for (int64 c = 0; c < h.clusters; c++)
			{
				structure[c] = lc->centre(c);
				structure[h.clusters + c] = lc->radius(c);
			}
			memcpy(base + l.parts, cluster_of.data(), sizeof(uint32) * h.n);
		}
		else
		{
			for (int64 p = 0; p < h.clusters; p++)
				structure[p] = sss->pivot(p);
			memcpy(base + l.parts, sss->table(), (Size) h.n * h.clusters);
		}
	});

	slot->kind = REQ_METRIC_LOAD;
	FillMetricKey(&slot->key, index, meta);
	slot->change_count = meta->change_count;
	slot->n = h.n;
	slot->dsm = dsm_segment_handle(seg);
	result = GpuIvfpqSubmitAndWait(slot);
	strlcpy(error, slot->error, errlen);
	GpuIvfpqFinishSlot(slot);
	dsm_detach(seg);
	return result;
}

/* What LoadToldMetricMirror loads: the backend's copy of the index, current for meta. */
typedef struct MetricLoadArg
{
	GpuMetricCached *entry;
	const GpuMetricMetaPageData *meta;
} MetricLoadArg;

/* LoadMetricMirror as GpuIvfpqLoadToldMirror calls it: arg is a MetricLoadArg. */
static RequestResult
LoadToldMetricMirror(GpuIvfpqSlot *slot, Relation index, const void *arg, int64 *live, char *error, Size errlen)
{
	const MetricLoadArg *load = (const MetricLoadArg *) arg;

	return LoadMetricMirror(slot, index, load->entry, load->meta, live, error, errlen);
}

/*
 * Reads an answer (hit offsets and hits after the request, as l lays it out
 * in capacity bytes at base) into out, checked first: the hits must lie in
 * the room the request gave, and their ids index the index's objects.
 * False when they do not.
 */
static bool
ReadMetricAnswer(const char *base, Size capacity, const GpuMetricSearchLayout &l, int64 nq,
				 const GpuMetricMetaPageData *meta, uint64 live, uint64 evaluations, GpuMetricHits *out)
{
	uint64	   *hit_offsets = (uint64 *) palloc_extended(sizeof(uint64) * (nq + 1), MCXT_ALLOC_HUGE);
	gpuivfpq::MetricHit *hits = NULL;
	Size		room = capacity > l.hits ? (capacity - l.hits) / sizeof(gpuivfpq::MetricHit) : 0;
	bool		sound = false;

	memcpy(hit_offsets, base + l.hit_offsets, sizeof(uint64) * (nq + 1));
	if (gpuivfpq::replycheck::hit_offsets_sound(hit_offsets, (size_t) nq, room))
	{
		uint64		total = hit_offsets[nq];

		hits = (gpuivfpq::MetricHit *) palloc_extended(sizeof(gpuivfpq::MetricHit) * Max(total, 1),
														MCXT_ALLOC_HUGE);
		memcpy(hits, base + l.hits, sizeof(gpuivfpq::MetricHit) * total);
		sound = gpuivfpq::replycheck::ids_below(&hits[0].id, total, 2, meta->objects);
	}
	if (!sound)
	{
		pfree(hit_offsets);
		if (hits != NULL)
			pfree(hits);
		return false;
	}
	out->offsets = hit_offsets;
	out->hits = hits;
	out->live = live;
	out->evaluations = evaluations;
	out->on_gpu = true;
	return true;
}

/*
 * The GPU service's answer to nq queries of a gpu_metric index (the
 * contract of GpuMetricServiceSearch in am/metric_search.cpp): true with
 * out filled, or false when the GPU did not serve them (the caller runs the
 * CPU engine; with gpu_ivfpq.device = gpu that is an error instead). entry
 * is the backend's copy of the index, current for meta: the mirror is
 * loaded from it when the service has none of this change count (NULL:
 * no load).
 *
 * Queries whose request and answer fit a slot of the direct path go
 * straight to the GPU process (GpuIvfpqQueueMetricSearch), batched there
 * with other connections' searches of the same mirror and kind; larger
 * ones, and range answers that outgrow the slot, go through the service in
 * a DSM segment.
 */
bool
GpuMetricServiceAnswer(Relation index, GpuMetricCached *entry, const GpuMetricMetaPageData *meta, bool knn,
					   const uint32 *cps, const uint64 *offsets, int64 nq, uint32 param, const uint32 *radii,
					   GpuMetricHits *out)
{
	bool		required = gpu_ivfpq_device == GPU_IVFPQ_DEVICE_GPU;
	const char *reason;
	GpuIvfpqSlot *slot = NULL;
	int			nradii = knn ? 0 : (radii != NULL ? (int) nq : 1);
	int64		ncps = (int64) offsets[nq];
	GpuMetricSearchLayout l;
	dsm_segment *seg = NULL;
	char	   *direct_buf = NULL;
	Size		capacity;
	Size		most;
	bool		direct;
	char		error[256];
	RequestResult result = RES_ERROR;
	bool		loaded = false;
	bool		answered = false;
	bool		no_slot = false;	/* told to load, without a slot to load with */

	if (!GpuIvfpqServiceWanted())
		return false;
	reason = MetricNotServableReason();
	if (reason == NULL && (nq > PG_INT32_MAX || (knn && param == 0)))
		reason = "The GPU path takes at most 2^31 queries a call, and k-NN at least one neighbour";

	l = GpuMetricSearchLayoutFor(nq, ncps, nradii);
	/* Room for k hits a query (k-NN needs no more), for 64 a query (range) at first. */
	capacity = l.hits + sizeof(gpuivfpq::MetricHit) * (knn ? (Size) nq * param : (Size) Max(nq * 64, 1024));
	/* The most an answer can need: every object a query (range), k (k-NN); in double: no overflow. */
	most = (Size) Min((double) l.hits + (double) sizeof(gpuivfpq::MetricHit) * (double) nq *
					  (knn ? (double) param : (double) meta->objects), (double) MaxAllocHugeSize);
	direct = nq >= 1 && capacity <= GPU_IVFPQ_QUEUE_PAYLOAD;
	if (reason == NULL && direct)
		reason = GpuIvfpqQueueUnavailable();
	if (reason == NULL && !direct && (slot = GpuIvfpqAcquireSlot()) == NULL)
		reason = "No request slot is free";
	if (reason != NULL)
	{
		if (required)
			GpuIvfpqGpuRequiredError("gpu_metric search", reason);
		return false;
	}

	error[0] = '\0';
	for (int attempt = 0; attempt < 4 && !answered; attempt++)
	{
		char	   *base;
		uint64		needed = 0;
		uint64		live = 0;
		uint64		evaluations = 0;
		GpuIvfpqKey key;

		if (direct)
		{
			if (direct_buf == NULL)
				direct_buf = (char *) palloc(GPU_IVFPQ_QUEUE_PAYLOAD);
			base = direct_buf;
			capacity = GPU_IVFPQ_QUEUE_PAYLOAD;
		}
		else
		{
			if (seg != NULL && dsm_segment_map_length(seg) < capacity)
			{
				dsm_detach(seg);
				seg = NULL;
			}
			if (seg == NULL)
				seg = GpuIvfpqCreateSegment(capacity, "a gpu_metric search");
			if (seg == NULL)
			{
				strlcpy(error, "no shared memory for the request", sizeof(error));
				result = RES_ERROR;
				break;
			}
			base = (char *) dsm_segment_address(seg);
			capacity = dsm_segment_map_length(seg);
		}
		memcpy(base + l.cps, cps, sizeof(uint32) * ncps);
		memcpy(base + l.offsets, offsets, sizeof(uint64) * (nq + 1));
		if (nradii == 1 && radii == NULL)
			memcpy(base + l.radii, &param, sizeof(uint32));
		else if (nradii > 0)
			memcpy(base + l.radii, radii, sizeof(uint32) * nradii);

		if (direct)
		{
			FillMetricKey(&key, index, meta);
			result = GpuIvfpqQueueMetricSearch(&key, meta->change_count, nq, ncps, nradii, knn ? (int) param : 0,
											   base, &needed, &live, &evaluations, error, sizeof(error));
		}
		else
		{
			slot->kind = REQ_METRIC_SEARCH;
			FillMetricKey(&slot->key, index, meta);
			slot->change_count = meta->change_count;
			slot->n = nq;
			slot->k = knn ? (int) param : 0;
			slot->ncps = ncps;
			slot->nradii = nradii;
			slot->capacity = capacity;
			slot->dsm = dsm_segment_handle(seg);
			result = GpuIvfpqSubmitAndWait(slot);
			strlcpy(error, slot->error, sizeof(error));
			needed = slot->needed;
			live = (uint64) slot->live;
			evaluations = slot->evaluations;
		}
		if (result == RES_OK && needed == 0)
		{
			answered = ReadMetricAnswer(base, capacity, l, nq, meta, live, evaluations, out);
			if (!answered)
			{
				result = RES_ERROR;
				strlcpy(error, "the GPU service answered hits outside the answer's room or the index's objects",
						sizeof(error));
			}
		}
		if (slot != NULL && !direct)
			GpuIvfpqFinishSlot(slot);
		if (answered)
			break;
		if (result == RES_OK)
		{
			/* A range answer larger than the room: again, through the service, with room for it. */
			if (needed <= capacity || needed > most ||
				(slot == NULL && (slot = GpuIvfpqAcquireSlot()) == NULL))
			{
				result = RES_ERROR;
				strlcpy(error, slot == NULL && needed > capacity && needed <= most ? "No request slot is free" :
						"the GPU service asked for an impossible answer size", sizeof(error));
				break;
			}
			capacity = needed;
			direct = false;
			continue;
		}
		if (!loaded && entry != NULL && (result == RES_NOT_LOADED || (result == RES_LOADING && required)))
		{
			MetricLoadArg load = {entry, meta};

			loaded = true;
			if (!GpuIvfpqLoadToldMirror(&slot, LoadToldMetricMirror, &load, index, "gpu_metric", "live words",
										&result, error, sizeof(error)))
			{
				no_slot = true;
				break;
			}
			if (result == RES_OK)
				continue;
		}
		break;
	}
	if (seg != NULL)
		dsm_detach(seg);
	if (direct_buf != NULL)
		pfree(direct_buf);
	if (answered)
		return true;
	if (no_slot)
	{
		if (required)
			GpuIvfpqGpuRequiredError("gpu_metric search", "No request slot is free");
		return false;
	}

	GpuIvfpqSearchFellBack(index, result, error, "gpu_metric", "search", "gpu_metric search", required);
	return false;
}

/* gpu_metric_prewarm(index regclass): mirrors a gpu_metric index now; returns its live words. */
Datum
gpu_metric_prewarm(PG_FUNCTION_ARGS)
{
	Relation	index;
	Relation	heap;
	GpuMetricMetaPageData meta;
	GpuMetricCached *entry;
	GpuIvfpqSlot *slot;
	int64		live = 0;
	char		error[256];
	RequestResult result;

	/* As pg_prewarm: reading a relation into memory takes SELECT on it (here its table). */
	GpuIvfpqOpenIndexChecked(PG_GETARG_OID(0), "gpu_metric", "gpu_metric_prewarm", false, &index, &heap);
	table_close(heap, AccessShareLock);
	slot = GpuIvfpqPrewarmSlot(index, MetricNotServableReason(),
							   "Preload gpu_ivfpq (shared_preload_libraries) on a server whose service has a GPU.");
	entry = GpuMetricGetCached(index, &meta);
	error[0] = '\0';
	result = LoadMetricMirror(slot, index, entry, &meta, &live, error, sizeof(error));
	GpuIvfpqPrewarmLoaded(index, result, error);
	relation_close(index, AccessShareLock);
	PG_RETURN_INT64(live);
}
