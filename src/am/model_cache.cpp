// Backend-local cache of trained quantizers, so scans and inserts do not
// re-read centroids and codebooks from pages or rebuild the precomputed
// tables on every call.
#include "am/am.h"
#include "common/guard.h"
#include "engine/ivfpq.h"
#include "engine/rabitq.h"

/*
 * Up to 64 indexes (a partitioned table's, scanned in turn by one query,
 * would evict each other from fewer slots at every query), within
 * gpu_ivfpq.model_cache_memory: past it the least recently used models go.
 */
#define MODEL_CACHE_SLOTS 64

/*
 * A model is immutable for a given (relfilenode, build_id): any rebuild
 * (REINDEX, TRUNCATE, VACUUM FULL) writes a new build_id, usually into a new
 * relfilenode, so a stale entry can never be returned.
 */
typedef struct ModelCacheSlot
{
	GpuIvfpqRelFile node;
	uint32		build_id;
	GpuIvfpqMetaPageData shape;	/* the metapage it was loaded from */
	uint64		last_used;
	MemoryContext cxt;			/* owns the model; deleted on eviction */
	gpuivfpq::IvfPqModel *model;	/* PQ codes: this, */
	gpuivfpq::RabitqModel *rabitq;	/* or RaBitQ codes: this */
} ModelCacheSlot;

static ModelCacheSlot model_cache[MODEL_CACHE_SLOTS];
static uint64 model_cache_clock = 0;

/* Frees a slot's model with its context. */
static void
ReleaseSlot(ModelCacheSlot *slot)
{
	slot->model = NULL;
	slot->rabitq = NULL;
	if (slot->cxt != NULL)
		MemoryContextDelete(slot->cxt);
	slot->cxt = NULL;
}

/*
 * The memory a slot's model holds (centroids and their norms, codebooks and
 * the encoder's copy of them with their norms, or rotated centroids and the
 * rotation; tables).
 */
static Size
SlotBytes(const ModelCacheSlot *slot)
{
	Size		d = slot->shape.dimensions;
	Size		lists = slot->shape.lists;

	if (slot->model != NULL)
		return (lists * d + lists + (Size) 2 * 256 * d + (Size) 256 * slot->model->m()) * sizeof(float) +
			slot->model->precomputed_bytes();
	if (slot->rabitq != NULL)
		return lists * d * (sizeof(float) + sizeof(double)) + lists * sizeof(float) + d * d * sizeof(double);
	return 0;
}

/*
 * Drops the least recently used models but keep's until the cache holds no
 * more than gpu_ivfpq.model_cache_memory (keep stays, however large). A
 * caller asks for its model again before each use (a scan each round), so
 * no model is dropped while it is in use.
 */
static void
TrimCache(const ModelCacheSlot *keep)
{
	Size		budget = (Size) gpu_ivfpq_model_cache_memory_mb * 1024 * 1024;
	Size		total = 0;

	for (int i = 0; i < MODEL_CACHE_SLOTS; i++)
		total += SlotBytes(&model_cache[i]);
	while (total > budget)
	{
		ModelCacheSlot *victim = NULL;

		for (int i = 0; i < MODEL_CACHE_SLOTS; i++)
		{
			ModelCacheSlot *slot = &model_cache[i];

			if (slot == keep || (slot->model == NULL && slot->rabitq == NULL))
				continue;
			if (victim == NULL || slot->last_used < victim->last_used)
				victim = slot;
		}
		if (victim == NULL)
			break;
		total -= SlotBytes(victim);
		ReleaseSlot(victim);
	}
}

/*
 * The CPU engine's precomputed lookup-table terms of model (lists x m x 256
 * floats, within gpu_ivfpq.table_memory), built on the first list scan on
 * the CPU in this backend rather than when the model is loaded: scans the
 * GPU serves, batch searches and inserts never read them, and at 4096 lists
 * and m = 32 they take 128 MB per backend.
 */
void
GpuIvfpqModelTables(gpuivfpq::IvfPqModel *model)
{
	size_t		table_budget = (size_t) gpu_ivfpq_table_memory_mb * 1024 * 1024;

	/* Built once; dropped when the budget was lowered below them since. */
	if (!model->has_precomputed() || model->precomputed_bytes() > table_budget)
	{
		GpuIvfpqGuard("lookup tables", [&] { model->precompute_tables(table_budget); });
		/* Only tables just built make the cache larger (a budget too small builds none, each round). */
		if (model->has_precomputed())
			for (int i = 0; i < MODEL_CACHE_SLOTS; i++)
				if (model_cache[i].model == model)
					TrimCache(&model_cache[i]);
	}
}

/*
 * The cache's slot of index as meta describes it, loaded by load (which
 * fills the slot's model or rabitq from the pages, allocating in the
 * context it is given) when not cached.
 */
template <typename Load>
static ModelCacheSlot *
CachedSlot(Relation index, const GpuIvfpqMetaPageData *meta, Load &&load)
{
	ModelCacheSlot *victim = &model_cache[0];
	MemoryContext cxt;
	bool		rabitq = GpuIvfpqIsRabitq(meta);

	Assert(meta->trained);
	for (int i = 0; i < MODEL_CACHE_SLOTS; i++)
	{
		ModelCacheSlot *slot = &model_cache[i];
		bool		used = slot->model != NULL || slot->rabitq != NULL;

		/*
		 * The kind and shape of the model too: a build id may repeat (a
		 * random 32 bits), and a relfilenode be reused, and a model of
		 * other sizes would be read out of bounds.
		 */
		if (used && GpuIvfpqRelFileEquals(slot->node, GpuIvfpqRelFileOf(index)) &&
			slot->build_id == meta->build_id && (rabitq ? slot->rabitq != NULL : slot->model != NULL) &&
			slot->shape.dimensions == meta->dimensions && slot->shape.lists == meta->lists &&
			slot->shape.m == meta->m && slot->shape.nbits == meta->nbits && slot->shape.metric == meta->metric &&
			slot->shape.features == meta->features)
		{
			slot->last_used = ++model_cache_clock;
			return slot;
		}
		if (!used || slot->last_used < victim->last_used)
			victim = slot;
	}

	ReleaseSlot(victim);
	/*
	 * Loaded in a context of its own under the caller's: an error while
	 * loading frees it with the caller's context; once loaded it moves under
	 * TopMemoryContext for the cache.
	 */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq model", ALLOCSET_SMALL_SIZES);
	load(cxt, victim);
	MemoryContextSetParent(cxt, TopMemoryContext);
	victim->node = GpuIvfpqRelFileOf(index);
	victim->build_id = meta->build_id;
	victim->shape = *meta;
	victim->last_used = ++model_cache_clock;
	victim->cxt = cxt;
	TrimCache(victim);
	return victim;
}

/* Returns the trained model of index (PQ codes), loading it into the cache if needed. */
gpuivfpq::IvfPqModel *
GpuIvfpqGetModel(Relation index, const GpuIvfpqMetaPageData *meta)
{
	if (GpuIvfpqIsRabitq(meta))
		elog(ERROR, "gpu_ivfpq: index \"%s\" has RaBitQ codes, not PQ codes", RelationGetRelationName(index));
	return CachedSlot(index, meta, [&](MemoryContext cxt, ModelCacheSlot *slot) {
		float	   *centroids;
		float	   *codebooks;
		gpuivfpq::IvfPqModel *model;

		GpuIvfpqReadQuantizers(index, meta, cxt, &centroids, &codebooks);
		model = GpuIvfpqMakeOwned<gpuivfpq::IvfPqModel>(cxt, "model load", (size_t) meta->dimensions,
														(size_t) meta->lists, (size_t) meta->m,
														(gpuivfpq::Metric) meta->metric);
		GpuIvfpqGuard("model load", [&] {
			model->set_centroids(centroids);
			model->set_codebooks(codebooks);
		});
		pfree(centroids);
		pfree(codebooks);
		slot->model = model;
	})->model;
}

/*
 * Returns the trained model of an index with RaBitQ codes (its centroids,
 * rotation and bits), loading it into the cache if needed.
 */
gpuivfpq::RabitqModel *
GpuIvfpqGetRabitqModel(Relation index, const GpuIvfpqMetaPageData *meta)
{
	if (!GpuIvfpqIsRabitq(meta))
		elog(ERROR, "gpu_ivfpq: index \"%s\" has no RaBitQ codes", RelationGetRelationName(index));
	return CachedSlot(index, meta, [&](MemoryContext cxt, ModelCacheSlot *slot) {
		float	   *centroids;
		float	   *rotation;
		gpuivfpq::RabitqModel *model;

		GpuIvfpqReadQuantizers(index, meta, cxt, &centroids, &rotation);
		/* A rotation that is no finite matrix is refused (corrupt pages): an ERROR. */
		model = GpuIvfpqMakeOwned<gpuivfpq::RabitqModel>(
			cxt, "model load", (size_t) meta->dimensions, (size_t) meta->lists, (int) meta->nbits,
			(gpuivfpq::Metric) meta->metric, (const float *) rotation);
		GpuIvfpqGuard("model load", [&] {
			model->set_centroids(centroids, (const double *) ((const char *) rotation +
															  GpuIvfpqRabitqRotatedOffset(meta->dimensions)));
		});
		pfree(centroids);
		pfree(rotation);
		slot->rabitq = model;
	})->rabitq;
}
