// Indexes with RaBitQ codes (codes = rabitq): their entries' layout, the
// encoding of rows into entries, and the CPU engine's ranking of the probed
// lists by the codes' distance estimates (docs/rabitq-codes.md). Scans
// re-rank the candidates from the heap: such an index keeps no vectors.
#include "am/am.h"
#include "common/guard.h"

#include "engine/rabitq.h"
#include "engine/topk.h"

StaticAssertDecl(GPU_IVFPQ_RABITQ_MAX_DIM == (int) gpuivfpq::kRabitqMaxDims,
				 "the AM's RaBitQ dimension limit is the engine's");
StaticAssertDecl(sizeof(gpuivfpq::RabitqFactors) == 3 * sizeof(float4),
				 "an entry's factors are three float4");

/*
 * Bytes of one entry's code in an index with RaBitQ codes of bits per
 * dimension: the bit planes, then the factors (meta->m).
 */
int
GpuIvfpqRabitqRowBytes(int dim, int bits)
{
	return (int) gpuivfpq::rabitq_row_bytes((size_t) dim, bits);
}

/* Errors unless RaBitQ codes can index vectors of dim dimensions. */
void
GpuIvfpqRabitqCheckDim(Relation index, int dim)
{
	if (dim > GPU_IVFPQ_RABITQ_MAX_DIM)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("gpu_ivfpq index \"%s\" with codes = rabitq takes vectors of up to %d dimensions, not %d",
						RelationGetRelationName(index), GPU_IVFPQ_RABITQ_MAX_DIM, dim),
				 errhint("Use codes = pq for vectors of more dimensions.")));
}

/*
 * Assigns n rows to their nearest lists and encodes them (unless encoded:
 * the GPU did both, lists and codes hold its answer): codes gets each row's
 * entry code (GpuIvfpqRabitqRowBytes: bit planes, then factors), radius
 * each row's distance to its list's centroid (normalised for Cosine: the
 * lists' covering radii, for range search; 0 for inner product, which
 * prunes no list), from its factors.
 */
void
GpuIvfpqRabitqEncode(const gpuivfpq::RabitqModel *model, const float *x, int n, int32 *lists,
					 uint8 *codes, float *radius, int threads, bool encoded)
{
	size_t		cb = model->code_bytes();
	size_t		rb = cb + sizeof(gpuivfpq::RabitqFactors);

	if (!encoded)
		GpuIvfpqGuard("encoding", [&] {
			model->assign(x, (size_t) n, lists, threads);
			model->encode_rows(x, (size_t) n, lists, codes, threads);
		});
	for (int i = 0; i < n; i++)
	{
		gpuivfpq::RabitqFactors f;

		memcpy(&f, codes + (Size) i * rb + cb, sizeof(f));
		/* add is ||x - c||^2 for L2 and Cosine (<c, x - c> for inner product). */
		radius[i] = model->metric() == gpuivfpq::Metric::InnerProduct ? 0.0f
			: sqrtf(Max(f.add, 0.0f));
	}
}

/*
 * The CPU engine's candidates in an index with RaBitQ codes: ranks every
 * entry of the probes lists nearest to query by the lower bound of its
 * code's distance estimate (RabitqModel::scan_keys at kRabitqLowerEps0, as
 * the GPU ranks them) through topk (emptied again on return) and writes the
 * best labels, lowest bound first, to labels and their bounds to lower
 * (room for topk->k() each); *nlabels says how many. With range, only
 * entries whose filter key lies in it are ranked. Returns how many entries
 * those lists hold (within range). The caller re-ranks the labels with
 * exact distances from the heap, in that order (GpuIvfpqRerankBoundedBatch;
 * index scans fetch theirs lazily).
 */
int64
GpuIvfpqRabitqRankLists(Relation index, const GpuIvfpqMetaPageData *meta, const GpuIvfpqListDirEntry *dir,
						const float *query, int probes, const GpuIvfpqKeyRange *range,
						gpuivfpq::TopK *topk, int64 *labels, double *lower, int *nlabels)
{
	gpuivfpq::RabitqModel *model = GpuIvfpqGetRabitqModel(index, meta);
	GpuIvfpqEntryLayout el = GpuIvfpqLayoutOf(meta);
	int			capacity = GpuIvfpqEntriesPerPage(&el);
	size_t		cb = model->code_bytes();
	MemoryContext roundctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq RaBitQ round",
												   ALLOCSET_SMALL_SIZES);
	MemoryContext old = MemoryContextSwitchTo(roundctx);
	gpuivfpq::RabitqQuery *q = GpuIvfpqMakeOwned<gpuivfpq::RabitqQuery>(roundctx, "query preparation");
	gpuivfpq::RabitqListQuery *lq = GpuIvfpqMakeOwned<gpuivfpq::RabitqListQuery>(roundctx, "query preparation");
	gpuivfpq::RabitqFactors *factors = (gpuivfpq::RabitqFactors *)
		palloc(sizeof(gpuivfpq::RabitqFactors) * capacity);
	float	   *est = (float *) palloc(sizeof(float) * capacity);
	int32	   *probed = (int32 *) palloc(sizeof(int32) * Max(probes, 1));
	int			nprobed = 0;
	int64		seen = 0;

	if (range != NULL && !el.keyed)
		elog(ERROR, "gpu_ivfpq: filter range on an index without filter keys");
	GpuIvfpqGuard("query preparation", [&] {
		model->prepare_query(query, *q);
		for (int32_t l : model->probe_lists(*q, (size_t) Max(probes, 1)))
			probed[nprobed++] = l;
	});
	for (int p = 0; p < nprobed; p++)
	{
		int			list = probed[p];

		if (dir[list].head == InvalidBlockNumber)
			continue;
		if (p + 1 < nprobed && dir[probed[p + 1]].head != InvalidBlockNumber)
			GpuIvfpqPrefetchHinted(index, dir[probed[p + 1]].head);
		GpuIvfpqGuard("lookup tables", [&] { model->prepare_list(*q, list, *lq); });
		GpuIvfpqWalkListHinted(index, dir[list].head, &el, true, [&](const char *ent, int n, BlockNumber) {
			/* The factors follow each code, unaligned on the page: copied out. */
			for (int i = 0; i < n; i++)
				memcpy(&factors[i], GpuIvfpqEntryCode(ent, i, &el) + cb, sizeof(gpuivfpq::RabitqFactors));
			GpuIvfpqGuard("list scan", [&] {
				model->scan_keys(*lq, GpuIvfpqEntryCode(ent, 0, &el), (size_t) el.size, factors, (size_t) n,
								 gpuivfpq::kRabitqLowerEps0, est);
			});
			for (int i = 0; i < n; i++)
			{
				if (!GpuIvfpqEntryInRange(ent, i, &el, range))
					continue;
				seen++;
				if (!(est[i] < topk->threshold()))
					continue;
				GpuIvfpqGuard("list scan", [&] { topk->push(est[i], GpuIvfpqEntryLabel(ent, i, &el)); });
			}
		});
	}
	*nlabels = 0;
	GpuIvfpqGuard("k-selection", [&] {
		for (const auto &nb : topk->take_sorted())
		{
			labels[*nlabels] = nb.label;
			lower[(*nlabels)++] = nb.dist;
		}
	});
	MemoryContextSwitchTo(old);
	MemoryContextDelete(roundctx);
	return seen;
}

/*
 * What is wrong with the entry code of an index with RaBitQ codes (NULL:
 * nothing): a padding bit set past the dimensions in a bit plane, or a
 * factor no encoding writes (NaN; a negative rescale or error bound).
 */
const char *
GpuIvfpqRabitqCodeProblem(const GpuIvfpqMetaPageData *meta, const uint8 *code)
{
	size_t		d = meta->dimensions;
	size_t		plane = gpuivfpq::rabitq_plane_words(d) * 4;
	size_t		cb = gpuivfpq::rabitq_code_bytes(d, meta->nbits);
	gpuivfpq::RabitqFactors f;

	/* Bit i of a plane is bit i % 8 of its byte i / 8 (little-endian words). */
	for (int p = 0; p < meta->nbits; p++)
	{
		const uint8 *bytes = code + (Size) p * plane;

		if (d % 8 != 0 && (bytes[d / 8] >> (d % 8)) != 0)
			return "a bit set past the dimensions in its code";
		for (size_t b = (d + 7) / 8; b < plane; b++)
			if (bytes[b] != 0)
				return "a bit set past the dimensions in its code";
	}
	memcpy(&f, code + cb, sizeof(f));
	if (isnan(f.add) || !(f.rescale >= 0.0f) || !(f.error >= 0.0f))
		return "factors that no encoding writes";
	return NULL;
}
