// CREATE INDEX ... USING gpu_metric: read the table's words, build the
// engine's List of Clusters or SSS index over them, write its pages. Also
// the empty index of an unlogged table's init fork.
#include <algorithm>

#include "metric/am.h"
#include "common/guard.h"
#include "engine/metric/lc_index.h"
#include "engine/metric/sss_index.h"

/* Build phases, as pg_stat_progress_create_index shows them. */
#define PHASE_READ		2
#define PHASE_BUILD		3
#define PHASE_WRITE		4

/* Engine bytes per UTF-8 byte (code points, at most 4 per byte) and per word, for the memory check. */
#define BUILD_BYTES_PER_BYTE	5
#define BUILD_BYTES_PER_WORD	64

typedef struct MetricBuildState
{
	Relation	index;
	MemoryContext tmpctx;		/* reset per row */
	MemoryContext buildctx;		/* holds the words */
	double		heap_tuples;	/* rows seen, NULLs included */
	ItemPointerData *tids;
	uint64	   *offsets;		/* n + 1 */
	char	   *bytes;
	int64		n;
	int64		cap;
	Size		nbytes;
	Size		bytes_cap;
} MetricBuildState;

/* The options of an index, with defaults when it has none. */
void
GpuMetricIndexOptions(Relation index, int *method, int *bucket, double *alpha)
{
	GpuMetricOptions *opts = (GpuMetricOptions *) index->rd_options;

	*method = opts ? opts->method : GPU_METRIC_METHOD_LC;
	*bucket = opts ? opts->bucket : GPU_METRIC_DEFAULT_BUCKET;
	*alpha = opts ? opts->alpha : GPU_METRIC_DEFAULT_ALPHA;
}

/* Bytes of maintenance_work_mem. */
static Size
MaintenanceBytes(void)
{
	return (Size) maintenance_work_mem * 1024;
}

/*
 * The engine's memory for the words read so far; an error once it passes
 * maintenance_work_mem. Checked per row too, so that a table too large is
 * refused while it is read, not after every word is held.
 */
static Size
CheckBuildMemory(const MetricBuildState *bs)
{
	Size		needed = bs->nbytes * BUILD_BYTES_PER_BYTE + (Size) bs->n * BUILD_BYTES_PER_WORD;

	if (needed > MaintenanceBytes())
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("gpu_metric build needs more than %zu MB of memory for %lld words, maintenance_work_mem is %d MB",
						needed / (1024 * 1024), (long long) bs->n, maintenance_work_mem / 1024),
				 errhint("Increase maintenance_work_mem.")));
	return needed;
}

/* Collects one row's word (UTF-8) and heap TID; NULLs are not indexed. */
static void
BuildCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull, bool tupleIsAlive,
			  void *state)
{
	MetricBuildState *bs = (MetricBuildState *) state;
	MemoryContext old;
	char	   *utf8;
	int			len;

	bs->heap_tuples++;
	if (isnull[0])
		return;
	old = MemoryContextSwitchTo(bs->tmpctx);
	utf8 = GpuMetricDatumUtf8(values[0], &len);
	GpuMetricCheckWordBytes(index, len);
	MemoryContextSwitchTo(bs->buildctx);
	if (bs->n + 1 >= bs->cap)
	{
		bs->cap *= 2;
		bs->tids = (ItemPointerData *) repalloc_huge(bs->tids, sizeof(ItemPointerData) * bs->cap);
		bs->offsets = (uint64 *) repalloc_huge(bs->offsets, sizeof(uint64) * (bs->cap + 1));
	}
	if (bs->nbytes + len > bs->bytes_cap)
	{
		bs->bytes_cap = Max(bs->bytes_cap * 2, bs->nbytes + len);
		bs->bytes = (char *) repalloc_huge(bs->bytes, bs->bytes_cap);
	}
	memcpy(bs->bytes + bs->nbytes, utf8, len);
	bs->nbytes += len;
	bs->tids[bs->n++] = *tid;
	bs->offsets[bs->n] = bs->nbytes;
	MemoryContextSwitchTo(old);
	MemoryContextReset(bs->tmpctx);
	(void) CheckBuildMemory(bs);
	if ((bs->n & 1023) == 0)
		pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_DONE, bs->n);
}

/*
 * Puts the words in heap TID order, which makes object ids follow it: the
 * engine breaks ties by id, and a fresh index then answers ties as the
 * scan orders them anyway. (A synchronized scan may start mid-table.)
 */
static void
SortByTid(MetricBuildState *bs)
{
	int64	   *order = (int64 *) palloc_extended(sizeof(int64) * Max(bs->n, 1), MCXT_ALLOC_HUGE);
	ItemPointerData *tids = (ItemPointerData *) palloc_extended(sizeof(ItemPointerData) * Max(bs->n, 1), MCXT_ALLOC_HUGE);
	uint64	   *offsets = (uint64 *) palloc_extended(sizeof(uint64) * (bs->n + 1), MCXT_ALLOC_HUGE);
	char	   *bytes = (char *) palloc_extended(Max(bs->nbytes, 1), MCXT_ALLOC_HUGE);
	const ItemPointerData *old_tids = bs->tids;
	Size		done = 0;

	for (int64 i = 0; i < bs->n; i++)
		order[i] = i;
	std::sort(order, order + bs->n, [old_tids](int64 a, int64 b) {
		return ItemPointerCompare((ItemPointer) &old_tids[a], (ItemPointer) &old_tids[b]) < 0;
	});
	offsets[0] = 0;
	for (int64 i = 0; i < bs->n; i++)
	{
		int64		j = order[i];
		Size		len = bs->offsets[j + 1] - bs->offsets[j];

		tids[i] = bs->tids[j];
		memcpy(bytes + done, bs->bytes + bs->offsets[j], len);
		done += len;
		offsets[i + 1] = done;
	}
	pfree(order);
	pfree(bs->tids);
	pfree(bs->offsets);
	pfree(bs->bytes);
	bs->tids = tids;
	bs->offsets = offsets;
	bs->bytes = bytes;
}

/* The index's one column must be text (or a type binary-coercible to it, as varchar). */
static void
CheckColumn(Relation index)
{
	if (IndexRelationGetNumberOfKeyAttributes(index) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("gpu_metric index \"%s\" has %d columns; it indexes one text column",
						RelationGetRelationName(index), IndexRelationGetNumberOfKeyAttributes(index)),
				 errhint("Create one gpu_metric index per column.")));
}

/*
 * Writes the built engine index: the object pages (each word with its heap
 * TID and its cluster or pivot distances) and, for a List of Clusters, the
 * cluster pages; fills meta.
 */
static void
WritePages(MetricBuildState *bs, GpuMetricEngine *engine, GpuMetricMetaPageData *meta)
{
	GpuMetricPageWriter objects;
	const gpuivfpq::ListOfClusters *lc = engine->lc();
	const gpuivfpq::SparseSpatialSelection *sss = engine->sss();
	int			extra = GpuMetricObjectExtra(meta);
	char	   *record = (char *) palloc(GPU_METRIC_OBJ_HEADER + extra + GPU_METRIC_MAX_WORD_BYTES);

	pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, PHASE_WRITE);
	GpuMetricWriterBegin(&objects, bs->index, GPU_METRIC_PAGE_OBJECTS);
	for (int64 id = 0; id < bs->n; id++)
	{
		GpuMetricObjectHeader hdr;
		int			len = (int) (bs->offsets[id + 1] - bs->offsets[id]);

		memset(&hdr, 0, sizeof(hdr));
		hdr.tid = bs->tids[id];
		hdr.nbytes = (uint16) len;
		if (sss != NULL && sss->is_pivot((uint32) id))
			hdr.flags |= GPU_METRIC_OBJ_PIVOT;
		memcpy(record, &hdr, GPU_METRIC_OBJ_HEADER);
		if (lc != NULL)
			memcpy(record + GPU_METRIC_OBJ_HEADER, &engine->cluster_of()[id], sizeof(uint32));
		else
			memcpy(record + GPU_METRIC_OBJ_HEADER, sss->table() + (Size) id * meta->pivots, meta->pivots);
		memcpy(record + GPU_METRIC_OBJ_HEADER + extra, bs->bytes + bs->offsets[id], len);
		GpuMetricWriterAdd(&objects, record, GPU_METRIC_OBJ_HEADER + extra + len);
		CHECK_FOR_INTERRUPTS();
	}
	GpuMetricWriterEnd(&objects);
	meta->object_head = objects.head;
	meta->object_tail = objects.tail;

	if (lc != NULL)
	{
		GpuMetricPageWriter clusters;

		GpuMetricWriterBegin(&clusters, bs->index, GPU_METRIC_PAGE_CLUSTERS);
		for (size_t c = 0; c < lc->clusters(); c++)
		{
			GpuMetricClusterEntry e;

			e.centre = lc->centre(c);
			e.radius = lc->radius(c);
			GpuMetricWriterAdd(&clusters, &e, sizeof(e));
		}
		GpuMetricWriterEnd(&clusters);
		meta->clusters = (uint32) lc->clusters();
		meta->cluster_head = clusters.head;
		meta->cluster_tail = clusters.tail;
	}
	pfree(record);
}

/* A fresh metapage's contents for an index of the given options. */
static void
InitMeta(GpuMetricMetaPageData *meta, int method, int bucket, double alpha)
{
	memset(meta, 0, sizeof(*meta));
	meta->magic = GPU_METRIC_MAGIC;
	meta->version = GPU_METRIC_VERSION;
	meta->method = (uint32) method;
	meta->build_id = pg_prng_uint32(&pg_global_prng_state);
	meta->bucket = (uint32) bucket;
	meta->alpha = alpha;
	meta->object_head = meta->object_tail = InvalidBlockNumber;
	meta->cluster_head = meta->cluster_tail = InvalidBlockNumber;
}

/* ambuild: read the words, build with the engine, write the pages, then the metapage. */
IndexBuildResult *
gpumetricbuild(Relation heap, Relation index, IndexInfo *indexInfo)
{
	IndexBuildResult *result = (IndexBuildResult *) palloc0(sizeof(IndexBuildResult));
	MetricBuildState bs;
	GpuMetricMetaPageData meta;
	GpuMetricEngine *engine;
	MemoryContext old;
	Buffer		metabuf;
	int			method;
	int			bucket;
	double		alpha;
	/* Engine threads: as parallel workers would be counted, at most 64. */
	int			threads = Max(1, Min(Min(max_parallel_maintenance_workers, max_parallel_workers) + 1, 64));
	Size		needed;
	int			max_pivots = GPU_METRIC_MAX_PIVOTS;
	TimestampTz start = GetCurrentTimestamp();

	if (RelationGetNumberOfBlocks(index) != 0)
		elog(ERROR, "index \"%s\" already contains data", RelationGetRelationName(index));
	CheckColumn(index);
	GpuMetricIndexOptions(index, &method, &bucket, &alpha);

	memset(&bs, 0, sizeof(bs));
	bs.index = index;
	bs.buildctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_metric build", ALLOCSET_DEFAULT_SIZES);
	bs.tmpctx = AllocSetContextCreate(bs.buildctx, "gpu_metric build row", ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(bs.buildctx);
	bs.cap = 1024;
	bs.tids = (ItemPointerData *) palloc(sizeof(ItemPointerData) * bs.cap);
	bs.offsets = (uint64 *) palloc(sizeof(uint64) * (bs.cap + 1));
	bs.offsets[0] = 0;
	bs.bytes_cap = 8192;
	bs.bytes = (char *) palloc(bs.bytes_cap);

	/* Block 0 is the metapage; it is rewritten once the build is complete. */
	InitMeta(&meta, method, bucket, alpha);
	metabuf = GpuIvfpqNewBuffer(index, MAIN_FORKNUM);
	GpuMetricWriteMeta(index, metabuf, &meta, true);
	UnlockReleaseBuffer(metabuf);

	pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, PHASE_READ);
	pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_TOTAL, (int64) Max(heap->rd_rel->reltuples, 0));
	table_index_build_scan(heap, index, indexInfo, true, true, BuildCallback, &bs, NULL);
	SortByTid(&bs);
	elog(DEBUG1, "gpu_metric build: read %lld words (%zu bytes) in %.3f s", (long long) bs.n, bs.nbytes,
		 (double) (GetCurrentTimestamp() - start) / 1000000.0);

	needed = CheckBuildMemory(&bs);

	/*
	 * SSS keeps a byte per word and pivot: no more pivots than the memory
	 * the check above left holds (the engine then stops choosing; the
	 * index stays exact, its pruning weaker).
	 */
	if (method == GPU_METRIC_METHOD_SSS && bs.n > 0)
		max_pivots = (int) Max((Size) 1, Min((Size) GPU_METRIC_MAX_PIVOTS,
											 (MaintenanceBytes() - needed) / (Size) bs.n));

	/*
	 * The engine builds (its threads: the maintenance workers a parallel
	 * build would use, and this backend). Every thread polls for a cancel,
	 * timeout or shutdown (GpuIvfpqInstallInterruptPoll): the build stops
	 * within a few distances and the guard raises it.
	 */
	pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, PHASE_BUILD);
	engine = GpuIvfpqMakeOwned<GpuMetricEngine>(bs.buildctx, "build", method, (const char *) bs.bytes,
												(const uint64_t *) bs.offsets, (size_t) bs.n,
												(uint32_t) bucket, alpha, (size_t) max_pivots, threads);
	if (engine->sss() != NULL)
	{
		const gpuivfpq::SparseSpatialSelection *sss = engine->sss();

		/* The engine stops choosing there: the index stays exact, its table large. */
		if (sss->pivots() > (size_t) max_pivots)
			elog(ERROR, "gpu_metric: the engine chose %zu pivots, more than the %d asked for",
				 sss->pivots(), max_pivots);
		if (sss->pivots() == (size_t) max_pivots && max_pivots < GPU_METRIC_MAX_PIVOTS)
			ereport(NOTICE,
					(errmsg("gpu_metric index \"%s\" keeps %d pivots, as many as maintenance_work_mem holds (alpha = %g may choose more)",
							RelationGetRelationName(index), max_pivots, alpha),
					 errdetail("Each word keeps a byte per pivot; the pivots after the first %d were not chosen.",
							   max_pivots),
					 errhint("Increase maintenance_work_mem, or choose a larger alpha (0.35 to 0.5 usually work best), for fewer pivots to suffice.")));
		else if (sss->pivots() == GPU_METRIC_MAX_PIVOTS)
			ereport(NOTICE,
					(errmsg("gpu_metric index \"%s\" keeps %d pivots, the most an index keeps (alpha = %g may choose more)",
							RelationGetRelationName(index), GPU_METRIC_MAX_PIVOTS, alpha),
					 errdetail("Each word keeps a byte per pivot; the pivots after the first %d were not chosen.",
							   GPU_METRIC_MAX_PIVOTS),
					 errhint("A larger alpha (0.35 to 0.5 usually work best) chooses fewer pivots.")));
		meta.pivots = (uint32) sss->pivots();
		meta.max_distance = sss->max_distance();
		if (bs.n == 0)
			ereport(NOTICE,
					(errmsg("gpu_metric index \"%s\" has no pivots: its table has no words",
							RelationGetRelationName(index)),
					 errdetail("Pivots are chosen when the index is built; until it is rebuilt, queries compare every inserted word."),
					 errhint("REINDEX the index once the table holds data.")));
	}
	elog(DEBUG1, "gpu_metric build: %s index of %lld words built in %.3f s (%llu distance evaluations)",
		 method == GPU_METRIC_METHOD_LC ? "List of Clusters" : "SSS", (long long) bs.n,
		 (double) (GetCurrentTimestamp() - start) / 1000000.0,
		 (unsigned long long) (engine->lc() ? engine->lc()->build_evaluations()
							   : engine->sss()->build_evaluations()));

	WritePages(&bs, engine, &meta);
	meta.objects = (uint64) bs.n;
	meta.live = (uint64) bs.n;
	meta.build_tuples = (uint64) bs.n;
	metabuf = ReadBuffer(index, GPU_METRIC_METAPAGE_BLKNO);
	LockBuffer(metabuf, BUFFER_LOCK_EXCLUSIVE);
	GpuMetricWriteMeta(index, metabuf, &meta, true);
	UnlockReleaseBuffer(metabuf);

	result->heap_tuples = bs.heap_tuples;
	result->index_tuples = (double) bs.n;
	MemoryContextSwitchTo(old);
	MemoryContextDelete(bs.buildctx);
	return result;
}

/* ambuildempty: the init fork of an unlogged index, an index without words. */
void
gpumetricbuildempty(Relation index)
{
	PGAlignedBlock block;
	Page		page = (Page) block.data;
	GpuMetricMetaPageData meta;
	int			method;
	int			bucket;
	double		alpha;

	CheckColumn(index);
	GpuMetricIndexOptions(index, &method, &bucket, &alpha);
	InitMeta(&meta, method, bucket, alpha);
	GpuMetricInitPage(page, GPU_METRIC_PAGE_META);
	memcpy(GpuMetricPageGetMeta(page), &meta, sizeof(meta));
	((PageHeader) page)->pd_lower = (char *) GpuMetricPageGetMeta(page) + sizeof(meta) - (char *) page;
	PageSetChecksumInplace(page, GPU_METRIC_METAPAGE_BLKNO);
	smgrwrite(RelationGetSmgr(index), INIT_FORKNUM, GPU_METRIC_METAPAGE_BLKNO, (char *) page, true);
	log_newpage(GpuIvfpqSmgrRelFile(index), INIT_FORKNUM, GPU_METRIC_METAPAGE_BLKNO,
				page, true);
	smgrimmedsync(RelationGetSmgr(index), INIT_FORKNUM);
}

/* Names of the build phases for pg_stat_progress_create_index. */
char *
gpumetricbuildphasename(int64 phase)
{
	switch (phase)
	{
		case PROGRESS_CREATEIDX_SUBPHASE_INITIALIZE:
			return (char *) "initializing";
		case PHASE_READ:
			return (char *) "reading words";
		case PHASE_BUILD:
			return (char *) "building the metric index";
		case PHASE_WRITE:
			return (char *) "writing index pages";
		default:
			return NULL;
	}
}
