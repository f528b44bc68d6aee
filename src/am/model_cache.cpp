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
	RelFileNode node;
	uint32		build_id;
	uint64		last_used;
	gpuivfpq::IvfPqModel *model;
} ModelCacheSlot;

static ModelCacheSlot model_cache[MODEL_CACHE_SLOTS];
static uint64 model_cache_clock = 0;

/* Frees a slot's model (engine memory, outside PostgreSQL's contexts). */
static void
ReleaseSlot(ModelCacheSlot *slot)
{
	gpuivfpq::IvfPqModel *model = slot->model;

	slot->model = NULL;
	if (model != NULL)
		GpuIvfpqGuard("model release", [&] { delete model; });
}

/* Returns the trained model of index, loading it into the cache if needed. */
gpuivfpq::IvfPqModel *
GpuIvfpqGetModel(Relation index, const GpuIvfpqMetaPageData *meta)
{
	ModelCacheSlot *victim = &model_cache[0];
	float	   *centroids;
	float	   *codebooks;
	Size		centroid_bytes;
	Size		codebook_bytes;
	gpuivfpq::IvfPqModel *model = NULL;
	size_t		table_budget = (size_t) gpu_ivfpq_table_memory_mb * 1024 * 1024;

	Assert(meta->trained);
	for (int i = 0; i < MODEL_CACHE_SLOTS; i++)
	{
		ModelCacheSlot *slot = &model_cache[i];

		if (slot->model != NULL && RelFileNodeEquals(slot->node, index->rd_node) &&
			slot->build_id == meta->build_id)
		{
			slot->last_used = ++model_cache_clock;
			return slot->model;
		}
		if (slot->model == NULL || slot->last_used < victim->last_used)
			victim = slot;
	}

	centroid_bytes = (Size) meta->lists * meta->dimensions * sizeof(float);
	codebook_bytes = (Size) meta->m * 256 * (meta->dimensions / meta->m) * sizeof(float);
	centroids = (float *) palloc(centroid_bytes);
	codebooks = (float *) palloc(codebook_bytes);
	GpuIvfpqReadBlob(index, meta->centroid_start, centroids, centroid_bytes);
	GpuIvfpqReadBlob(index, meta->codebook_start, codebooks, codebook_bytes);

	ReleaseSlot(victim);
	GpuIvfpqGuard("model load", [&] {
		gpuivfpq::IvfPqModel *loaded =
			new gpuivfpq::IvfPqModel(meta->dimensions, meta->lists, meta->m,
									 (gpuivfpq::Metric) meta->metric);

		try
		{
			loaded->set_centroids(centroids);
			loaded->set_codebooks(codebooks);
			loaded->precompute_tables(table_budget);
		}
		catch (...)
		{
			delete loaded;
			throw;
		}
		model = loaded;
	});
	pfree(centroids);
	pfree(codebooks);

	victim->node = index->rd_node;
	victim->build_id = meta->build_id;
	victim->last_used = ++model_cache_clock;
	victim->model = model;
	return model;
}
