// Exact range search: every row within distance r of a query, with the lists
// pruned by their covering radius (a list whose centroid c has covering
// radius rc cannot hold a point within r of q when d(q, c) > rc + r, the
// List-of-Clusters test of "Multi-GPU metric-space range search") and by
// their Voronoi cell (the list's points are nearer to c than to q's nearest
// centroid). The candidates of the remaining lists are tested with exact
// distances from the heap, so nothing within r is missed and nothing outside
// is returned.
//
// The List of Clusters also stops early when the query ball lies inside a
// cluster ball, because there every point belongs to the first cluster that
// covers it. IVF lists are Voronoi cells (a point goes to its nearest
// centroid), so a later list can still hold answers: no early stop here.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/rerank.h"
#include "common/guard.h"
#include "engine/distances.h"
#include "engine/ivfpq.h"
#include "engine/pq.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "funcapi.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(gpu_ivfpq_range);
}

typedef struct RangeHit
{
	double		dist;
	ItemPointerData tid;
} RangeHit;

/*
 * Which lists can hold rows within radius of q. Radii are kept in the
 * model's space: L2 as is; cosine on the unit sphere, where cosine distance
 * r is Euclidean sqrt(2r). Inner product is not a metric: no list is pruned.
 */
static std::vector<bool>
ListsToProbe(const GpuIvfpqMetaPageData *meta, const GpuIvfpqListDirEntry *dir,
			 const gpuivfpq::IvfPqModel *model, int metric, const float *q, double radius,
			 int *pruned, std::vector<double> &adc_limit)
{
	std::vector<bool> probe(meta->lists, true);
	std::vector<float> qn(q, q + meta->dimensions);
	double		r;

	*pruned = 0;
	if (!meta->trained || metric == (int) gpuivfpq::Metric::InnerProduct)
		return probe;
	if (metric == (int) gpuivfpq::Metric::Cosine)
	{
		gpuivfpq::normalize_rows(qn.data(), 1, meta->dimensions);
		r = std::sqrt(2.0 * std::max(radius, 0.0));
	}
	else
		r = radius;

	uint32		d = meta->dimensions;
	const float *cent = model->centroids().data();
	std::vector<double> dq(meta->lists), cn(meta->lists);
	uint32		nearest = 0;
	double		qnorm = std::sqrt(std::inner_product(qn.begin(), qn.end(), qn.begin(), 0.0));

	for (uint32 l = 0; l < meta->lists; l++)
	{
		const float *c = cent + (size_t) l * d;
		double		s2 = 0.0;
		double		n2 = 0.0;

		for (uint32 j = 0; j < d; j++)
		{
			double		diff = (double) qn[j] - c[j];

			s2 += diff * diff;
			n2 += (double) c[j] * c[j];
		}
		dq[l] = std::sqrt(s2);
		cn[l] = std::sqrt(n2);
		if (dq[l] < dq[nearest])
			nearest = l;
	}
	for (uint32 l = 0; l < meta->lists; l++)
	{
		/*
		 * Covering radius: no point of the list within r when d(q, c) > rc + r.
		 * The stored radius comes from float32 distances (|x|^2 + |c|^2 -
		 * 2<x, c>), whose rounding grows with the norms: widen it by 1% of
		 * |c| + rc so that rounding never prunes a list that holds an answer.
		 */
		double		rc = dir[l].radius;

		rc += 0.01 * (cn[l] + rc);

		/*
		 * An entry whose decoded vector x' is farther than r + e from q
		 * (e: the list's largest ||x - x'||) cannot be within r. Its ADC
		 * distance is ||q - x'|| up to float rounding of squared norms, so
		 * widen the limit by a few thousandths of the norms involved.
		 */
		adc_limit[l] = r + 1.01 * dir[l].qerror + 0.003 * (qnorm + cn[l] + rc + r);
		if (dq[l] > rc + r)
		{
			probe[l] = false;
			(*pruned)++;
			continue;
		}

		/*
		 * Voronoi cell: the list holds the points nearer to its centroid c
		 * than to q's nearest centroid c1, a half-space whose distance from
		 * q is (d(q,c)^2 - d(q,c1)^2) / (2 d(c,c1)). Assignment in float32
		 * may put a point slightly on the wrong side: allow 1e-4 of the
		 * squared norms involved, divided the same way.
		 */
		if (l != nearest)
		{
			const float *c = cent + (size_t) l * d;
			const float *c1 = cent + (size_t) nearest * d;
			double		cc = 0.0;

			for (uint32 j = 0; j < d; j++)
			{
				double		diff = (double) c[j] - c1[j];

				cc += diff * diff;
			}
			cc = std::sqrt(cc);
			if (cc > 0.0)
			{
				double		h = (dq[l] * dq[l] - dq[nearest] * dq[nearest]) / (2.0 * cc);
				double		reach = std::max(cn[l], cn[nearest]) + rc + dq[l] + r;
				double		slack = 1e-4 * reach * reach / (2.0 * cc);

				if (h > r + slack)
				{
					probe[l] = false;
					(*pruned)++;
				}
			}
		}
	}
	return probe;
}

/* gpu_ivfpq_range(index, query, radius, max_rows): (tid, distance) of every row within radius. */
Datum
gpu_ivfpq_range(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	ArrayType  *qarr = PG_GETARG_ARRAYTYPE_P(1);
	double		radius = PG_GETARG_FLOAT8(2);
	int32		max_rows = PG_GETARG_INT32(3);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Relation	index;
	Relation	heap;
	GpuIvfpqMetaPageData meta;
	GpuIvfpqListDirEntry *dir;
	gpuivfpq::IvfPqModel *model = NULL;
	int			metric;
	int			dim;
	const float *q;
	std::vector<bool> probe;
	std::vector<double> adc_limit;
	gpuivfpq::IvfPqQuery *prepared = NULL;
	bool		use_adc = false;
	float	   *table = NULL;
	float	   *dists = NULL;
	int64		entries_read = 0;
	int			pruned = 0;
	int64		candidates = 0;
	RangeHit   *hits;
	int64		nhits = 0;
	int64		cap = 1024;
	ItemPointerData *tids;
	int64		ntids = 0;
	int64		tcap = 1024;
	int			m;
	int			esz;
	GpuIvfpqHeapFetch hf;

	if (std::isnan(radius))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("radius must be a number, not NaN")));
	if (max_rows < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_rows must be 0 (no limit) or positive, not %d", max_rows)));
	InitMaterializedSRF(fcinfo, 0);
	index = GpuIvfpqOpenIndex(indexoid);
	heap = table_open(index->rd_index->indrelid, AccessShareLock);
	metric = GpuIvfpqMetricOf(index);
	/* Negative inner products make negative <#> values: only metrics need r >= 0. */
	if (radius < 0 && metric != (int) gpuivfpq::Metric::InnerProduct)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("radius must be a non-negative number, not %g", radius),
				 errhint("Only inner-product indexes (real_ip_ops) take negative radii.")));
	q = GpuIvfpqArrayVector(qarr, &dim, "query vector");
	GpuIvfpqReadMeta(index, &meta);
	if (meta.dimensions != 0 && (uint32) dim != meta.dimensions)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("query vector has %d dimensions, the index \"%s\" has %u",
						dim, RelationGetRelationName(index), meta.dimensions)));
	dir = GpuIvfpqReadListDir(index, &meta);
	if (meta.trained)
		model = GpuIvfpqGetModel(index, &meta);
	adc_limit.assign(meta.lists, std::numeric_limits<double>::infinity());
	GpuIvfpqGuard("range pruning", [&] {
		probe = ListsToProbe(&meta, dir, model, metric, q, radius, &pruned, adc_limit);
	});
	/* ADC filtering needs the quantization errors, kept by newer builds. */
	use_adc = meta.trained && (meta.features & GPU_IVFPQ_FEATURE_QERROR) &&
		metric != (int) gpuivfpq::Metric::InnerProduct;
	if (use_adc)
		GpuIvfpqGuard("query preparation", [&] {
			prepared = new gpuivfpq::IvfPqQuery();
			model->prepare_query(q, meta.lists, *prepared);
		});

	/* Every entry of the lists that may hold answers. */
	m = meta.trained ? meta.m : 0;
	esz = GpuIvfpqEntrySize(m);
	tids = (ItemPointerData *) palloc(sizeof(ItemPointerData) * tcap);
	if (use_adc)
	{
		table = (float *) palloc(sizeof(float) * m * 256);
		dists = (float *) palloc(sizeof(float) * GpuIvfpqEntriesPerPage(m));
	}
	PG_TRY();
	{
		for (uint32 p = 0; p < meta.lists; p++)
		{
			/* With ADC, lists in the prepared query's order (its tables are per probe). */
			uint32		l = use_adc ? (uint32) prepared->lists[p] : p;
			BlockNumber blk = probe[l] ? dir[l].head : InvalidBlockNumber;
			float		base = 0.0f;
			float		limit2 = 0.0f;

			if (use_adc && blk != InvalidBlockNumber)
				GpuIvfpqGuard("lookup tables", [&] {
					model->list_table(*prepared, p, table, &base);
					limit2 = (float) (adc_limit[l] * adc_limit[l]);
				});
			if (blk == InvalidBlockNumber)
				continue;
			GpuIvfpqWalkList(index, blk, m, [&](const char *ent, int n) {
				entries_read += n;
				if (ntids + n > tcap)
				{
					tcap = Max(tcap * 2, ntids + n);
					tids = (ItemPointerData *) repalloc_huge(tids, sizeof(ItemPointerData) * tcap);
				}
				if (use_adc)
					GpuIvfpqGuard("list scan", [&] {
						gpuivfpq::adc_scan((const uint8 *) ent + GPU_IVFPQ_TID_BYTES, n, esz, table, m,
										   base, dists);
					});
				for (int i = 0; i < n; i++)
					if (!use_adc || dists[i] <= limit2)
						memcpy(&tids[ntids++], ent + (Size) i * esz, GPU_IVFPQ_TID_BYTES);
			});
		}
	}
	PG_CATCH();
	{
		delete prepared;
		PG_RE_THROW();
	}
	PG_END_TRY();
	GpuIvfpqGuard("cleanup", [&] { delete prepared; });
	candidates = ntids;

	/* Exact test of each visible row, in heap order. */
	std::sort(tids, tids + ntids, [](const ItemPointerData &a, const ItemPointerData &b) {
		return ItemPointerCompare((ItemPointer) &a, (ItemPointer) &b) < 0;
	});
	hits = (RangeHit *) palloc(sizeof(RangeHit) * cap);
	GpuIvfpqHeapFetchBegin(&hf, heap, index, GetActiveSnapshot());
	for (int64 i = 0; i < ntids; i++)
	{
		int			vdim;
		const float *v;

		if (i > 0 && ItemPointerEquals(&tids[i], &tids[i - 1]))
			continue;
		v = GpuIvfpqHeapFetchVector(&hf, &tids[i], &vdim);
		if (v != NULL && vdim == dim)
		{
			double		d = GpuIvfpqExactDistance(metric, q, v, dim);

			if (d <= radius)
			{
				if (nhits == cap)
				{
					cap *= 2;
					hits = (RangeHit *) repalloc_huge(hits, sizeof(RangeHit) * cap);
				}
				hits[nhits].dist = d;
				hits[nhits].tid = tids[i];
				nhits++;
			}
		}
		CHECK_FOR_INTERRUPTS();
	}
	GpuIvfpqHeapFetchEnd(&hf);

	std::sort(hits, hits + nhits, [](const RangeHit &a, const RangeHit &b) {
		if (a.dist != b.dist)
			return a.dist < b.dist;
		return ItemPointerCompare((ItemPointer) &a.tid, (ItemPointer) &b.tid) < 0;
	});
	if (max_rows > 0 && nhits > max_rows)
		nhits = max_rows;
	for (int64 i = 0; i < nhits; i++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = PointerGetDatum(&hits[i].tid);
		values[1] = Float8GetDatum(hits[i].dist);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	elog(DEBUG1, "gpu_ivfpq range search on \"%s\": %u of %u lists pruned (covering radius, Voronoi cell), %lld entries read, %lld candidates tested (%s), %lld rows returned",
		 RelationGetRelationName(index), (unsigned) pruned, meta.lists, (long long) entries_read,
		 (long long) candidates, use_adc ? "after the ADC bound" : "all", (long long) nhits);
	table_close(heap, AccessShareLock);
	relation_close(index, AccessShareLock);
	PG_RETURN_VOID();
}
