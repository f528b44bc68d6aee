// CREATE INDEX: sample, train the quantizers, assign and encode every row,
// write the lists. Also the empty index of an unlogged table's init fork.
#include "am/am.h"
#include "service/service.h"
#include "common/guard.h"
#include "engine/ivfpq.h"
#include "engine/parallel.h"
#include "engine/rabitq.h"

#include <algorithm>

extern "C" {
#include "access/reloptions.h"
#include "utils/sampling.h"
#include "utils/syscache.h"

#include <sys/mman.h>
}

/* Build phases, as pg_stat_progress_create_index shows them. */
#define PHASE_SAMPLE	2
#define PHASE_TRAIN		3
#define PHASE_ENCODE	4
#define PHASE_WRITE		5

#define SAMPLES_PER_LIST	128		/* training rows per list (k-means balance improves up to ~128) ... */
#define MIN_SAMPLE			16384	/* ... but at least this many */
#define MIN_SAMPLES_PER_LIST 8		/* below this, error instead of training */
#define ENCODE_BATCH		4096	/* rows encoded per engine call */
#define BUILD_SEED			0x9e3779b97f4a7c15ULL	/* same table, same index */

typedef struct BuildState
{
	Relation	index;
	int			dim;			/* from the first non-NULL row */
	int			metric;
	GpuIvfpqVectorFormat format;	/* how the column stores its vectors */
	int			lists;
	int			m;				/* bytes of an entry's code */
	bool		rabitq;			/* codes = rabitq: RaBitQ codes, no vector copies */
	int			bits;			/* RaBitQ bits per dimension */
	bool		store_vectors;	/* the option: entries keep their vector when it fits */
	int			vdim;			/* floats of vector per entry (0: none) */
	bool		keyed;			/* entries carry the filter column's value */
	double		heap_tuples;	/* rows seen, NULLs included */
	double		index_tuples;	/* non-NULL rows */
	MemoryContext tmpctx;		/* reset per row */

	/* pass 1: reservoir sample of the rows of sampled blocks */
	double		sample_seen;	/* non-NULL rows offered to the reservoir */
	double		vectors_estimate;	/* non-NULL rows of the table (exact after a full scan) */
	float	   *sample;
	int			sample_cap;		/* rows it may hold: enough to train, what memory allows */
	int			sample_floor;	/* rows it must hold when the table has more (0: no row yet) */
	int			sample_alloc;	/* rows allocated: it grows with the rows */
	int			sample_n;
	pg_prng_state prng;

	/*
	 * A full pass 1 also keeps every row while they fit a quarter of
	 * maintenance_work_mem: pass 2 then encodes them from memory instead of
	 * reading the table again.
	 */
	bool		keep_rows;
	float	   *rows;			/* dim floats each */
	ItemPointerData *row_tids;
	int64	   *row_keys;		/* keyed */
	Size		rows_n;
	Size		rows_alloc;
	int64	   *row_order;		/* kept rows in TID order (a parallel read), or NULL: as kept */
	Size		rows_hint;		/* rows the table is expected to hold (its reltuples) */

	/* pass 2: encode in batches, buffer entries by list, flush when full */
	gpuivfpq::IvfPqModel *model;	/* owned by the build's memory context (PQ codes) */
	gpuivfpq::RabitqModel *rabitq_model;	/* the same, RaBitQ codes */
	char	   *rabitq_blob;	/* its blob as the index stores it (the GPU assigns lists by it) */
	float	   *batch;
	ItemPointerData *batch_tids;
	int64	   *batch_keys;		/* filter keys (keyed) */
	int64	   *batch_src;		/* each row's index in rows (kept rows only) */
	int			batch_n;
	int			batch_cap;		/* rows, up to ENCODE_BATCH, or the GPU encoder's segment */
	GpuIvfpqRemoteEncoder *gpu_encoder; /* encodes on the service's GPU when set */
	int32	   *batch_lists;
	uint8	   *batch_codes;
	float	   *batch_radius;
	float	   *batch_qerror;
	int32	   *pend_lists;		/* pending entries (list, tid, code, vector) */
	ItemPointerData *pend_tids;
	int64	   *pend_keys;		/* keyed */
	uint8	   *pend_codes;
	float	   *pend_vectors;	/* vdim floats each (rows not kept) */
	int64	   *pend_src;		/* each entry's index in rows (kept rows: no copy) */
	float	   *list_radius;	/* per list, max over pending entries */
	float	   *list_qerror;	/* per list, max quantization error of pending entries */
	int			pend_n;
	int			pend_cap;
	GpuIvfpqMetaPageData *meta;

	/* seconds spent in pass 2's steps, for the phase report */
	double		encode_secs;	/* assigning and encoding (GPU or engine) */
	double		bounds_secs;	/* covering radii and quantization errors */
	double		write_secs;		/* list pages and their WAL */
} BuildState;

/* Logs how long a build phase took (DEBUG1), and restarts the clock. */
static void
ReportPhase(const char *phase, double rows, TimestampTz *start)
{
	TimestampTz now = GetCurrentTimestamp();

	elog(DEBUG1, "gpu_ivfpq build: %s (%.0f rows) took %.3f s", phase, rows,
		 (double) (now - *start) / 1000000.0);
	*start = now;
}

/* Seconds from start to now. */
static double
SecondsSince(TimestampTz start)
{
	return (double) (GetCurrentTimestamp() - start) / 1000000.0;
}

/* Bytes of maintenance_work_mem. */
static Size
MaintenanceBytes(void)
{
	return (Size) maintenance_work_mem * 1024;
}

/* Errors out, with the figures, when a build needs more memory than allowed. */
static void
CheckBuildMemory(Size needed, const char *what)
{
	if (needed > MaintenanceBytes())
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("gpu_ivfpq build needs %zu MB of memory for %s, maintenance_work_mem is %d MB",
						needed / (1024 * 1024) + 1, what, maintenance_work_mem / 1024),
				 errhint("Increase maintenance_work_mem, or use fewer lists.")));
}

/* Whether the index's options ask for RaBitQ codes. */
static bool
WantsRabitq(Relation index)
{
	GpuIvfpqOptions *opts = (GpuIvfpqOptions *) index->rd_options;

	return opts != NULL && opts->codes == GPU_IVFPQ_CODES_RABITQ;
}

static int	ChooseM(Relation index, const GpuIvfpqOptions *opts, int dim, bool existing);

/*
 * Errors unless codes as opts ask for them (NULL: the defaults) can take
 * vectors of dim dimensions: m must divide dim (PQ codes), or dim be
 * within RaBitQ's limit.
 */
static void
CheckCodesDimWith(Relation index, const GpuIvfpqOptions *opts, int dim)
{
	GpuIvfpqCheckIndexableDim(dim);
	if (opts != NULL && opts->codes == GPU_IVFPQ_CODES_RABITQ)
		GpuIvfpqRabitqCheckDim(index, dim);
	else
		(void) ChooseM(index, opts, dim, false);
}

/* CheckCodesDimWith the index's own options. */
static void
CheckCodesDim(Relation index, int dim)
{
	CheckCodesDimWith(index, (const GpuIvfpqOptions *) index->rd_options, dim);
}

/*
 * ALTER INDEX ... SET (...) changed the options of index, an index of
 * vectors of dim dimensions (0: none yet): its next build (REINDEX, VACUUM
 * FULL, a restore of a dump) must be able to use them, so codes or an m
 * that cannot take its vectors are refused now rather than at that build.
 */
void
GpuIvfpqCheckNewOptions(Relation index, Datum reloptions, int dim)
{
	GpuIvfpqOptions *opts = (GpuIvfpqOptions *) gpuivfpqoptions(reloptions, false);

	if (dim > 0)
		CheckCodesDimWith(index, opts, dim);
	if (opts != NULL)
		pfree(opts);
}

/*
 * A pgvector column declares its dimension (vector(n), halfvec(n)): it is
 * checked, and m against it, at CREATE INDEX, before any row and even on
 * an empty table (whose index would otherwise fail at its REINDEX).
 */
static void
CheckDeclaredDim(Relation index, GpuIvfpqVectorFormat format)
{
	int32		typmod = TupleDescAttr(RelationGetDescr(index), 0)->atttypmod;

	if ((format == GPU_IVFPQ_FORMAT_VECTOR || format == GPU_IVFPQ_FORMAT_HALFVEC) && typmod > 0)
		CheckCodesDim(index, typmod);
}

/* Checks one indexed vector's dimension: the first row's sets the index's. */
static void
CheckRowDim(BuildState *bs, int dim)
{
	if (bs->dim == 0)
	{
		/* The first row: the dimension is known, m is checked before reading on. */
		CheckCodesDim(bs->index, dim);
		bs->dim = dim;
	}
	else if (dim != bs->dim)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("vector has %d dimensions, the index has %d", dim, bs->dim),
				 errhint("Every indexed vector must have the same number of dimensions.")));
}

/* Validates one indexed value and returns its elements (in tmpctx). */
static const float *
RowVector(BuildState *bs, Datum value)
{
	int			dim;
	const float *v = GpuIvfpqDatumVector(value, bs->format, &dim, "indexed vector");

	CheckRowDim(bs, dim);
	return v;
}

/*
 * Readies a large buffer the build is about to fill past its first `filled`
 * bytes (those of a buffer just grown by repalloc). It asks the kernel to
 * back it with huge pages (Linux, transparent huge pages in "madvise"
 * mode): filling half a gigabyte of rows otherwise takes a page fault, and
 * a page cleared, every 4 kB, which cost as much as reading the table (only
 * whole 2 MB pages inside the buffer; a kernel that declines is fine). Then
 * the build's threads touch every page wholly past the filled bytes, so that
 * the kernel clears them on several cores rather than on the one that fills
 * the buffer (that clearing was most of a parallel read's time in the
 * leader).
 */
static void
PrepareBuffer(void *p, Size bytes, Size filled)
{
	uintptr_t	from = TYPEALIGN(4096, (uintptr_t) p + filled);
	uintptr_t	to = (uintptr_t) p + bytes;
	int			threads = Max(1, max_parallel_maintenance_workers + 1);

#ifdef MADV_HUGEPAGE
	const uintptr_t huge = (uintptr_t) 2 << 20;
	uintptr_t	start = ((uintptr_t) p + huge - 1) & ~(huge - 1);
	uintptr_t	end = ((uintptr_t) p + bytes) & ~(huge - 1);

	if (end > start)
		(void) madvise((void *) start, end - start, MADV_HUGEPAGE);
#endif
	if (threads > 1 && to > from)
		GpuIvfpqGuard("allocating", [&] { gpuivfpq::prefault_pages((void *) from, to - from, threads); });
}

/* Stops keeping the rows of pass 1: pass 2 will read the table. */
static void
DropKeptRows(BuildState *bs)
{
	if (bs->rows != NULL)
	{
		pfree(bs->rows);
		pfree(bs->row_tids);
		if (bs->row_keys != NULL)
			pfree(bs->row_keys);
		if (bs->row_order != NULL)
			pfree(bs->row_order);
	}
	bs->rows = NULL;
	bs->row_tids = NULL;
	bs->row_keys = NULL;
	bs->row_order = NULL;
	bs->rows_n = bs->rows_alloc = 0;
	bs->keep_rows = false;
}

/*
 * Keeps one row of a full pass 1 for pass 2, growing the buffers by
 * doubling up to a quarter of maintenance_work_mem; returns false, keeping
 * nothing more, when the row would pass it (the caller drops the rows).
 */
static bool
KeepRow(BuildState *bs, ItemPointer tid, const float *v, int64 key)
{
	if (bs->rows_n == bs->rows_alloc)
	{
		Size		per_row = (Size) bs->dim * sizeof(float) + sizeof(ItemPointerData) +
			(bs->keyed ? sizeof(int64) : 0);
		Size		limit = MaintenanceBytes() / 4 / per_row;
		/* The first allocation takes what the table is expected to hold: no copies on growing. */
		Size		grow = Min(limit, Max((Size) 1024, bs->rows_alloc == 0 ? bs->rows_hint : bs->rows_alloc * 2));

		if (grow <= bs->rows_n)
			return false;
		if (bs->rows == NULL)
		{
			bs->rows = (float *) palloc_extended(grow * bs->dim * sizeof(float), MCXT_ALLOC_HUGE);
			bs->row_tids = (ItemPointerData *) palloc_extended(grow * sizeof(ItemPointerData), MCXT_ALLOC_HUGE);
			if (bs->keyed)
				bs->row_keys = (int64 *) palloc_extended(grow * sizeof(int64), MCXT_ALLOC_HUGE);
		}
		else
		{
			bs->rows = (float *) repalloc_huge(bs->rows, grow * bs->dim * sizeof(float));
			bs->row_tids = (ItemPointerData *) repalloc_huge(bs->row_tids, grow * sizeof(ItemPointerData));
			if (bs->keyed)
				bs->row_keys = (int64 *) repalloc_huge(bs->row_keys, grow * sizeof(int64));
		}
		bs->rows_alloc = grow;
		PrepareBuffer(bs->rows, grow * bs->dim * sizeof(float), bs->rows_n * bs->dim * sizeof(float));
	}
	memcpy(bs->rows + bs->rows_n * bs->dim, v, (Size) bs->dim * sizeof(float));
	bs->row_tids[bs->rows_n] = *tid;
	if (bs->keyed)
		bs->row_keys[bs->rows_n] = key;
	bs->rows_n++;
	return true;
}

/* Pass 1: keeps a uniform reservoir sample of the rows offered (Algorithm R). */
static void
SampleRow(BuildState *bs, const float *v)
{
	Size		row = (Size) bs->dim * sizeof(float);
	int			slot = -1;

	if (bs->sample_floor == 0)
	{
		/*
		 * First row: the dimension is known. The sample may take half of
		 * maintenance_work_mem (training copies it once more).
		 */
		int			want = Max(bs->lists * SAMPLES_PER_LIST, MIN_SAMPLE);

		bs->sample_cap = (int) Min((Size) want, MaintenanceBytes() / 2 / row);
		bs->sample_floor = Min(want, bs->lists * MIN_SAMPLES_PER_LIST);
	}

	if (bs->sample_n < bs->sample_cap)
	{
		/*
		 * It grows with the rows: a small table's sample takes what its rows
		 * do. A full read knows about how many rows the table has.
		 */
		if (bs->sample_n == bs->sample_alloc)
		{
			bs->sample_alloc = Min(bs->sample_cap,
								   Max(64, Max(bs->sample_alloc * 2, (int) Min(bs->rows_hint, (Size) INT_MAX))));
			bs->sample = bs->sample == NULL
				? (float *) palloc_extended((Size) bs->sample_alloc * row, MCXT_ALLOC_HUGE)
				: (float *) repalloc_huge(bs->sample, (Size) bs->sample_alloc * row);
			PrepareBuffer(bs->sample, (Size) bs->sample_alloc * row, (Size) bs->sample_n * row);
		}
		slot = bs->sample_n++;
	}
	else
	{
		uint64		j;

		/* More rows than memory holds: enough of them to train every list, still. */
		if (bs->sample_cap < bs->sample_floor)
			CheckBuildMemory((Size) bs->sample_floor * row * 2, "the training sample");
		j = pg_prng_uint64_range(&bs->prng, 0, (uint64) bs->sample_seen);

		if (j < (uint64) bs->sample_cap)
			slot = (int) j;
	}
	if (slot >= 0)
		memcpy(bs->sample + (Size) slot * bs->dim, v, (Size) bs->dim * sizeof(float));
	bs->sample_seen++;
}

/* Pass 1 from the table: samples each row, and keeps it while rows are kept. */
static void
SampleCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull,
			   bool tupleIsAlive, void *state)
{
	BuildState *bs = (BuildState *) state;
	MemoryContext old;
	const float *v;

	bs->heap_tuples++;
	if (isnull[0])
		return;
	old = MemoryContextSwitchTo(bs->tmpctx);
	v = RowVector(bs, values[0]);
	MemoryContextSwitchTo(old);
	SampleRow(bs, v);
	if (bs->keep_rows &&
		!KeepRow(bs, tid, v, bs->keyed ? GpuIvfpqFilterKeyOf(index, values[1], isnull[1]) : 0))
		DropKeptRows(bs);
	MemoryContextReset(bs->tmpctx);
}

/* Offers the kept rows to the sample, in row_order when set. */
static void
SampleKeptRows(BuildState *bs)
{
	for (Size i = 0; i < bs->rows_n; i++)
	{
		Size		r = bs->row_order != NULL ? (Size) bs->row_order[i] : i;

		SampleRow(bs, bs->rows + r * bs->dim);
		if ((i & 1023) == 0)
			CHECK_FOR_INTERRUPTS();
	}
}

/*
 * Pass 1 over parallel workers (GpuIvfpqBuildRowFn): the rows come in no
 * particular order, so they are kept unsampled and sampled once all are
 * read, in TID order (SampleRows): the index is then the one a serial read
 * of the same table builds. Rows too many to keep are sampled as they come.
 */
static void
SampleParallelRow(void *state, ItemPointer tid, const float *v, int dim, int64 key)
{
	BuildState *bs = (BuildState *) state;

	CheckRowDim(bs, dim);
	if (bs->keep_rows)
	{
		if (KeepRow(bs, tid, v, key))
			return;
		SampleKeptRows(bs);
		DropKeptRows(bs);
	}
	SampleRow(bs, v);
}

/* row_order: the kept rows sorted by TID (a parallel read keeps them as they came). */
static void
OrderKeptRows(BuildState *bs)
{
	struct TidRow
	{
		uint64		tid;
		int64		row;
	};
	TidRow	   *order = (TidRow *) palloc_extended(sizeof(TidRow) * Max(bs->rows_n, 1), MCXT_ALLOC_HUGE);

	for (Size i = 0; i < bs->rows_n; i++)
	{
		const ItemPointerData *t = &bs->row_tids[i];

		order[i].tid = ((uint64) ItemPointerGetBlockNumberNoCheck(t) << 16) |
			ItemPointerGetOffsetNumberNoCheck(t);
		order[i].row = (int64) i;
	}
	std::sort(order, order + bs->rows_n, [](const TidRow &a, const TidRow &b) { return a.tid < b.tid; });
	bs->row_order = (int64 *) palloc_extended(sizeof(int64) * Max(bs->rows_n, 1), MCXT_ALLOC_HUGE);
	for (Size i = 0; i < bs->rows_n; i++)
		bs->row_order[i] = order[i].row;
	pfree(order);
}

/*
 * Phase 1: the training sample. Like ANALYZE, reads a random subset of the
 * table's blocks (utils/sampling.h) and keeps a reservoir of their rows, so
 * large tables are not read in full just to sample; the encode pass is the
 * one full read. When the sampled blocks do not fill the reservoir (a small
 * table, or a mostly NULL column), the table is sampled in full instead, so
 * training never sees fewer vectors than the table could give it and the
 * vector count is exact.
 */
static void
SampleRows(BuildState *bs, Relation heap, IndexInfo *indexInfo)
{
	BlockNumber nblocks = RelationGetNumberOfBlocks(heap);
	int			target = Max(bs->lists * SAMPLES_PER_LIST, MIN_SAMPLE);
	BlockSamplerData sampler;

	pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, PHASE_SAMPLE);
	if (nblocks > (BlockNumber) target)
	{
		BlockNumber sampled = 0;

		/* target blocks hold at least target rows unless most rows are NULL. */
		bs->keep_rows = false;
		(void) BlockSampler_Init(&sampler, nblocks, target, (uint32) BUILD_SEED);
		while (BlockSampler_HasMore(&sampler))
		{
			BlockNumber blk = BlockSampler_Next(&sampler);

			/* anyvisible = false, as table_index_build_scan does. */
			table_index_build_range_scan(heap, bs->index, indexInfo, false, false, false, blk, 1,
										 SampleCallback, bs, NULL);
			sampled++;
			CHECK_FOR_INTERRUPTS();
		}
		if (bs->sample != NULL && bs->sample_n == bs->sample_cap)
		{
			bs->vectors_estimate = bs->sample_seen * ((double) nblocks / Max(sampled, 1));
			return;
		}
		/* Start again over every row: the reservoir keeps its buffer and the dimension. */
		bs->sample_n = 0;
		bs->sample_seen = 0;
		bs->heap_tuples = 0;
		pg_prng_seed(&bs->prng, BUILD_SEED);
	}
	/* Pass 2 sees these very rows: the same scan of the same snapshot. */
	bs->keep_rows = true;
	bs->rows_hint = heap->rd_rel->reltuples > 0 ? (Size) Min((double) heap->rd_rel->reltuples * 1.05 + 1024, 1e12) : 0;
	if (GpuIvfpqBuildReadParallel(heap, bs->index, indexInfo, SampleParallelRow, bs, &bs->heap_tuples))
	{
		if (bs->rows != NULL)
		{
			OrderKeptRows(bs);
			SampleKeptRows(bs);
		}
	}
	else
		table_index_build_scan(heap, bs->index, indexInfo, true, true, SampleCallback, bs, NULL);
	bs->vectors_estimate = bs->sample_seen;
}

/*
 * Writes the pending entries to their lists, grouped by list. Each list's
 * entries are packed into one buffer, reused from list to list (a buffer
 * for every entry at once would cost as much memory again as the pending
 * vectors, touched for the first time); a vector comes from the kept rows
 * when pass 1 kept them, else from the pending copies.
 */
static void
FlushPending(BuildState *bs)
{
	GpuIvfpqEntryLayout el = GpuIvfpqLayout(bs->m, bs->vdim, bs->keyed);
	int			esz = el.xsize;
	int		   *counts = (int *) palloc0(sizeof(int) * (bs->lists + 1));
	int		   *order = (int *) palloc(sizeof(int) * Max(bs->pend_n, 1));
	int			longest = 0;
	char	   *packed;
	TimestampTz began = GetCurrentTimestamp();

	pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, PHASE_WRITE);
	/* Counting sort by list keeps build order (and so TID order) within a list. */
	for (int i = 0; i < bs->pend_n; i++)
		counts[bs->pend_lists[i] + 1]++;
	for (int l = 0; l < bs->lists; l++)
	{
		longest = Max(longest, counts[l + 1]);
		counts[l + 1] += counts[l];
	}
	for (int i = 0; i < bs->pend_n; i++)
		order[counts[bs->pend_lists[i]]++] = i;
	packed = (char *) palloc_extended((Size) Max(longest, 1) * esz, MCXT_ALLOC_HUGE);
	/* counts[l] is now the end of list l, counts[l-1] its start. */
	for (int l = 0; l < bs->lists; l++)
	{
		int			start = l == 0 ? 0 : counts[l - 1];
		int			n = counts[l] - start;

		for (int i = 0; i < n; i++)
		{
			int			e = order[start + i];
			char	   *dst = packed + (Size) i * esz;

			if (bs->vdim > 0)
				memcpy(dst, bs->pend_src != NULL ? bs->rows + (Size) bs->pend_src[e] * bs->dim
					   : bs->pend_vectors + (Size) e * bs->vdim, sizeof(float) * bs->vdim);
			memcpy(dst + el.xtid, &bs->pend_tids[e], GPU_IVFPQ_TID_BYTES);
			memcpy(dst + el.xcode, bs->pend_codes + (Size) e * bs->m, bs->m);
			if (bs->keyed)
				memcpy(dst + el.xkey, &bs->pend_keys[e], GPU_IVFPQ_FILTER_KEY_BYTES);
		}
		if (n > 0)
			GpuIvfpqAppendEntries(bs->index, bs->meta, l, packed, n,
								  bs->list_radius[l], bs->list_qerror[l], true);
		bs->list_radius[l] = 0.0f;
		bs->list_qerror[l] = 0.0f;
		CHECK_FOR_INTERRUPTS();
	}
	pfree(counts);
	pfree(order);
	pfree(packed);
	bs->pend_n = 0;
	bs->write_secs += SecondsSince(began);
	pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, PHASE_ENCODE);
}

/* Encodes the rows of the current batch and moves them to the pending entries. */
static void
EncodeBatch(BuildState *bs)
{
	int			threads = Max(1, max_parallel_maintenance_workers + 1);
	TimestampTz start;
	bool		on_gpu;

	if (bs->batch_n == 0)
		return;
	if (bs->pend_n + bs->batch_n > bs->pend_cap)
		FlushPending(bs);
	start = GetCurrentTimestamp();
	on_gpu = bs->gpu_encoder != NULL &&
		GpuIvfpqServiceEncode(bs->gpu_encoder, bs->batch_n, bs->batch_lists, bs->batch_codes);
	if (bs->rabitq)
	{
		/* on_gpu: the GPU assigned the lists and encoded the rows. */
		GpuIvfpqRabitqEncode(bs->rabitq_model, bs->batch, bs->batch_n, bs->batch_lists, bs->batch_codes,
							 bs->batch_radius, threads, on_gpu);
		memset(bs->batch_qerror, 0, sizeof(float) * bs->batch_n);
	}
	else if (!on_gpu)
		GpuIvfpqGuard("encoding", [&] {
			bs->model->encode(bs->batch, bs->batch_n, bs->batch_lists, bs->batch_codes,
							  bs->batch_radius, threads);
		});
	bs->encode_secs += SecondsSince(start);
	start = GetCurrentTimestamp();
	if (!bs->rabitq)
		GpuIvfpqGuard("encoding", [&] {
			/* The GPU assigned and encoded; the covering radii are cheap here. */
			if (on_gpu)
				bs->model->centroid_distances(bs->batch, bs->batch_n, bs->batch_lists, bs->batch_radius,
											  threads);
			/* How far each code is from its vector: range search's ADC bound. */
			bs->model->quantization_errors(bs->batch, bs->batch_n, bs->batch_lists, bs->batch_codes,
										   bs->batch_qerror, threads);
		});
	bs->bounds_secs += SecondsSince(start);
	for (int i = 0; i < bs->batch_n; i++)
	{
		int			p = bs->pend_n++;
		int			l = bs->batch_lists[i];

		bs->pend_lists[p] = l;
		bs->pend_tids[p] = bs->batch_tids[i];
		if (bs->keyed)
			bs->pend_keys[p] = bs->batch_keys[i];
		memcpy(bs->pend_codes + (Size) p * bs->m, bs->batch_codes + (Size) i * bs->m, bs->m);
		if (bs->pend_src != NULL)
			bs->pend_src[p] = bs->batch_src[i];
		else if (bs->vdim > 0)
			memcpy(bs->pend_vectors + (Size) p * bs->vdim, bs->batch + (Size) i * bs->dim,
				   sizeof(float) * bs->vdim);
		if (bs->batch_radius[i] > bs->list_radius[l])
			bs->list_radius[l] = bs->batch_radius[i];
		if (bs->batch_qerror[i] > bs->list_qerror[l])
			bs->list_qerror[l] = bs->batch_qerror[i];
	}
	pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_DONE, (int64) bs->index_tuples);
	bs->batch_n = 0;
}

/*
 * Adds one row to the encode batch, encoding the batch once full; src is
 * the row's index in the kept rows (-1: not kept).
 */
static void
EncodeRow(BuildState *bs, ItemPointer tid, const float *v, int64 key, int64 src)
{
	memcpy(bs->batch + (Size) bs->batch_n * bs->dim, v, (Size) bs->dim * sizeof(float));
	if (bs->pend_src != NULL)
		bs->batch_src[bs->batch_n] = src;
	if (bs->keyed)
		bs->batch_keys[bs->batch_n] = key;
	bs->batch_tids[bs->batch_n++] = *tid;
	bs->index_tuples++;
	if (bs->batch_n == bs->batch_cap)
		EncodeBatch(bs);
}

/* Pass 2 from the table: collects rows into encode batches. */
static void
EncodeCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull,
			   bool tupleIsAlive, void *state)
{
	BuildState *bs = (BuildState *) state;
	MemoryContext old;

	/* Pass 2 recounts the rows: ambuild reports them as the table's reltuples. */
	bs->heap_tuples++;
	if (isnull[0])
		return;
	old = MemoryContextSwitchTo(bs->tmpctx);
	EncodeRow(bs, tid, RowVector(bs, values[0]),
			  bs->keyed ? GpuIvfpqFilterKeyOf(index, values[1], isnull[1]) : 0, -1);
	MemoryContextSwitchTo(old);
	MemoryContextReset(bs->tmpctx);
}

/* Pass 2 over parallel workers (GpuIvfpqBuildRowFn). */
static void
EncodeParallelRow(void *state, ItemPointer tid, const float *v, int dim, int64 key)
{
	BuildState *bs = (BuildState *) state;

	CheckRowDim(bs, dim);
	EncodeRow(bs, tid, v, key, -1);
}

/* Whether typid is an integer type a filter column may have. */
static bool
IsFilterType(Oid typid)
{
	return typid == INT2OID || typid == INT4OID || typid == INT8OID;
}

/*
 * The index's columns: the vector first, then at most one filter column
 * of an integer type (whose values the entries carry, so that the GPU and
 * the CPU engine apply WHERE filter_column <op> value before ranking).
 */
static void
GpuIvfpqCheckColumns(Relation index)
{
	TupleDesc	desc = RelationGetDescr(index);
	int			nkeys = IndexRelationGetNumberOfKeyAttributes(index);

	if (nkeys > 2)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("gpu_ivfpq index \"%s\" has %d columns; it takes a vector column and at most one filter column",
						RelationGetRelationName(index), nkeys),
				 errhint("Index the vector column first, then one integer column to filter on, for example (embedding, tenant_id).")));
	if (IsFilterType(TupleDescAttr(desc, 0)->atttypid))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("the first column of gpu_ivfpq index \"%s\" must be the vector column",
						RelationGetRelationName(index)),
				 errhint("Put the integer filter column second, for example (embedding, tenant_id).")));
	/* Errors for a vector type gpu_ivfpq cannot read (before any row is). */
	(void) GpuIvfpqIndexFormat(index);
	if (nkeys == 2 && !IsFilterType(TupleDescAttr(desc, 1)->atttypid))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("the filter column of gpu_ivfpq index \"%s\" must be smallint, integer or bigint",
						RelationGetRelationName(index)),
				 errhint("A gpu_ivfpq index takes one vector column and, optionally, one integer filter column.")));
}

/* Starts a metapage's contents: format identity, metric and a fresh build id. */
static void
InitMeta(GpuIvfpqMetaPageData *meta, int metric)
{
	memset(meta, 0, sizeof(*meta));
	meta->magic = GPU_IVFPQ_MAGIC;
	meta->version = GPU_IVFPQ_VERSION;
	meta->nbits = GPU_IVFPQ_NBITS;
	meta->metric = (uint8) metric;
	meta->build_id = pg_prng_uint32(&pg_global_prng_state);
}

/* Formats page as the metapage holding meta. */
static void
FormatMetaPage(Page page, const GpuIvfpqMetaPageData *meta)
{
	GpuIvfpqInitPage(page, GPU_IVFPQ_PAGE_META);
	memcpy(GpuIvfpqPageGetMeta(page), meta, sizeof(*meta));
	((PageHeader) page)->pd_lower = (char *) GpuIvfpqPageGetMeta(page) + sizeof(*meta) - (char *) page;
}

/* Writes (or rewrites) the metapage at block 0 of fork. */
static void
WriteMetaPage(Relation index, const GpuIvfpqMetaPageData *meta, Buffer buf)
{
	GenericXLogState *state = GenericXLogStart(index);

	FormatMetaPage(GenericXLogRegisterBuffer(state, buf, GENERIC_XLOG_FULL_IMAGE), meta);
	GenericXLogFinish(state);
}

/* Fills a directory of `lists` empty lists into consecutive new pages. */
static BlockNumber
WriteEmptyListDir(Relation index, int lists, uint32 *npages)
{
	Size		bytes = sizeof(GpuIvfpqListDirEntry) * lists;
	GpuIvfpqListDirEntry *dir = (GpuIvfpqListDirEntry *) palloc(bytes);
	BlockNumber start = InvalidBlockNumber;

	for (int l = 0; l < lists; l++)
	{
		dir[l].head = InvalidBlockNumber;
		dir[l].insert_hint = InvalidBlockNumber;
		dir[l].radius = 0.0f;
		dir[l].qerror = 0.0f;
	}
	*npages = 0;
	for (int first = 0; first < lists; first += GPU_IVFPQ_LISTDIR_PER_PAGE)
	{
		Buffer		buf = GpuIvfpqNewBuffer(index, MAIN_FORKNUM);
		GenericXLogState *state = GenericXLogStart(index);
		Page		page = GenericXLogRegisterBuffer(state, buf, GENERIC_XLOG_FULL_IMAGE);
		int			n = Min(GPU_IVFPQ_LISTDIR_PER_PAGE, lists - first);

		GpuIvfpqInitPage(page, GPU_IVFPQ_PAGE_LISTDIR);
		memcpy(PageGetContents(page), dir + first, sizeof(GpuIvfpqListDirEntry) * n);
		((PageHeader) page)->pd_lower += MAXALIGN(sizeof(GpuIvfpqListDirEntry) * n);
		if (start == InvalidBlockNumber)
			start = BufferGetBlockNumber(buf);
		GenericXLogFinish(state);
		UnlockReleaseBuffer(buf);
		(*npages)++;
	}
	pfree(dir);
	return start;
}

/* Whether the index's WITH (...) names option name. */
static bool
GpuIvfpqHasOption(Relation index, const char *name)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(RelationGetRelid(index)));
	bool		isnull;
	bool		found = false;
	Datum		d;

	if (!HeapTupleIsValid(tup))
		return false;
	d = SysCacheGetAttr(RELOID, tup, Anum_pg_class_reloptions, &isnull);
	if (!isnull)
	{
		ListCell   *lc;

		foreach(lc, untransformRelOptions(d))
			found |= strcmp(((DefElem *) lfirst(lc))->defname, name) == 0;
	}
	ReleaseSysCache(tup);
	return found;
}

/* The options of an index, with defaults when it has none. */
static void
IndexOptions(Relation index, BuildState *bs)
{
	GpuIvfpqOptions *opts = (GpuIvfpqOptions *) index->rd_options;

	bs->lists = opts ? opts->lists : GPU_IVFPQ_DEFAULT_LISTS;
	bs->store_vectors = opts ? opts->store_vectors : true;
	bs->rabitq = WantsRabitq(index);
	bs->bits = opts ? opts->bits : GPU_IVFPQ_DEFAULT_RABITQ_BITS;
	if (bs->rabitq && opts->m != 0)
		ereport(NOTICE,
				(errmsg("gpu_ivfpq index \"%s\" ignores m = %d: its codes are RaBitQ codes of %d bits per dimension",
						RelationGetRelationName(index), opts->m, bs->bits),
				 errhint("m sets the bytes of PQ codes (codes = pq).")));
	/* The other options one kind of codes has no use for, when given. */
	if (opts != NULL && (bs->rabitq ? GpuIvfpqHasOption(index, "store_vectors") : GpuIvfpqHasOption(index, "bits")))
		ereport(NOTICE,
				(errmsg("gpu_ivfpq index \"%s\" ignores %s: it applies to codes = %s",
						RelationGetRelationName(index), bs->rabitq ? "store_vectors" : "bits",
						bs->rabitq ? "pq" : "rabitq"),
				 errhint(bs->rabitq ? "An index with RaBitQ codes keeps no vector copies; scans re-rank from the table."
						 : "bits sets the bits per dimension of RaBitQ codes; PQ codes take m.")));
}

/*
 * The m an index of dim dimensions gets: its option m, checked against the
 * dimension as soon as that is known (the column's type at CREATE INDEX,
 * else the first row: of the build, or of the first insert into an index
 * built on an empty table, existing then, which ALTER INDEX fixes), naming
 * the values that would work; else the default for dim.
 */
int
GpuIvfpqChooseM(Relation index, int dim, bool existing)
{
	return ChooseM(index, (const GpuIvfpqOptions *) index->rd_options, dim, existing);
}

/* GpuIvfpqChooseM with the options opts (NULL: the defaults). */
static int
ChooseM(Relation index, const GpuIvfpqOptions *opts, int dim, bool existing)
{
	int			requested = opts ? opts->m : 0;
	StringInfoData valid;

	if (requested == 0)
		return GpuIvfpqDefaultM(dim);
	if (requested <= dim && dim % requested == 0)
		return requested;
	initStringInfo(&valid);
	for (int m = 1; m <= Min(dim, GPU_IVFPQ_MAX_M); m++)
		if (dim % m == 0)
			appendStringInfo(&valid, "%s%d", valid.len ? ", " : "", m);
	if (existing)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("m = %d of index \"%s\" does not divide the dimension %d of its first vector",
						requested, RelationGetRelationName(index), dim),
				 errdetail("The index was built on an empty table; its first vector sets its dimension."),
				 errhint("ALTER INDEX %s SET (m = ...) with one of: %s; or RESET (m) to have it chosen.",
						 quote_identifier(RelationGetRelationName(index)), valid.data)));
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("m = %d of index \"%s\" does not divide the dimension %d",
					requested, RelationGetRelationName(index), dim),
			 errhint("m must divide the number of dimensions; for %d dimensions use one of: %s.",
					 dim, valid.data)));
	return 0;
}

/*
 * Leaves out of the training sample the rows too long for the quantizers to
 * rank (gpuivfpq::ivfpq_ranks_query: components of about 5e18 and more),
 * unless no other row is there. Such a row would pull its list's centroid
 * past the range where float distances to the rows near it are finite, and
 * with it the approximate ranking of every row of that list. The rows are
 * still indexed, in their nearest list; scans rank them by exact distance.
 */
static void
DropUnrankedSample(BuildState *bs)
{
	int			kept = 0;

	for (int i = 0; i < bs->sample_n; i++)
	{
		const float *v = bs->sample + (Size) i * bs->dim;

		if (!gpuivfpq::ivfpq_ranks_query(v, (size_t) bs->dim))
			continue;
		if (kept != i)
			memmove(bs->sample + (Size) kept * bs->dim, v, sizeof(float) * bs->dim);
		kept++;
	}
	if (kept > 0)
		bs->sample_n = kept;
}

/*
 * Bytes of a build's RaBitQ model (0 for PQ codes): its rotation, centroids
 * and rotated centroids.
 */
static Size
RabitqModelBytes(BuildState *bs)
{
	if (!bs->rabitq)
		return 0;
	/* The model's rotation and centroids, and the blob (rotation, rotated centroids). */
	return 2 * ((Size) bs->dim * bs->dim * sizeof(float) + (Size) bs->lists * bs->dim * sizeof(double)) +
		(Size) bs->lists * bs->dim * sizeof(float);
}

/*
 * Starts phase 2: the training parameters, the sample without the rows the
 * quantizers cannot rank, and room for centroids and m sub-quantizers'
 * codebooks, trained on the service's GPU when it can (returns whether it
 * did; else the caller trains on the CPU engine).
 */
static bool
TrainOnService(BuildState *bs, gpuivfpq::IvfPqTrainParams *params, int m, float **centroids,
			   float **codebooks)
{
	pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, PHASE_TRAIN);
	DropUnrankedSample(bs);
	params->threads = Max(1, max_parallel_maintenance_workers + 1);
	params->max_points_per_centroid = SAMPLES_PER_LIST;
	*centroids = (float *) palloc_extended(sizeof(float) * bs->lists * bs->dim, MCXT_ALLOC_HUGE);
	*codebooks = (float *) palloc(sizeof(float) * 256 * bs->dim);
	return GpuIvfpqServiceTrain(bs->sample, bs->sample_n, bs->dim, bs->lists, m, bs->metric,
								params->iterations, (int) params->max_points_per_centroid,
								params->seed, *centroids, *codebooks);
}

/*
 * Phase 2: trains the quantizers on the sample (on the service's GPU when it
 * can, else the CPU engine) and writes them to the index; fills meta.
 */
static void
TrainQuantizers(BuildState *bs, GpuIvfpqMetaPageData *meta, TimestampTz *phase_start)
{
	gpuivfpq::IvfPqTrainParams params;
	float	   *centroids;
	float	   *codebooks;
	bool		on_gpu;

	bs->m = GpuIvfpqChooseM(bs->index, bs->dim, false);
	/*
	 * The list centroids are held twice: the training's copy and the
	 * model's (as RaBitQ's check counts its own); their size follows the
	 * options, not the table (65536 lists of 2000 dimensions: 1 GB).
	 */
	CheckBuildMemory(2 * sizeof(float) * (Size) bs->lists * bs->dim, "the list centroids");
	on_gpu = TrainOnService(bs, &params, bs->m, &centroids, &codebooks);
	bs->model = GpuIvfpqMakeOwned<gpuivfpq::IvfPqModel>(CurrentMemoryContext, "training",
														(size_t) bs->dim, (size_t) bs->lists,
														(size_t) bs->m, (gpuivfpq::Metric) bs->metric);
	GpuIvfpqGuard("training", [&] {
		if (on_gpu)
		{
			/* The GPU's float sums may overflow with values near the float range. */
			gpuivfpq::clamp_to_finite(centroids, (size_t) bs->lists * bs->dim);
			gpuivfpq::clamp_to_finite(codebooks, (size_t) 256 * bs->dim);
			bs->model->set_centroids(centroids);
			bs->model->set_codebooks(codebooks);
		}
		else
			bs->model->train(bs->sample, bs->sample_n, params);
	});
	pfree(centroids);
	pfree(codebooks);
	ReportPhase(on_gpu ? "training (service GPU)" : "training", bs->sample_n, phase_start);
	pfree(bs->sample);
	bs->sample = NULL;

	meta->lists = bs->lists;
	meta->m = bs->m;
	meta->trained = true;
	meta->features |= GPU_IVFPQ_FEATURE_QERROR;
	if (bs->store_vectors && GpuIvfpqVectorsFit(bs->dim, bs->m, bs->keyed))
	{
		meta->features |= GPU_IVFPQ_FEATURE_VECTORS;
		bs->vdim = bs->dim;
	}
	else if (bs->store_vectors)
		ereport(NOTICE,
				(errmsg("gpu_ivfpq index \"%s\" keeps no vector copies: %d dimensions do not fit an index page",
						RelationGetRelationName(bs->index), bs->dim),
				 errdetail("Scans re-rank candidates with the vectors read from the table.")));
	meta->centroid_start = GpuIvfpqWriteBlob(bs->index, bs->model->centroids().data(),
											 bs->model->centroids().size() * sizeof(float));
	meta->codebook_start = GpuIvfpqWriteBlob(bs->index, bs->model->pq().codebooks().data(),
											 bs->model->pq().codebooks().size() * sizeof(float));
}

/*
 * Phase 2 of an index with RaBitQ codes: the list centroids, trained as
 * those of PQ codes are (on the service's GPU when it can: it trains a
 * one-sub-quantizer PQ beside them, unused here), the random rotation from
 * the build's seed and the rotated centroids; written to the index; fills
 * meta.
 */
static void
TrainRabitq(BuildState *bs, GpuIvfpqMetaPageData *meta, TimestampTz *phase_start)
{
	gpuivfpq::IvfPqTrainParams params;
	Size		rotation_bytes = (Size) bs->dim * bs->dim * sizeof(float);
	Size		rotated_at = GpuIvfpqRabitqRotatedOffset(bs->dim);
	Size		blob_bytes = rotated_at + (Size) bs->lists * bs->dim * sizeof(double);
	float	   *centroids;
	float	   *codebooks;
	char	   *blob;			/* the rotation, then the rotated centroids */
	bool		on_gpu;

	bs->m = GpuIvfpqRabitqRowBytes(bs->dim, bs->bits);
	/* The model, its blob, and the centroids as trained. */
	CheckBuildMemory(RabitqModelBytes(bs) + sizeof(float) * bs->lists * bs->dim, "the rotation and centroids");
	blob = (char *) palloc_extended(blob_bytes, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO);
	on_gpu = TrainOnService(bs, &params, 1, &centroids, &codebooks);
	GpuIvfpqGuard("training", [&] {
		if (on_gpu)
			gpuivfpq::clamp_to_finite(centroids, (size_t) bs->lists * bs->dim);
		else
			gpuivfpq::ivfpq_train_coarse(bs->sample, (size_t) bs->sample_n, (size_t) bs->dim,
										 (size_t) bs->lists, (gpuivfpq::Metric) bs->metric, params,
										 centroids);
		gpuivfpq::RabitqRotation r = gpuivfpq::RabitqRotation::generate((size_t) bs->dim, BUILD_SEED,
																		params.threads);

		memcpy(blob, r.matrix().data(), rotation_bytes);
	});
	bs->rabitq_model = GpuIvfpqMakeOwned<gpuivfpq::RabitqModel>(CurrentMemoryContext, "training",
																(size_t) bs->dim, (size_t) bs->lists,
																bs->bits, (gpuivfpq::Metric) bs->metric,
																(const float *) blob);
	GpuIvfpqGuard("training", [&] {
		bs->rabitq_model->set_centroids(centroids, params.threads);
		memcpy(blob + rotated_at, bs->rabitq_model->rotated_centroids().data(),
			   (Size) bs->lists * bs->dim * sizeof(double));
	});
	ReportPhase(on_gpu ? "training (service GPU) and rotation" : "training and rotation", bs->sample_n,
				phase_start);
	pfree(bs->sample);
	bs->sample = NULL;

	meta->lists = bs->lists;
	meta->m = (uint16) bs->m;
	meta->nbits = (uint16) bs->bits;
	meta->trained = true;
	meta->features |= GPU_IVFPQ_FEATURE_RABITQ;
	bs->vdim = 0;
	meta->centroid_start = GpuIvfpqWriteBlob(bs->index, centroids, sizeof(float) * bs->lists * bs->dim);
	meta->codebook_start = GpuIvfpqWriteBlob(bs->index, blob, blob_bytes);
	pfree(centroids);
	pfree(codebooks);
	bs->rabitq_blob = blob;		/* for the GPU's assignment of the rows */
}

/*
 * Phase 3: reads the table once, assigns and encodes every row (on the
 * service's GPU when it can) and writes the lists; pending entries are
 * bounded by maintenance_work_mem.
 */
static void
EncodeAndWrite(BuildState *bs, Relation heap, IndexInfo *indexInfo, TimestampTz *phase_start)
{
	double		estimate = Max((double) heap->rd_rel->reltuples, bs->vectors_estimate);
	/* A batch of the rows there are, up to ENCODE_BATCH: a small table needs little. */
	int			batch = (int) Min((double) ENCODE_BATCH, Max(ceil(estimate), 1.0));
	Size		batch_bytes = (Size) batch * (bs->dim * sizeof(float) + sizeof(ItemPointerData) +
											  sizeof(int64) + sizeof(int32) + bs->m + 2 * sizeof(float));
	/* Pending entries point into the kept rows, if any, instead of copying their vectors. */
	bool		from_kept = bs->rows != NULL && bs->vdim > 0;
	Size		entry_bytes = sizeof(int32) + sizeof(ItemPointerData) + sizeof(int64) + bs->m +
		(from_kept ? sizeof(int64) : sizeof(float) * bs->vdim);

	/* The rows pass 1 kept, if any, count against maintenance_work_mem too. */
	Size		kept_bytes = RabitqModelBytes(bs) +
		bs->rows_alloc * ((Size) bs->dim * sizeof(float) + sizeof(ItemPointerData) +
						  (bs->keyed ? sizeof(int64) : 0) + (bs->row_order ? sizeof(int64) : 0));

	CheckBuildMemory(batch_bytes + (Size) batch * entry_bytes, "encoding");
	bs->pend_cap = (int) Min((Size) INT_MAX / 2,
							 (MaintenanceBytes() - batch_bytes - Min(kept_bytes, MaintenanceBytes() - batch_bytes))
							 / entry_bytes);
	bs->pend_cap = (int) Min((double) bs->pend_cap, Max(ceil(estimate), (double) batch));
	bs->batch_cap = batch;
	/* Codes are encoded on the service's GPU when it can, else by the CPU engine. */
	if (bs->rabitq)
		bs->gpu_encoder = GpuIvfpqServiceEncoderBegin(bs->rabitq_model->centroids().data(), bs->rabitq_blob,
													  bs->dim, bs->lists, bs->m, bs->metric, bs->bits,
													  &bs->batch_cap);
	else
		bs->gpu_encoder = GpuIvfpqServiceEncoderBegin(bs->model->centroids().data(),
													  bs->model->pq().codebooks().data(), bs->dim, bs->lists,
													  bs->m, bs->metric, 0, &bs->batch_cap);
	/*
	 * The GPU's segment holds more rows than a CPU batch; a batch must fit
	 * the pending entries that maintenance_work_mem allows (pend_cap, at
	 * least the CPU batch, checked above), whose arrays grow to a batch.
	 */
	bs->batch_cap = Min(bs->batch_cap, Max(batch, bs->pend_cap));
	/* Rows go straight into the GPU request's segment when there is one. */
	bs->batch = bs->gpu_encoder != NULL ? GpuIvfpqServiceEncoderRows(bs->gpu_encoder)
		: (float *) palloc_extended((Size) bs->batch_cap * bs->dim * sizeof(float), MCXT_ALLOC_HUGE);
	bs->batch_tids = (ItemPointerData *) palloc(sizeof(ItemPointerData) * bs->batch_cap);
	bs->batch_keys = (int64 *) palloc(sizeof(int64) * bs->batch_cap);
	bs->batch_lists = (int32 *) palloc(sizeof(int32) * bs->batch_cap);
	bs->batch_codes = (uint8 *) palloc((Size) bs->batch_cap * bs->m);
	bs->batch_radius = (float *) palloc(sizeof(float) * bs->batch_cap);
	bs->batch_qerror = (float *) palloc(sizeof(float) * bs->batch_cap);
	bs->pend_cap = Max(bs->pend_cap, bs->batch_cap);	/* a flush always makes room for a batch */
	bs->pend_lists = (int32 *) palloc_extended(sizeof(int32) * bs->pend_cap, MCXT_ALLOC_HUGE);
	bs->pend_tids = (ItemPointerData *) palloc_extended(sizeof(ItemPointerData) * bs->pend_cap, MCXT_ALLOC_HUGE);
	bs->pend_keys = (int64 *) palloc_extended(sizeof(int64) * bs->pend_cap, MCXT_ALLOC_HUGE);
	bs->pend_codes = (uint8 *) palloc_extended((Size) bs->pend_cap * bs->m, MCXT_ALLOC_HUGE);
	if (from_kept)
	{
		bs->batch_src = (int64 *) palloc(sizeof(int64) * bs->batch_cap);
		bs->pend_src = (int64 *) palloc_extended(sizeof(int64) * bs->pend_cap, MCXT_ALLOC_HUGE);
	}
	else if (bs->vdim > 0)
		bs->pend_vectors = (float *) palloc_extended((Size) bs->pend_cap * bs->vdim * sizeof(float),
													 MCXT_ALLOC_HUGE);
	bs->list_radius = (float *) palloc0(sizeof(float) * bs->lists);
	bs->list_qerror = (float *) palloc0(sizeof(float) * bs->lists);

	pgstat_progress_update_param(PROGRESS_CREATEIDX_SUBPHASE, PHASE_ENCODE);
	pgstat_progress_update_param(PROGRESS_CREATEIDX_TUPLES_TOTAL, (int64) estimate);
	if (bs->rows != NULL)
	{
		/* Pass 1 kept every row (and counted them): encode them from memory, in TID order. */
		for (Size i = 0; i < bs->rows_n; i++)
		{
			Size		r = bs->row_order != NULL ? (Size) bs->row_order[i] : i;

			EncodeRow(bs, &bs->row_tids[r], bs->rows + r * bs->dim, bs->keyed ? bs->row_keys[r] : 0,
					  (int64) r);
			if ((i & 1023) == 0)
				CHECK_FOR_INTERRUPTS();
		}
	}
	else
	{
		bs->heap_tuples = 0;	/* pass 2 counts every row: ambuild reports them */
		if (!GpuIvfpqBuildReadParallel(heap, bs->index, indexInfo, EncodeParallelRow, bs, &bs->heap_tuples))
			table_index_build_scan(heap, bs->index, indexInfo, true, true, EncodeCallback, bs, NULL);
	}
	EncodeBatch(bs);
	FlushPending(bs);
	if (bs->rows != NULL)
		DropKeptRows(bs);		/* the pending entries' vectors were there */
	elog(DEBUG1, "gpu_ivfpq build: of which encoding %.3f s, radii and errors %.3f s, writing lists %.3f s",
		 bs->encode_secs, bs->bounds_secs, bs->write_secs);
	ReportPhase(bs->gpu_encoder ? "encoding (service GPU) and writing" : "encoding and writing",
				bs->index_tuples, phase_start);
	GpuIvfpqServiceEncoderEnd(bs->gpu_encoder);
	bs->gpu_encoder = NULL;
}

/*
 * Whether this build empties a temporary index in place, in a transaction
 * that neither created it nor gave it a new file: PostgreSQL's truncation
 * of an ON COMMIT DELETE ROWS table, at every commit that touched temporary
 * tables. CREATE INDEX, REINDEX and TRUNCATE are not (PostgreSQL builds a
 * temporary table's index concurrently as a plain build, in the creating
 * transaction).
 */
static bool
GpuIvfpqRebuiltInPlace(Relation index)
{
	return RelationUsesLocalBuffers(index) && index->rd_createSubid == InvalidSubTransactionId &&
		GpuIvfpqFirstRelFileSubid(index) == InvalidSubTransactionId;
}

/* ambuild: sample, train, encode and write, then publish the metapage. */
IndexBuildResult *
gpuivfpqbuild(Relation heap, Relation index, IndexInfo *indexInfo)
{
	IndexBuildResult *result = (IndexBuildResult *) palloc0(sizeof(IndexBuildResult));
	MemoryContext buildctx;
	MemoryContext old;
	BuildState	bs;
	GpuIvfpqMetaPageData meta;
	Buffer		metabuf;
	TimestampTz phase_start;

	if (RelationGetNumberOfBlocks(index) != 0)
		elog(ERROR, "index \"%s\" already contains data", RelationGetRelationName(index));

	/* Everything the build allocates, the engine model included, goes with this context. */
	GpuIvfpqCheckColumns(index);
	buildctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq build", ALLOCSET_DEFAULT_SIZES);
	old = MemoryContextSwitchTo(buildctx);
	memset(&bs, 0, sizeof(bs));
	bs.index = index;
	bs.metric = GpuIvfpqMetricOf(index);
	bs.format = GpuIvfpqIndexFormat(index);
	bs.keyed = GpuIvfpqHasFilterColumn(index);
	IndexOptions(index, &bs);
	CheckDeclaredDim(index, bs.format);
	bs.tmpctx = AllocSetContextCreate(buildctx, "gpu_ivfpq build row", ALLOCSET_DEFAULT_SIZES);
	pg_prng_seed(&bs.prng, BUILD_SEED);

	/* Block 0 is the metapage; it is rewritten once the build is complete. */
	InitMeta(&meta, bs.metric);
	if (bs.keyed)
		meta.features |= GPU_IVFPQ_FEATURE_FILTER;
	metabuf = GpuIvfpqNewBuffer(index, MAIN_FORKNUM);
	WriteMetaPage(index, &meta, metabuf);
	UnlockReleaseBuffer(metabuf);

	phase_start = GetCurrentTimestamp();
	SampleRows(&bs, heap, indexInfo);
	bs.keep_rows = false;
	ReportPhase(bs.rows != NULL ? "sampling (every row kept for encoding)" : "sampling",
				bs.sample_seen, &phase_start);
	meta.dimensions = bs.dim;
	if (bs.sample_n == 0)
	{
		/* Nothing to train on: an untrained index whose rows are searched exactly. */
		if (GpuIvfpqIsCitusShell(RelationGetRelid(heap)))
		{
			/*
			 * The shell of a Citus table is empty by design: Citus builds
			 * this index on every shard too, from the shard's rows, and
			 * queries read only the shards, so the NOTICE would ask for a
			 * REINDEX that cannot help. A shard that is itself empty says so
			 * from its own build (Citus passes such worker messages on at
			 * DEBUG1).
			 */
			ereport(DEBUG1,
					(errmsg("gpu_ivfpq index \"%s\" on the Citus table \"%s\" is left untrained",
							RelationGetRelationName(index), RelationGetRelationName(heap)),
					 errdetail("The table's rows are in its shards, whose copies of the index are trained on them.")));
		}
		else
			/* Not at every commit of an ON COMMIT DELETE ROWS table (GpuIvfpqRebuiltInPlace). */
			ereport(GpuIvfpqRebuiltInPlace(index) ? DEBUG1 : NOTICE,
					(errmsg("gpu_ivfpq index \"%s\" created on a table without vectors",
							RelationGetRelationName(index)),
					 errdetail("Until it is rebuilt, rows are kept unquantized in one list and every scan computes exact distances for all of them."),
					 errhint("REINDEX the index once the table holds data, to train its quantizers.")));
		meta.lists = 1;
		meta.m = 0;
		meta.trained = false;
	}
	else
	{
		/* Exact here: a table with fewer vectors than lists was sampled in full. */
		if (bs.vectors_estimate < bs.lists)
			ereport(NOTICE,
					(errmsg("gpu_ivfpq index \"%s\" has %.0f vectors for %d lists",
							RelationGetRelationName(index), bs.vectors_estimate, bs.lists),
					 errdetail("Some centroids repeat and their lists stay empty; results remain correct."),
					 errhint("Use lists of about sqrt(rows), or REINDEX once the table has grown.")));
		if (bs.rabitq)
			TrainRabitq(&bs, &meta, &phase_start);
		else
			TrainQuantizers(&bs, &meta, &phase_start);
	}
	meta.listdir_start = WriteEmptyListDir(index, meta.lists, &meta.listdir_pages);
	bs.meta = &meta;
	if (meta.trained)
		EncodeAndWrite(&bs, heap, indexInfo, &phase_start);

	meta.build_tuples = (uint64) bs.index_tuples;
	/*
	 * REINDEX and TRUNCATE rebuild in place of an older version: its mirror
	 * goes. Not at every commit of an ON COMMIT DELETE ROWS table: the
	 * commit before emptied the index already (and its mirror is keyed by
	 * its build).
	 */
	if (!GpuIvfpqRebuiltInPlace(index))
		GpuIvfpqServiceInvalidate(index, false);
	metabuf = ReadBuffer(index, GPU_IVFPQ_METAPAGE_BLKNO);
	LockBuffer(metabuf, BUFFER_LOCK_EXCLUSIVE);
	WriteMetaPage(index, &meta, metabuf);
	UnlockReleaseBuffer(metabuf);

	result->heap_tuples = bs.heap_tuples;
	result->index_tuples = bs.index_tuples;
	MemoryContextSwitchTo(old);
	MemoryContextDelete(buildctx);
	return result;
}

/* ambuildempty: the init fork of an unlogged index, an empty untrained index. */
void
gpuivfpqbuildempty(Relation index)
{
	PGAlignedBlock metablock;
	PGAlignedBlock dirblock;
	Page		metapage = (Page) metablock.data;
	Page		dirpage = (Page) dirblock.data;
	GpuIvfpqMetaPageData meta;
	GpuIvfpqListDirEntry entry;

	GpuIvfpqCheckColumns(index);
	InitMeta(&meta, GpuIvfpqMetricOf(index));
	if (GpuIvfpqHasFilterColumn(index))
		meta.features |= GPU_IVFPQ_FEATURE_FILTER;
	meta.lists = 1;
	meta.listdir_start = 1;
	meta.listdir_pages = 1;
	FormatMetaPage(metapage, &meta);

	entry.head = entry.insert_hint = InvalidBlockNumber;
	entry.radius = 0.0f;
	entry.qerror = 0.0f;
	GpuIvfpqInitPage(dirpage, GPU_IVFPQ_PAGE_LISTDIR);
	memcpy(PageGetContents(dirpage), &entry, sizeof(entry));
	((PageHeader) dirpage)->pd_lower += MAXALIGN(sizeof(entry));

	PageSetChecksumInplace(metapage, 0);
	PageSetChecksumInplace(dirpage, 1);
	smgrwrite(RelationGetSmgr(index), INIT_FORKNUM, 0, (char *) metapage, true);
	log_newpage(GpuIvfpqSmgrRelFile(index), INIT_FORKNUM, 0, metapage, true);
	smgrwrite(RelationGetSmgr(index), INIT_FORKNUM, 1, (char *) dirpage, true);
	log_newpage(GpuIvfpqSmgrRelFile(index), INIT_FORKNUM, 1, dirpage, true);
	smgrimmedsync(RelationGetSmgr(index), INIT_FORKNUM);
}

/* Names of the build phases for pg_stat_progress_create_index. */
char *
gpuivfpqbuildphasename(int64 phase)
{
	switch (phase)
	{
		case PROGRESS_CREATEIDX_SUBPHASE_INITIALIZE:
			return (char *) "initializing";
		case PHASE_SAMPLE:
			return (char *) "sampling table";
		case PHASE_TRAIN:
			return (char *) "training quantizers";
		case PHASE_ENCODE:
			return (char *) "assigning and encoding rows";
		case PHASE_WRITE:
			return (char *) "writing inverted lists";
		default:
			return NULL;
	}
}
