// Exact brute-force k-NN over a table column, without an ANN index: the rows
// visible to the caller's snapshot are read in chunks, each chunk searched
// by the GPU service's fused GEMM + k-selection kernel (or the CPU engine's
// brute force), and the per-chunk winners merged with exact distances. Also
// the ground truth for recall measurements.
#include <algorithm>
#include <cfloat>

#include "functions/batch_search.h"
#include "service/service.h"
#include "common/guard.h"
#include "engine/ivfpq.h"
#include "engine/topk.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/genam.h"
#include "access/htup_details.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "executor/tuptable.h"
#include "funcapi.h"
#include "storage/predicate.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(gpu_ivfpq_exact_knn);
}

#define EXACT_CHUNK_BYTES (32 * 1024 * 1024)
/*
 * The queries' running best (k hits each), the kernels' answers (2k + 16
 * floats and labels each) and the queries moved for ranking take at most
 * this much: more queries are answered a block at a time, each block one
 * pass over the table.
 */
#define EXACT_BEST_BYTES (64 * 1024 * 1024)
#define MIRROR_CHUNK_BYTES (32 * 1024 * 1024)	/* per GPU request on the mirror path */

static int
ParseMetric(const char *name)
{
	if (strcmp(name, "l2") == 0)
		return (int) gpuivfpq::Metric::L2;
	if (strcmp(name, "ip") == 0)
		return (int) gpuivfpq::Metric::InnerProduct;
	if (strcmp(name, "cosine") == 0)
		return (int) gpuivfpq::Metric::Cosine;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unknown metric \"%s\"", name),
			 errhint("Use \"l2\" (<->), \"ip\" (<#>) or \"cosine\" (<=>).")));
	return 0;
}

/* Enters h into a query's running best b (at most k, *held of them), in order. */
static void
KeepBest(GpuIvfpqHit *b, int *held, int k, const GpuIvfpqHit *h)
{
	int			at;

	if (*held == k && !GpuIvfpqHitLess(*h, b[k - 1]))
		return;
	/* Its place by binary search, the worse ones moved down one. */
	at = (int) (std::upper_bound(b, b + *held, *h, GpuIvfpqHitLess) - b);
	if (*held < k)
		(*held)++;
	memmove(b + at + 1, b + at, sizeof(GpuIvfpqHit) * (*held - 1 - at));
	b[at] = *h;
}

/*
 * Merges a chunk's n hits of a query (cand, sorted here) with its running
 * best b (at most k, held of them, in order) into tmp (room for k); returns
 * how many tmp holds. b is left as it was.
 */
static int
MergeBest(const GpuIvfpqHit *b, int held, int k, GpuIvfpqHit *cand, int n, GpuIvfpqHit *tmp)
{
	int			i = 0,
				j = 0,
				out = 0;

	GpuIvfpqSortHits(cand, n);
	while (out < k && (i < held || j < n))
	{
		if (j >= n || (i < held && !GpuIvfpqHitLess(cand[j], b[i])))
			tmp[out++] = b[i++];
		else
			tmp[out++] = cand[j++];
	}
	return out;
}

/* Whether one of the n vectors (d floats each) is too long for float ranking. */
static bool
AnyUnranked(const float *x, int64 n, int d)
{
	for (int64 i = 0; i < n; i++)
		if (!gpuivfpq::ivfpq_ranks_query(x + i * d, (size_t) d))
			return true;
	return false;
}

/* The squared norm of x, in double (four independent sums: no chain of d dependent adds). */
static double
NormSqr(const float *x, int d)
{
	double		s[4] = {0.0, 0.0, 0.0, 0.0};
	int			j = 0;

	for (; j + 4 <= d; j += 4)
		for (int t = 0; t < 4; t++)
			s[t] += (double) x[j + t] * x[j + t];
	for (; j < d; j++)
		s[0] += (double) x[j] * x[j];
	return (s[0] + s[1]) + (s[2] + s[3]);
}

/*
 * How far the kernels' float ranking value of a row (|q|^2 + |b|^2 - 2 q.b
 * for L2, -q.b, 1 - q.b / (|q| |b|)) can lie from the true one, for a query
 * of squared norm qsq against rows of squared norm at most bsq: d products
 * summed in float err by at most about d units of float rounding of the
 * terms' magnitude (doubled, and a few more for the norms and the
 * normalisation, as a safe margin).
 */
static double
RankSlack(int metric, int d, double qsq, double bsq)
{
	double		g = (double) (d + 16) * ldexp(1.0, -23);
	/*
	 * Products below the normal float range lose up to FLT_MIN each (a
	 * device that flushes them to zero), whatever the norms: an absolute
	 * term, or data of 1e-23 would be certified on rounding alone.
	 */
	double		tiny = (double) (4 * d + 32) * FLT_MIN;

	if (metric == (int) gpuivfpq::Metric::L2)
		return 2.0 * g * (qsq + bsq) + tiny;
	if (metric == (int) gpuivfpq::Metric::InnerProduct)
		return g * sqrt(qsq * bsq) + tiny;
	return 8.0 * g + tiny;
}

/*
 * Cosine is ranked from the raw norms on the GPU (1 - q.b / sqrt(|q|^2
 * |b|^2)): a product of squared norms that leaves the float range ranks
 * the row at 1 whatever its angle. Norms within [2^-50, 2^50] keep it in
 * range; others are not certified.
 */
static bool
CosineRankable(double nsq)
{
	return nsq >= ldexp(1.0, -50) && nsq <= ldexp(1.0, 50);
}

/*
 * The least distance (as the operators compute it, in double) of a row whose
 * float ranking value is at least score.
 */
static double
LeastDistance(int metric, double score, double slack)
{
	double		v = score - slack;

	if (metric == (int) gpuivfpq::Metric::L2)
		v = v > 0.0 ? sqrt(v) : 0.0;
	/* the double sum's own rounding, far below this */
	return v - 1e-9 * fabs(v) - 1e-300;
}

/*
 * Searches one chunk of base rows and merges its k best into each query's
 * running best (best: nq x k, counts: how many held).
 *
 * The kernels (GPU or CPU) rank in float32 and return each query's kk
 * best, kk = 2k + 16 where the chunk has more rows; those get their exact
 * distances. Float ranking is only a filter, and a lossy one: for L2 it
 * takes |q|^2 + |b|^2 - 2 q.b, which loses every digit of a distance small
 * against the norms (points 1e-4 apart at coordinates near 100 rank at
 * random). So for L2 the chunk and the queries are first moved by the
 * chunk's mean where it lies far off the origin against the data's spread
 * (distances do not change, the norms shrink to that spread), and each
 * query's result is certified: a row the kernel left
 * out ranked no better than the kk-th, so its distance is at least that
 * value less the ranking's rounding bound (RankSlack); when that exceeds
 * the query's k-th exact distance after the merge, nothing left out can
 * enter its k best. Otherwise (ties at the k-th, near-duplicates beyond
 * float's resolution, a chunk too spread for it) the query's k best of the
 * chunk are taken from the exact distances of every row. A chunk whose rows
 * or queries are too long for float ranking at all (their distances
 * overflow it: gpuivfpq::kMaxRankedNormSqr) is searched that way for every
 * query.
 *
 * work: room for (nq + n) x d floats; qsq: for nq doubles; scratch: for
 * kk + k hits.
 */
static void
SearchChunk(const float *queries, int64 nq, const float *base, const ItemPointerData *tids, int64 n,
			int d, int metric, int k, GpuIvfpqHit *best, int *counts, float *dist, int64 *labels,
			GpuIvfpqHit *scratch, float *work, double *qsq, int64 *gpu_chunks, int64 *exact_queries)
{
	int			kk = (int) Min((int64) 2 * k + 16, n);
	const float *kq = queries;
	const float *kb = base;
	double		bsq = 0.0;
	bool		all_exact = false;

	/* The rows' squared norms (what ranking must not overflow: NaN fails too), and for L2 their mean. */
	{
		double	   *mean = metric == (int) gpuivfpq::Metric::L2 ? (double *) palloc0(sizeof(double) * d) : NULL;
		double		sumsq = 0.0;

		for (int64 i = 0; i < n; i++)
		{
			const float *x = base + i * d;
			double		v = NormSqr(x, d);

			all_exact |= !(v <= gpuivfpq::kMaxRankedNormSqr);
			all_exact |= metric == (int) gpuivfpq::Metric::Cosine && !CosineRankable(v);
			bsq = Max(bsq, v);
			sumsq += v;
			if (mean != NULL)
				for (int j = 0; j < d; j++)
					mean[j] += x[j];
		}

		/*
		 * Moved by the mean only where it matters: when the mean's norm
		 * exceeds the rows' spread about it (sumsq / n - |mean|^2) four
		 * times over, the norms (and the rounding with them) shrink five
		 * times at least; data about the origin, or spread wider than it
		 * lies off it, skips the two passes.
		 */
		if (mean != NULL && !all_exact)
		{
			double		msq = 0.0;

			for (int j = 0; j < d; j++)
			{
				mean[j] /= (double) n;
				msq += mean[j] * mean[j];
			}
			if (msq > 4.0 * (sumsq / (double) n - msq))
			{
				float	   *cq = work;
				float	   *cb = work + nq * d;

				bsq = 0.0;
				for (int64 i = 0; i < n; i++)
				{
					for (int j = 0; j < d; j++)
						cb[i * d + j] = (float) ((double) base[i * d + j] - mean[j]);
					bsq = Max(bsq, NormSqr(cb + i * d, d));
				}
				for (int64 q = 0; q < nq; q++)
					for (int j = 0; j < d; j++)
						cq[q * d + j] = (float) ((double) queries[q * d + j] - mean[j]);
				kq = cq;
				kb = cb;
				all_exact |= !(bsq <= gpuivfpq::kMaxRankedNormSqr);
			}
		}
		if (mean != NULL)
			pfree(mean);
	}
	for (int64 q = 0; q < nq && !all_exact; q++)
	{
		qsq[q] = NormSqr(kq + q * d, d);
		all_exact = !(qsq[q] <= gpuivfpq::kMaxRankedNormSqr) ||
			(metric == (int) gpuivfpq::Metric::Cosine && !CosineRankable(qsq[q]));
	}
	if (!all_exact)
	{
		if (GpuIvfpqServiceExact(kq, nq, kb, n, d, metric, kk, dist, labels))
			(*gpu_chunks)++;
		else
			GpuIvfpqGuard("exact search", [&] {
				gpuivfpq::brute_force_knn(kq, nq, kb, n, d, (gpuivfpq::Metric) metric, kk, dist,
										  labels);
			});
	}
	for (int64 q = 0; q < nq; q++)
	{
		GpuIvfpqHit *b = best + q * k;
		GpuIvfpqHit *cand = scratch;
		GpuIvfpqHit *tmp = scratch + kk;
		const float *qv = queries + q * d;
		int			nc = 0;
		int			out;
		bool		certain;
		double		worst = -get_float8_infinity();

		CHECK_FOR_INTERRUPTS();
		if (!all_exact)
		{
			for (int j = 0; j < kk; j++)
			{
				int64		row = labels[q * kk + j];

				if (row < 0)
					continue;
				cand[nc].dist = GpuIvfpqExactDistance(metric, qv, base + row * d, d);
				cand[nc].tid = tids[row];
				worst = Max(worst, (double) dist[q * kk + j]);
				nc++;
			}
			out = MergeBest(b, counts[q], k, cand, nc, tmp);
			/* Every row ranked, or none left out could beat the k-th. */
			certain = nc == n ||
				(nc == kk && out == k && !isnan(tmp[k - 1].dist) &&
				 LeastDistance(metric, worst, RankSlack(metric, d, qsq[q], bsq)) > tmp[k - 1].dist);
			if (certain)
			{
				memcpy(b, tmp, sizeof(GpuIvfpqHit) * out);
				counts[q] = out;
				continue;
			}
			(*exact_queries)++;
		}
		for (int64 row = 0; row < n; row++)
		{
			GpuIvfpqHit h;

			h.dist = GpuIvfpqExactDistance(metric, qv, base + row * d, d);
			h.tid = tids[row];
			KeepBest(b, &counts[q], k, &h);
			if ((row & 4095) == 4095)
				CHECK_FOR_INTERRUPTS();
		}
	}
}

/*
 * A gpu_ivfpq index over exactly the column whose GPU mirror can answer
 * for the table: a plain column (no expression), no predicate (it holds
 * every row with a vector), valid, trained, with vector copies, of the
 * dimension d and of the requested metric, and usable by every snapshot
 * (not built over broken HOT chains: indcheckxmin, which the planner honours
 * for young indexes, is refused outright). Opened (AccessShareLock), else
 * NULL.
 */
static Relation
MirrorIndexOf(Relation heap, AttrNumber attnum, int d, int metric, GpuIvfpqMetaPageData *meta)
{
	List	   *indexes = RelationGetIndexList(heap);
	Oid			amoid = get_index_am_oid("gpu_ivfpq", true);
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index ix = index->rd_index;

		if (index->rd_rel->relam == amoid && ix->indisvalid && ix->indisready && !ix->indcheckxmin &&
			ix->indkey.values[0] == attnum &&
			heap_attisnull(index->rd_indextuple, Anum_pg_index_indexprs, NULL) &&
			heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL) &&
			GpuIvfpqMetricOf(index) == metric)
		{
			GpuIvfpqReadMeta(index, meta);
			if (meta->trained && meta->dimensions == (uint32) d &&
				GpuIvfpqLayoutOf(meta).vdim > 0 && GpuIvfpqServiceCanServe(meta))
			{
				list_free(indexes);
				return index;
			}
		}
		index_close(index, AccessShareLock);
	}
	list_free(indexes);
	return NULL;
}

/*
 * The largest norm a vector stored in index can have: a list's centroid's
 * plus its covering radius, widened for the float rounding of both (the
 * radius comes from |x|^2 + |c|^2 - 2 x.c in float, as range search
 * widens it).
 */
static double
MirrorNormBound(Relation index, const GpuIvfpqMetaPageData *meta)
{
	GpuIvfpqListDirEntry *dir = GpuIvfpqReadListDir(index, meta);
	const float *cent = GpuIvfpqGetModel(index, meta)->centroids().data();
	double		widen = 0.01 + sqrt((double) (meta->dimensions + 16) * ldexp(1.0, -21));
	double		bound = 0.0;

	for (uint32 l = 0; l < meta->lists; l++)
	{
		double		cn = sqrt(NormSqr(cent + (size_t) l * meta->dimensions, (int) meta->dimensions));
		double		rc = dir[l].radius;

		CHECK_FOR_INTERRUPTS();
		if (dir[l].head == InvalidBlockNumber)
			continue;
		if (!(rc >= 0.0))
		{
			bound = get_float8_infinity();
			break;
		}
		bound = Max(bound, (cn + rc) * (1.0 + widen));
	}
	pfree(dir);
	return bound;
}

/*
 * The exact k-NN from the GPU mirror of an index over the column: every
 * stored vector ranked on the GPU by the operators' exact distance (no
 * table read, no shipping of the rows), then the visible rows kept (a
 * bitmap of the visible rows for large requests). The mirror also holds
 * dead and not yet visible rows, so each query asks for 2k + 16
 * candidates; a query left with fewer than k visible among a full set of
 * candidates sends the whole call back to the table path. So does a query
 * whose answer the device's float preselection cannot be shown to hold:
 * a row it left out ranked no better than every candidate, so its exact
 * distance is at least the last candidate's less twice the ranking's
 * rounding bound (RankSlack, for vectors within the index's norm bound),
 * and that must exceed the k-th distance kept (as SearchChunk certifies;
 * data far from the origin fail it and take the table path, which ranks
 * them moved to their mean). Emits nothing and returns false when it
 * cannot serve.
 */
static bool
ExactFromMirror(Relation heap, AttrNumber attnum, const float *queries, int64 nq, int d, int metric,
				int k, ReturnSetInfo *rsinfo, int64 *mirror_queries)
{
	GpuIvfpqMetaPageData meta;
	Relation	index;
	int			want = Min(GPU_IVFPQ_SERVICE_MAX_K, 2 * k + 16);
	/* Queries per request: a bounded segment, as batch search's. */
	int64		chunk = Min(nq, Max((int64) 1, (int64) (MIRROR_CHUNK_BYTES /
														((Size) d * sizeof(float) +
														 (Size) want * (sizeof(int64) + sizeof(double))))));
	int64	   *labels;
	double	   *exact;
	GpuIvfpqHit *hits;
	int64	   *nhits;
	GpuIvfpqHeapFetch hf;
	GpuIvfpqVisibleRows *visible = NULL;
	bool		served = true;
	double		bsq;

	/*
	 * The mirror ranks in float: a query too long for that goes to the
	 * table path, as do more queries than one block of best hits holds
	 * (the table path answers them a block at a time).
	 */
	if (!GpuIvfpqServiceWanted() || want < k || AnyUnranked(queries, nq, d) ||
		(Size) nq * k > EXACT_BEST_BYTES / sizeof(GpuIvfpqHit))
		return false;
	index = MirrorIndexOf(heap, attnum, d, metric, &meta);
	if (index == NULL)
		return false;
	/*
	 * Every row is a candidate, as for the table path's sequential scan
	 * (which takes this lock itself): under SERIALIZABLE any insert
	 * conflicts.
	 */
	PredicateLockRelation(heap, GetActiveSnapshot());
	labels = (int64 *) palloc_extended(sizeof(int64) * chunk * want, MCXT_ALLOC_HUGE);
	exact = (double *) palloc_extended(sizeof(double) * chunk * want, MCXT_ALLOC_HUGE);
	hits = (GpuIvfpqHit *) palloc_extended(sizeof(GpuIvfpqHit) * nq * k, MCXT_ALLOC_HUGE);
	nhits = (int64 *) palloc0_array(int64, nq);
	GpuIvfpqHeapFetchBegin(&hf, heap, index, GetActiveSnapshot());
	/* Many candidates: one pass over the table answers their visibility. */
	if ((double) nq * want > Max(heap->rd_rel->reltuples, 1.0) / 4)
		visible = GpuIvfpqVisibleRowsBuild(heap, GetActiveSnapshot(), (Size) maintenance_work_mem * 1024);
	for (int64 c0 = 0; c0 < nq && served; c0 += chunk)
	{
		int64		cn = Min(chunk, nq - c0);
		GpuIvfpqAnswerDists dists = GPU_IVFPQ_DISTS_NONE;

		if (!GpuIvfpqServiceSearchBatch(index, &meta, queries + c0 * d, cn, want, 1, true, labels,
										exact, &dists, NULL) || dists != GPU_IVFPQ_DISTS_EXACT)
		{
			served = false;
			break;
		}
		/*
		 * Read after the search: every row it ranked was inserted (and its
		 * list's radius widened) before its change reached the mirror.
		 */
		bsq = MirrorNormBound(index, &meta);
		bsq *= bsq;
		for (int64 i = 0; i < cn; i++)
		{
			int			n = 0;
			int64		q = c0 + i;

			while (n < want && labels[i * want + n] >= 0)
				n++;
			nhits[q] = GpuIvfpqKeepVisible(&hf, visible, labels + i * want, exact + i * want, n, k,
										   hits + q * k);
			/* Visible rows may lie past the candidates: the table decides. */
			if (nhits[q] < k && n == want)
			{
				served = false;
				break;
			}
			if (n == want)
			{
				double		last = exact[i * want + n - 1];
				double		score = metric == (int) gpuivfpq::Metric::L2 ? last * last : last;
				double		qn = NormSqr(queries + q * d, d);
				double		slack = RankSlack(metric, d, qn, bsq);

				if ((metric == (int) gpuivfpq::Metric::Cosine && !CosineRankable(qn)) ||
					!(LeastDistance(metric, score - slack, slack) > hits[q * k + k - 1].dist))
				{
					served = false;
					break;
				}
			}
			CHECK_FOR_INTERRUPTS();
		}
	}
	GpuIvfpqHeapFetchEnd(&hf);
	if (visible != NULL)
	{
		pfree(visible->bits);
		pfree(visible);
	}
	if (served)
	{
		for (int64 q = 0; q < nq; q++)
			for (int r = 0; r < nhits[q]; r++)
			{
				Datum		values[4];
				bool		nulls[4] = {false, false, false, false};

				values[0] = Int32GetDatum((int32) (q + 1));
				values[1] = Int32GetDatum(r + 1);
				values[2] = PointerGetDatum(&hits[q * k + r].tid);
				values[3] = Float8GetDatum(hits[q * k + r].dist);
				tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
			}
		*mirror_queries = nq;
		elog(DEBUG1, "gpu_ivfpq exact search of \"%s\": %lld queries from the GPU mirror of \"%s\"",
			 RelationGetRelationName(heap), (long long) nq, RelationGetRelationName(index));
	}
	pfree(labels);
	pfree(exact);
	pfree(hits);
	pfree(nhits);
	index_close(index, AccessShareLock);
	return served;
}

/* gpu_ivfpq_exact_knn(tbl, col, queries, k, metric): (query, rank, tid, distance). */
Datum
gpu_ivfpq_exact_knn(PG_FUNCTION_ARGS)
{
	Oid			relid = PG_GETARG_OID(0);
	char	   *col = NameStr(*PG_GETARG_NAME(1));
	int32		k = PG_GETARG_INT32(3);
	char	   *mname = text_to_cstring(PG_GETARG_TEXT_PP(4));
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	int			metric = ParseMetric(mname);
	Relation	heap;
	AttrNumber	attnum;
	Oid			atttype;
	GpuIvfpqVectorFormat format;
	const float *queries;
	int64		nq;
	int			d;
	int64		chunk;
	float	   *base;
	ItemPointerData *tids;
	int64		n = 0;
	int64		rows = 0;
	int64		gpu_chunks = 0;
	int64		chunks = 0;
	int64		qblock;
	GpuIvfpqHit *scratch;
	float	   *work;
	double	   *qsq;
	int			kk;
	int64		exact_queries = 0;
	GpuIvfpqHit   *best;
	int		   *counts;
	float	   *dist;
	int64	   *labels;
	TupleTableSlot *slot;
	TableScanDesc scan;
	MemoryContext rowctx;

	GpuIvfpqCheckBatchK(k);
	queries = GpuIvfpqQueryVectors(fcinfo, 2, &nq, &d);
	InitMaterializedSRF(fcinfo, 0);
	heap = GpuIvfpqOpenTableChecked(relid, "gpu_ivfpq_exact_knn");
	attnum = get_attnum(relid, col);
	if (attnum == InvalidAttrNumber || attnum < 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_COLUMN),
				 errmsg("column \"%s\" of relation \"%s\" does not exist", col, RelationGetRelationName(heap))));
	atttype = get_atttype(relid, attnum);
	format = GpuIvfpqFormatOfType(atttype);
	if (format == GPU_IVFPQ_FORMAT_NONE)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("column \"%s\" is of type %s, not a vector type", col, format_type_be(atttype)),
				 errhint("gpu_ivfpq_exact_knn searches real[] columns, and pgvector's vector and halfvec columns.")));

	if (ExactFromMirror(heap, attnum, queries, nq, d, metric, k, rsinfo, &rows))
	{
		table_close(heap, AccessShareLock);
		PG_RETURN_VOID();
	}

	/* Rows per chunk: EXACT_CHUNK_BYTES of them, however wide (one at the least). */
	chunk = Max((int64) 1, (int64) (EXACT_CHUNK_BYTES / ((Size) d * sizeof(float))));
	/* Queries per pass over the table: their best hits within EXACT_BEST_BYTES. */
	kk = (int) Min((int64) 2 * k + 16, chunk);
	qblock = Min(nq, Max((int64) 1, (int64) (EXACT_BEST_BYTES /
											 ((Size) k * sizeof(GpuIvfpqHit) +
											  (Size) kk * (sizeof(float) + sizeof(int64)) +
											  (metric == (int) gpuivfpq::Metric::L2 ? (Size) d * sizeof(float) : 0) +
											  sizeof(double)))));
	base = (float *) palloc_extended((Size) chunk * d * sizeof(float), MCXT_ALLOC_HUGE);
	tids = (ItemPointerData *) palloc_extended(sizeof(ItemPointerData) * chunk, MCXT_ALLOC_HUGE);
	best = (GpuIvfpqHit *) palloc_extended(sizeof(GpuIvfpqHit) * qblock * k, MCXT_ALLOC_HUGE);
	counts = (int *) palloc0_array(int, qblock);
	dist = (float *) palloc_extended(sizeof(float) * qblock * kk, MCXT_ALLOC_HUGE);
	labels = (int64 *) palloc_extended(sizeof(int64) * qblock * kk, MCXT_ALLOC_HUGE);
	scratch = (GpuIvfpqHit *) palloc_extended(sizeof(GpuIvfpqHit) * ((Size) kk + k), MCXT_ALLOC_HUGE);
	/* the chunk and the queries moved by the chunk's mean (L2 only) */
	work = metric == (int) gpuivfpq::Metric::L2
		? (float *) palloc_extended(sizeof(float) * (Size) (qblock + chunk) * d, MCXT_ALLOC_HUGE) : NULL;
	qsq = (double *) palloc_extended(sizeof(double) * qblock, MCXT_ALLOC_HUGE);
	rowctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq exact row", ALLOCSET_DEFAULT_SIZES);
	slot = table_slot_create(heap, NULL);
	for (int64 q0 = 0; q0 < nq; q0 += qblock)
	{
		const float *qv = queries + q0 * d;
		int64		nqb = Min(qblock, nq - q0);

		memset(counts, 0, sizeof(int) * qblock);
		scan = table_beginscan(heap, GetActiveSnapshot(), 0, NULL);
		for (;;)
		{
			bool		more = table_scan_getnextslot(scan, ForwardScanDirection, slot);

			if (more)
			{
				bool		isnull;
				Datum		value = slot_getattr(slot, attnum, &isnull);

				if (!isnull)
				{
					MemoryContext old = MemoryContextSwitchTo(rowctx);
					int			vdim;
					/* Not an indexed column: its values were never checked (NaN, infinity). */
					const float *v = GpuIvfpqDatumVector(value, format, &vdim, "stored vector");

					if (vdim != d)
						ereport(ERROR,
								(errcode(ERRCODE_DATA_EXCEPTION),
								 errmsg("row %s of \"%s\" has %d dimensions, the queries %d",
										DatumGetCString(DirectFunctionCall1(tidout, PointerGetDatum(&slot->tts_tid))),
										RelationGetRelationName(heap), vdim, d)));
					memcpy(base + n * d, v, sizeof(float) * d);
					tids[n++] = slot->tts_tid;
					MemoryContextSwitchTo(old);
					MemoryContextReset(rowctx);
				}
			}
			if (n == chunk || (!more && n > 0))
			{
				SearchChunk(qv, nqb, base, tids, n, d, metric, k, best, counts, dist, labels, scratch, work,
							qsq, &gpu_chunks, &exact_queries);
				rows += n;
				chunks++;
				n = 0;
			}
			if (!more)
				break;
			CHECK_FOR_INTERRUPTS();
		}
		table_endscan(scan);

		for (int64 q = 0; q < nqb; q++)
			for (int r = 0; r < counts[q]; r++)
			{
				Datum		values[4];
				bool		nulls[4] = {false, false, false, false};

				values[0] = Int32GetDatum((int32) (q0 + q + 1));
				values[1] = Int32GetDatum(r + 1);
				values[2] = PointerGetDatum(&best[q * k + r].tid);
				values[3] = Float8GetDatum(best[q * k + r].dist);
				tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
			}
	}
	ExecDropSingleTupleTableSlot(slot);
	elog(DEBUG1, "gpu_ivfpq exact search of \"%s\": %lld queries, %lld rows in %lld chunks, %lld on the GPU, %lld query-chunks ranked by exact distances alone",
		 RelationGetRelationName(heap), (long long) nq, (long long) rows, (long long) chunks,
		 (long long) gpu_chunks, (long long) exact_queries);
	table_close(heap, AccessShareLock);
	PG_RETURN_VOID();
}
