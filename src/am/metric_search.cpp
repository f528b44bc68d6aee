// Searches of a gpu_metric index, for its scans and its batch functions
// alike: one call answers a batch of range or k-NN queries, through the GPU
// service where one serves gpu_metric indexes (GpuMetricServiceSearch, the
// hook for it), else the CPU engine over the backend's restored copy. Also
// the result order shared by both: distance, then heap TID.
#include <algorithm>

#include "am/metric_am.h"
#include "common/guard.h"

/*
 * The hook where a GPU service answers a batch of searches of a gpu_metric
 * index; false: not served, and the CPU engine answers. Nothing serves
 * gpu_metric indexes on the GPU yet.
 *
 * The contract, for the service that will: the queries are nq words as
 * code points back to back (query i is cps[offsets[i], offsets[i + 1])),
 * each with radius param (range) or the param nearest live objects (k-NN,
 * ties by the smaller object id). Objects are numbered as the index's
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
					   const uint64 *offsets, int64 nq, uint32 param, GpuMetricHits *out)
{
	return false;
}

/*
 * Searches nq queries (code points back to back: query i is
 * cps[offsets[i], offsets[i + 1])): every live object within radius param,
 * or the param nearest ones. entry is the backend's current copy of index
 * and meta the metapage it is current for. The answers are palloc'd in the
 * current memory context.
 */
void
GpuMetricSearch(Relation index, GpuMetricCached *entry, const GpuMetricMetaPageData *meta, bool knn,
				const uint32 *cps, const uint64 *offsets, int64 nq, uint32 param, int threads,
				GpuMetricHits *out)
{
	MemoryContext cxt;
	GpuMetricResult *result;
	uint64		nhits;

	memset(out, 0, sizeof(*out));
	out->nq = nq;
	if (GpuMetricServiceSearch(index, meta, knn, cps, offsets, nq, param, out))
		return;

	/* The engine's answers live in a context of their own, copied out, then freed. */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "gpu_metric search", ALLOCSET_SMALL_SIZES);
	result = GpuIvfpqMakeOwned<GpuMetricResult>(cxt, "search", entry->engine->index(), knn,
												(const uint32_t *) cps, (const uint64_t *) offsets,
												(size_t) nq, (uint32_t) param, threads);
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
 * Of the n hits of a k-NN search for k (sorted by distance, then object
 * id): how many form complete distance groups. Fewer than k hits: every
 * live object was ranked (*exhausted), all n. Else the group at the k-th
 * distance may go on past the k-th hit (the search kept its smaller ids),
 * so only the hits nearer than it count: every object nearer than the k-th
 * distance is among them, whatever its id, hence in any order by TID too.
 */
int64
GpuMetricCompleteGroups(const gpuivfpq::MetricHit *hits, int64 n, int64 k, bool *exhausted)
{
	int64		complete = n;

	*exhausted = n < k;
	if (*exhausted)
		return n;
	while (complete > 0 && hits[complete - 1].dist == hits[n - 1].dist)
		complete--;
	return complete;
}
