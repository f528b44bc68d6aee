// Searches of a gpu_metric index, for its scans and its batch functions
// alike: one call answers a batch of range or k-NN queries, through the GPU
// service where one serves gpu_metric indexes (GpuMetricServiceSearch, the
// hook for it), else the CPU engine over the backend's restored copy. Also
// the result order shared by both: distance, then heap TID.
#include <algorithm>

#include "metric/am.h"
#include "common/guard.h"
#include "service/metric_client.h"

/*
 * The hook where a GPU service answers a batch of searches of a gpu_metric
 * index; false: not served, and the CPU engine answers. The GPU service
 * answers (service/metric_client.cpp) where it runs with a GPU; this entry
 * without the backend's copy of the index only uses a mirror already
 * loaded (GpuMetricSearch passes the copy, to load one).
 *
 * The contract, for the service that will: the queries are nq words as
 * code points back to back (query i is cps[offsets[i], offsets[i + 1])),
 * each with the param nearest live objects (k-NN, ties by the smaller
 * object id) or every live object within radius radii[i] (param for all
 * when radii is NULL). Objects are numbered as the index's
 * object pages hold them (the n-th record along the chain from
 * meta->object_head is object n), which is how the engine numbers them too;
 * removed records (GPU_METRIC_OBJ_REMOVED) are never answers. A mirror is
 * current for meta->change_count (with meta->build_id and the relation's
 * file): every insert appends one record (and, for a List of Clusters,
 * adds a cluster or grows the last one's radius), every VACUUM marks
 * records removed, each advancing the count. Answers go to out as the CPU
 * engine lays them out: palloc'd offsets (nq + 1) and hits (object id,
 * distance) sorted by (distance, id) per query, evaluations and live
 * counted as the engine counts them, and on_gpu set.
 */
bool
GpuMetricServiceSearch(Relation index, const GpuMetricMetaPageData *meta, bool knn, const uint32 *cps,
					   const uint64 *offsets, int64 nq, uint32 param, const uint32 *radii,
					   GpuMetricHits *out)
{
	return GpuMetricServiceAnswer(index, NULL, meta, knn, cps, offsets, nq, param, radii, out);
}

/*
 * Searches nq queries (code points back to back: query i is
 * cps[offsets[i], offsets[i + 1])): the param nearest live objects (knn),
 * or every one within radius radii[i] (param when radii is NULL). entry is the backend's current copy of index
 * and meta the metapage it is current for. The answers are palloc'd in the
 * current memory context.
 */
void
GpuMetricSearch(Relation index, GpuMetricCached *entry, const GpuMetricMetaPageData *meta, bool knn,
				const uint32 *cps, const uint64 *offsets, int64 nq, uint32 param, const uint32 *radii,
				int threads, GpuMetricHits *out)
{
	MemoryContext cxt;
	GpuMetricResult *result;
	uint64		nhits;

	memset(out, 0, sizeof(*out));
	out->nq = nq;
	if (GpuMetricServiceAnswer(index, entry, meta, knn, cps, offsets, nq, param, radii, out))
		return;

	/* The engine's answers live in a context of their own, copied out, then freed. */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "gpu_metric search", ALLOCSET_SMALL_SIZES);
	result = GpuIvfpqMakeOwned<GpuMetricResult>(cxt, "search", entry->engine->index(), knn,
												(const uint32_t *) cps, (const uint64_t *) offsets,
												(size_t) nq, (uint32_t) param, (const uint32_t *) radii,
												threads);
	nhits = result->offsets()[nq];
	out->offsets = (uint64 *) palloc_extended(sizeof(uint64) * (nq + 1), MCXT_ALLOC_HUGE);
	memcpy(out->offsets, result->offsets(), sizeof(uint64) * (nq + 1));
	out->hits = (gpuivfpq::MetricHit *) palloc_extended(sizeof(gpuivfpq::MetricHit) * Max(nhits, 1),
														 MCXT_ALLOC_HUGE);
	memcpy(out->hits, result->hits(), sizeof(gpuivfpq::MetricHit) * nhits);
	out->evaluations = result->evaluations();
	out->live = entry->engine->index().live();
	MemoryContextDelete(cxt);
}

/* The result order: distance, then heap TID (tids maps object ids to them). */
bool
GpuMetricHitTidLess(const ItemPointerData *tids, const gpuivfpq::MetricHit &a, const gpuivfpq::MetricHit &b)
{
	if (a.dist != b.dist)
		return a.dist < b.dist;
	return ItemPointerCompare((ItemPointer) &tids[a.id], (ItemPointer) &tids[b.id]) < 0;
}

/* Sorts hits by (distance, heap TID). */
void
GpuMetricSortByTid(const ItemPointerData *tids, gpuivfpq::MetricHit *hits, int64 n)
{
	/* In place, no allocation, a comparator that cannot fail: safe beside ereport. */
	std::sort(hits, hits + n, [tids](const gpuivfpq::MetricHit &a, const gpuivfpq::MetricHit &b) {
		return GpuMetricHitTidLess(tids, a, b);
	});
}

/*
 * Whether the row at *tid is visible to snapshot (fetch and slot on its
 * table); for a HOT chain *tid becomes the visible member's own TID, as
 * ctid shows it (the index holds the chain's root).
 */
bool
GpuMetricRowVisible(IndexFetchTableData *fetch, Snapshot snapshot, TupleTableSlot *slot, ItemPointer tid)
{
	bool		call_again = false;
	bool		all_dead = false;
	bool		found = table_index_fetch_tuple(fetch, tid, snapshot, slot, &call_again, &all_dead);

	if (found)
		ExecClearTuple(slot);
	return found;
}

/*
 * The k nearest live objects of each of nq queries with their whole
 * distance group: every object within the k-th nearest one's distance
 * (all of them when fewer than k are live), sorted by (distance, id). The
 * engine's k-NN breaks ties at the k-th distance by the smaller object id,
 * which is neither heap order nor complete; a range search at that distance
 * then gives the whole group, so that callers can order ties by heap TID.
 * Cheaper than a k-NN asked for more: a group of equal distances can hold
 * hundreds of words. out holds at least k hits per query unless fewer are
 * live.
 */
void
GpuMetricSearchNearest(Relation index, GpuMetricCached *entry, const GpuMetricMetaPageData *meta,
					   const uint32 *cps, const uint64 *offsets, int64 nq, uint32 k, int threads,
					   GpuMetricHits *out)
{
	GpuMetricHits nearest;
	uint32	   *radii = (uint32 *) palloc(sizeof(uint32) * Max(nq, 1));

	GpuMetricSearch(index, entry, meta, true, cps, offsets, nq, k, NULL, threads, &nearest);
	for (int64 i = 0; i < nq; i++)
	{
		uint64		n = nearest.offsets[i + 1] - nearest.offsets[i];

		/* Fewer than k: every live object, all within the farthest one's distance. */
		radii[i] = n > 0 ? nearest.hits[nearest.offsets[i + 1] - 1].dist : 0;
	}
	GpuMetricSearch(index, entry, meta, false, cps, offsets, nq, 0, radii, threads, out);
	out->evaluations += nearest.evaluations;
	out->on_gpu &= nearest.on_gpu;
	pfree(nearest.offsets);
	pfree(nearest.hits);
	pfree(radii);
}
