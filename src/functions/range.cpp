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
#include <numeric>
#include <vector>

#include "common/guard.h"
#include "common/rerank.h"
#include "functions/queries.h"
#include "engine/distances.h"
#include "engine/interrupt.h"
#include "engine/ivfpq.h"
#include "engine/rabitq.h"
#include "engine/pq.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "funcapi.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(gpu_ivfpq_range);
}

/*
 * Which lists can hold rows within radius of q (probe[l]), and for each the
 * largest ADC distance an answer can have (adc_limit[l]). Radii are kept in
 * the model's space: L2 as is; cosine on the unit sphere, where cosine
 * distance r is Euclidean sqrt(2r). Inner product is not a metric: no list
 * is pruned. Engine code only (run under the guard): the caller owns the
 * arrays, so nothing here outlives an error.
 */
static void
ListsToProbe(const GpuIvfpqMetaPageData *meta, const GpuIvfpqListDirEntry *dir,
			 const float *cent, int metric, const float *q, double radius,
			 bool *probe, double *adc_limit, int *pruned)
{
	std::vector<float> qn(q, q + meta->dimensions);
	double		r;

	*pruned = 0;
	std::fill(probe, probe + meta->lists, true);
	std::fill(adc_limit, adc_limit + meta->lists, get_float8_infinity());
	if (!meta->trained || metric == (int) gpuivfpq::Metric::InnerProduct)
		return;
	if (metric == (int) gpuivfpq::Metric::Cosine)
	{
		gpuivfpq::normalize_rows(qn.data(), 1, meta->dimensions);
		r = std::sqrt(2.0 * std::max(radius, 0.0));
	}
	else
		r = radius;

	uint32		d = meta->dimensions;
	std::vector<double> dq(meta->lists), cn(meta->lists);
	uint32		nearest = 0;
	double		qnorm = std::sqrt(std::inner_product(qn.begin(), qn.end(), qn.begin(), 0.0));

	for (uint32 l = 0; l < meta->lists; l++)
	{
		const float *c = cent + (size_t) l * d;
		double		s2 = 0.0;
		double		n2 = 0.0;

		/* Up to 65536 lists of 16000 dimensions, twice: a cancel is heard (under the guard). */
		gpuivfpq::check_interrupt();

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

		gpuivfpq::check_interrupt();
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
}

/*
 * Re-ranks the candidates in cand (then empties it): the visible rows within
 * the radius go to sorted. hits grows to cand's size.
 */
static void
RangeRerankRound(GpuIvfpqHeapFetch *hf, const GpuIvfpqRerankSpec *spec, GpuIvfpqLabels *cand,
				 GpuIvfpqHit **hits, int64 *hits_cap, GpuIvfpqHitSort *sorted, int64 *tested)
{
	int64		nh;

	if (cand->n == 0)
		return;
	if (*hits_cap < cand->n)
	{
		if (*hits != NULL)
			pfree(*hits);
		*hits_cap = cand->cap;
		*hits = (GpuIvfpqHit *) palloc_extended(sizeof(GpuIvfpqHit) * *hits_cap, MCXT_ALLOC_HUGE);
	}
	nh = GpuIvfpqRerank(hf, spec, cand->labels, cand->n, *hits, NULL);
	for (int64 i = 0; i < nh; i++)
		GpuIvfpqHitSortPut(sorted, &(*hits)[i]);
	*tested += cand->n;
	cand->n = 0;
}

/* gpu_ivfpq_range(index, query, radius, max_rows): (tid, distance) of every row within radius. */
Datum
gpu_ivfpq_range(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	double		radius = PG_GETARG_FLOAT8(2);
	int32		max_rows = PG_GETARG_INT32(3);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Relation	index;
	Relation	heap;
	GpuIvfpqMetaPageData meta;
	GpuIvfpqListDirEntry *dir;
	gpuivfpq::IvfPqModel *model = NULL;
	const float *centroids = NULL;
	gpuivfpq::IvfPqQuery *prepared = NULL;
	int			metric;
	int			dim;
	const float *q;
	bool	   *probe;
	double	   *adc_limit;
	bool		use_adc;
	float	   *table = NULL;
	int64		entries_read = 0;
	int			pruned = 0;
	GpuIvfpqLabels cand = {NULL, 0, 0};
	GpuIvfpqHit *hits = NULL;
	int64		hits_cap = 0;
	int64		round;
	int64		tested = 0;
	int64		nhits;
	GpuIvfpqHit hit;
	GpuIvfpqHitSort *sorted;
	GpuIvfpqHeapFetch hf;
	GpuIvfpqRerankSpec spec;

	if (std::isnan(radius))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("radius must be a number, not NaN")));
	if (max_rows < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_rows must be 0 (no limit) or positive, not %d", max_rows)));
	InitMaterializedSRF(fcinfo, 0);
	GpuIvfpqOpenIndexChecked(indexoid, "gpu_ivfpq", "gpu_ivfpq_range", true, &index, &heap);
	metric = GpuIvfpqMetricOf(index);
	/* Negative inner products make negative <#> values: only metrics need r >= 0. */
	if (radius < 0 && metric != (int) gpuivfpq::Metric::InnerProduct)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("radius must be a non-negative number, not %g", radius),
				 errhint("Only inner-product indexes (real_ip_ops, vector_ip_ops, halfvec_ip_ops) take negative radii.")));
	q = GpuIvfpqQueryVector(fcinfo, 1, &dim);
	GpuIvfpqReadMeta(index, &meta);
	if (meta.dimensions != 0 && (uint32) dim != meta.dimensions)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("query vector has %d dimensions, the index \"%s\" has %u",
						dim, RelationGetRelationName(index), meta.dimensions)));
	dir = GpuIvfpqReadListDir(index, &meta);
	/* The list centroids, of either kind of codes (RaBitQ codes: no ADC bound, below). */
	if (GpuIvfpqIsRabitq(&meta))
		centroids = GpuIvfpqGetRabitqModel(index, &meta)->centroids().data();
	else if (meta.trained)
	{
		model = GpuIvfpqGetModel(index, &meta);
		GpuIvfpqModelTables(model);
		centroids = model->centroids().data();
	}
	probe = (bool *) palloc(sizeof(bool) * meta.lists);
	adc_limit = (double *) palloc(sizeof(double) * meta.lists);
	GpuIvfpqGuard("range pruning", [&] {
		ListsToProbe(&meta, dir, centroids, metric, q, radius, probe, adc_limit, &pruned);
	});
	/* ADC filtering needs the quantization errors, kept by newer builds. */
	use_adc = meta.trained && (meta.features & GPU_IVFPQ_FEATURE_QERROR) &&
		metric != (int) gpuivfpq::Metric::InnerProduct;
	if (use_adc)
	{
		prepared = GpuIvfpqMakeOwned<gpuivfpq::IvfPqQuery>(CurrentMemoryContext, "query preparation");
		GpuIvfpqGuard("query preparation", [&] { model->prepare_query(q, meta.lists, *prepared); });
		table = (float *) palloc(sizeof(float) * meta.m * 256);
	}

	/*
	 * The entries of the lists that may hold answers (within the ADC bound
	 * if known), re-ranked in rounds of at most `round` candidates (about
	 * work_mem of labels and hits) whose rows within the radius go to a
	 * sort by (distance, TID): a radius that takes in the whole index holds
	 * work_mem, not memory in proportion to the index, and max_rows bounds
	 * the sort (tuplesort's bounded heap).
	 */
	round = Max((int64) work_mem * 1024 / (int64) (sizeof(int64) + sizeof(GpuIvfpqHit)), (int64) 1024);
	memset(&spec, 0, sizeof(spec));
	spec.metric = metric;
	spec.query = q;
	spec.dim = dim;
	spec.bounded = true;
	spec.radius = radius;
	sorted = GpuIvfpqHitSortBegin(max_rows);
	GpuIvfpqHeapFetchBegin(&hf, heap, index, GetActiveSnapshot());
	for (uint32 p = 0; p < meta.lists; p++)
	{
		/* With ADC, lists in the prepared query's order (its tables are per probe). */
		uint32		l = use_adc ? (uint32) prepared->lists[p] : p;
		GpuIvfpqAdcBound bound;
		GpuIvfpqChainCursor cur;

		if (!probe[l] || dir[l].head == InvalidBlockNumber)
			continue;
		if (use_adc)
		{
			/*
			 * Asked again per list: the heap fetches of a round (an index
			 * expression's own queries among them) may have evicted it.
			 */
			model = GpuIvfpqGetModel(index, &meta);
			GpuIvfpqModelTables(model);
			GpuIvfpqGuard("lookup tables", [&] { model->list_table(*prepared, p, table, &bound.base); });
			bound.table = table;
			bound.limit = (float) (adc_limit[l] * adc_limit[l]);
		}
		GpuIvfpqChainCursorInit(&cur, dir[l].head);
		while (cur.next != InvalidBlockNumber)
		{
			entries_read += GpuIvfpqCollectPages(index, &meta, &cur, use_adc ? &bound : NULL, NULL, &cand, round);
			if (cand.n >= round)
				RangeRerankRound(&hf, &spec, &cand, &hits, &hits_cap, sorted, &tested);
		}
	}
	RangeRerankRound(&hf, &spec, &cand, &hits, &hits_cap, sorted, &tested);
	GpuIvfpqHeapFetchEnd(&hf);

	/* Nearest first; a row met twice (only a corrupt index lists a TID twice) once. */
	nhits = 0;
	while ((max_rows == 0 || nhits < max_rows) && GpuIvfpqHitSortNext(sorted, &hit))
	{
		Datum		values[2];
		bool		nulls[2] = {false, false};

		values[0] = PointerGetDatum(&hit.tid);
		values[1] = Float8GetDatum(hit.dist);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		nhits++;
	}
	GpuIvfpqHitSortEnd(sorted);
	elog(DEBUG1, "gpu_ivfpq range search on \"%s\": %u of %u lists pruned (covering radius, Voronoi cell), %lld entries read, %lld candidates tested (%s), %lld rows returned",
		 RelationGetRelationName(index), (unsigned) pruned, meta.lists, (long long) entries_read,
		 (long long) tested, use_adc ? "after the ADC bound" : "all", (long long) nhits);
	table_close(heap, AccessShareLock);
	relation_close(index, AccessShareLock);
	PG_RETURN_VOID();
}
