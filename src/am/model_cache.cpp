// Backend-local cache of trained quantizers, so scans and inserts do not
// re-read centroids and codebooks from pages or rebuild the precomputed
// tables on every call.
#include "am/am.h"
#include "common/guard.h"
#include "engine/ivfpq.h"

#define MODEL_CACHE_SLOTS 8

/*
 * A model is immutable for a given (relfilenode, build_id): any rebuild
 * (REINDEX, TRUNCATE, VACUUM FULL) writes a new build_id, usually into a new
 * relfilenode, so a stale entry can never be returned.
 */
typedef struct ModelCacheSlot
{
	GpuIvfpqRelFile node;
	uint32		build_id;
	uint64		last_used;
	MemoryContext cxt;			/* owns the model; deleted on eviction */
	gpuivfpq::IvfPqModel *model;
} ModelCacheSlot;

static ModelCacheSlot model_cache[MODEL_CACHE_SLOTS];
static uint64 model_cache_clock = 0;

/* Frees a slot's model with its context. */
static void
ReleaseSlot(ModelCacheSlot *slot)
{
	slot->model = NULL;
	if (slot->cxt != NULL)
		MemoryContextDelete(slot->cxt);
	slot->cxt = NULL;
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

	if (!model->has_precomputed())
		GpuIvfpqGuard("lookup tables", [&] { model->precompute_tables(table_budget); });
}

/* Returns the trained model of index, loading it into the cache if needed. */
gpuivfpq::IvfPqModel *
GpuIvfpqGetModel(Relation index, const GpuIvfpqMetaPageData *meta)
{
	ModelCacheSlot *victim = &model_cache[0];
	MemoryContext cxt;
	float	   *centroids;
	float	   *codebooks;
	gpuivfpq::IvfPqModel *model;

	Assert(meta->trained);
	for (int i = 0; i < MODEL_CACHE_SLOTS; i++)
	{
		ModelCacheSlot *slot = &model_cache[i];

		if (slot->model != NULL && GpuIvfpqRelFileEquals(slot->node, GpuIvfpqRelFileOf(index)) &&
			slot->build_id == meta->build_id)
		{
			slot->last_used = ++model_cache_clock;
			return slot->model;
		}
		if (slot->model == NULL || slot->last_used < victim->last_used)
			victim = slot;
	}

	ReleaseSlot(victim);
	/*
	 * Loaded in a context of its own under the caller's: an error while
	 * loading frees it with the caller's context; once loaded it moves under
	 * TopMemoryContext for the cache.
	 */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq model", ALLOCSET_SMALL_SIZES);
	GpuIvfpqReadQuantizers(index, meta, cxt, &centroids, &codebooks);
	model = GpuIvfpqMakeOwned<gpuivfpq::IvfPqModel>(cxt, "model load", (size_t) meta->dimensions,
													(size_t) meta->lists, (size_t) meta->m,
													(gpuivfpq::Metric) meta->metric);
	GpuIvfpqGuard("model load", [&] {
		model->set_centroids(centroids);
		model->set_codebooks(codebooks);
	});
	MemoryContextSetParent(cxt, TopMemoryContext);
	pfree(centroids);
	pfree(codebooks);

	victim->node = GpuIvfpqRelFileOf(index);
	victim->build_id = meta->build_id;
	victim->last_used = ++model_cache_clock;
	victim->cxt = cxt;
	victim->model = model;
	return model;
}
