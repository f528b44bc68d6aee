// Reading inverted lists: the CPU engine's IVFADC ranking of the probed
// lists into a k-selection heap, and the collection of a list's entries
// (all, or those within an ADC bound). Shared by index scans, batch and
// range search; the only readers of list entries outside pages.cpp.
#include <algorithm>

#include "am/am.h"
#include "common/guard.h"

#include "engine/exact_distance.h"
#include "engine/ivfpq.h"
#include "engine/topk.h"

/* A candidate's vector, copied when the k-selection took it (CpuExact). */
typedef struct TakenVector
{
	int64		label;
	int64		slot;			/* in the copies, vdim floats each */
	float		adc;			/* its ADC distance */
} TakenVector;

/*
 * Drops the copies of candidates the k-selection has pushed out since (ADC
 * distance above its threshold now: they cannot come back), so that the
 * copies stay near k however the lists are ordered. Slots are renumbered in
 * taking order.
 */
static int64
CompactTaken(TakenVector *taken, float *copies, int64 ntaken, int vdim, float threshold)
{
	int64		kept = 0;

	for (int64 i = 0; i < ntaken; i++)
	{
		if (taken[i].adc > threshold)
			continue;
		if (kept != i)
			memmove(copies + kept * vdim, copies + i * vdim, sizeof(float) * vdim);
		taken[kept] = taken[i];
		taken[kept].slot = kept;
		kept++;
	}
	return kept;
}

/*
 * The CPU engine's candidates: ranks every entry of the first probes lists
 * of a prepared query by ADC distance through topk (emptied again on
 * return) and writes the best labels (TIDs) to labels (room for topk->k());
 * *nlabels says how many. Without exact, they come nearest first by ADC.
 * With exact (an index whose entries hold vectors), they come re-ranked:
 * exact[i] is the exact distance of labels[i] to query, in the order of
 * gpuivfpq::exact_less, as the GPU's re-rank returns them. Each entry the
 * k-selection takes has its vector copied while its page is locked, so the
 * re-rank reads no page again (and no heap). With range (an index with a
 * filter column), only entries whose filter key lies in it are ranked, as
 * if the others were not there. Returns how many entries those lists hold
 * (within range).
 */
int64
GpuIvfpqRankLists(Relation index, const GpuIvfpqMetaPageData *meta, const GpuIvfpqListDirEntry *dir,
				  gpuivfpq::IvfPqModel *model, const gpuivfpq::IvfPqQuery *prepared, int probes,
				  const GpuIvfpqKeyRange *range, gpuivfpq::TopK *topk, const float *query,
				  int64 *labels, double *exact, int *nlabels)
{
	GpuIvfpqEntryLayout el = GpuIvfpqLayoutOf(meta);
	int			m = el.m;
	int			vdim = el.vdim;
	float	   *table = (float *) palloc(sizeof(float) * m * 256);
	float	   *dists = (float *) palloc(sizeof(float) * GpuIvfpqEntriesPerPage(&el));
	int64		seen = 0;
	TakenVector *taken = NULL;
	float	   *copies = NULL;
	int64		ntaken = 0;
	int64		cap = 0;

	if (exact != NULL && vdim == 0)
		elog(ERROR, "gpu_ivfpq: exact re-rank from an index without vector copies");
	if (range != NULL && !el.keyed)
		elog(ERROR, "gpu_ivfpq: filter range on an index without filter keys");
	GpuIvfpqModelTables(model);
	for (int p = 0; p < probes; p++)
	{
		int			list = prepared->lists[p];
		float		base = 0.0f;

		/* The next list's first page comes while this one is read (GpuIvfpqPrefetchHinted). */
		if (p + 1 < probes && dir[prepared->lists[p + 1]].head != InvalidBlockNumber)
			GpuIvfpqPrefetchHinted(index, dir[prepared->lists[p + 1]].head);
		GpuIvfpqGuard("lookup tables", [&] { model->list_table(*prepared, p, table, &base); });
		GpuIvfpqWalkListHinted(index, dir[list].head, &el, true, [&](const char *ent, int n, BlockNumber) {
			if (range == NULL)
			{
				seen += n;
				GpuIvfpqGuard("list scan", [&] {
					gpuivfpq::adc_scan(GpuIvfpqEntryCode(ent, 0, &el), n, el.size, table, m, base, dists);
				});
			}
			else
			{
				/* Only entries within the filter's range get a distance (+inf: skipped). */
				for (int i = 0; i < n; i++)
				{
					dists[i] = INFINITY;
					if (!GpuIvfpqEntryInRange(ent, i, &el, range))
						continue;
					seen++;
					GpuIvfpqGuard("list scan", [&] {
						gpuivfpq::adc_scan(GpuIvfpqEntryCode(ent, i, &el), 1, el.size, table, m, base,
										   &dists[i]);
					});
				}
			}
			for (int i = 0; i < n; i++)
			{
				int64		label;

				if (!(dists[i] < topk->threshold()))
					continue;
				label = GpuIvfpqEntryLabel(ent, i, &el);
				GpuIvfpqGuard("list scan", [&] { topk->push(dists[i], label); });
				if (exact == NULL)
					continue;
				if (ntaken == cap && cap > 0)
					ntaken = CompactTaken(taken, copies, ntaken, vdim, topk->threshold());
				if (ntaken == cap)
				{
					cap = Max(cap * 2, (int64) topk->k() * 4);
					taken = taken ? (TakenVector *) repalloc_huge(taken, sizeof(TakenVector) * cap)
						: (TakenVector *) palloc_extended(sizeof(TakenVector) * cap, MCXT_ALLOC_HUGE);
					copies = copies ? (float *) repalloc_huge(copies, sizeof(float) * vdim * cap)
						: (float *) palloc_extended(sizeof(float) * vdim * cap, MCXT_ALLOC_HUGE);
				}
				taken[ntaken].label = label;
				taken[ntaken].slot = ntaken;
				taken[ntaken].adc = dists[i];
				memcpy(copies + ntaken * vdim, GpuIvfpqEntryVector(ent, i, &el), sizeof(float) * vdim);
				ntaken++;
			}
		});
	}
	pfree(dists);
	pfree(table);
	*nlabels = 0;
	GpuIvfpqGuard("k-selection", [&] {
		for (const auto &nb : topk->take_sorted())
			labels[(*nlabels)++] = nb.label;
	});
	if (exact != NULL)
	{
		gpuivfpq::Metric metric = (gpuivfpq::Metric) meta->metric;
		int			n = *nlabels;
		int		   *order = (int *) palloc_extended(sizeof(int) * Max(n, 1), MCXT_ALLOC_HUGE);
		int64	   *sorted_labels = (int64 *) palloc_extended(sizeof(int64) * Max(n, 1), MCXT_ALLOC_HUGE);
		double	   *sorted_exact = (double *) palloc_extended(sizeof(double) * Max(n, 1), MCXT_ALLOC_HUGE);

		/* By label, the latest copy last: a label taken twice keeps its last vector. */
		std::sort(taken, taken + ntaken, [](const TakenVector &a, const TakenVector &b) {
			return a.label != b.label ? a.label < b.label : a.slot < b.slot;
		});
		for (int i = 0; i < n; i++)
		{
			TakenVector key = {labels[i], INT64_MAX};
			TakenVector *at = std::upper_bound(taken, taken + ntaken, key,
											   [](const TakenVector &a, const TakenVector &b) {
												   return a.label != b.label ? a.label < b.label : a.slot < b.slot;
											   });

			/* Every selected entry was taken at least once on its way in. */
			Assert(at != taken && (at - 1)->label == labels[i]);
			exact[i] = gpuivfpq::exact_distance(metric, query, copies + (at - 1)->slot * vdim,
												(size_t) vdim);
			order[i] = i;
		}
		std::sort(order, order + n, [&](int a, int b) {
			return gpuivfpq::exact_less(exact[a], labels[a], exact[b], labels[b]);
		});
		for (int i = 0; i < n; i++)
		{
			sorted_labels[i] = labels[order[i]];
			sorted_exact[i] = exact[order[i]];
		}
		memcpy(labels, sorted_labels, sizeof(int64) * n);
		memcpy(exact, sorted_exact, sizeof(double) * n);
		pfree(order);
		pfree(sorted_labels);
		pfree(sorted_exact);
		if (taken != NULL)
		{
			pfree(taken);
			pfree(copies);
		}
	}
	return seen;
}

/*
 * Appends the labels of the list starting at head to out: every entry, or
 * with a bound only those whose ADC distance is within it (or overflowed),
 * and with range only those whose filter key lies in it. Returns how many
 * entries the list holds (within range).
 */
int64
GpuIvfpqCollectList(Relation index, const GpuIvfpqMetaPageData *meta, BlockNumber head,
					const GpuIvfpqAdcBound *bound, const GpuIvfpqKeyRange *range, GpuIvfpqLabels *out)
{
	GpuIvfpqChainCursor cur;

	GpuIvfpqChainCursorInit(&cur, head);
	return GpuIvfpqCollectPages(index, meta, &cur, bound, range, out, PG_INT64_MAX);
}

int64
GpuIvfpqCollectPages(Relation index, const GpuIvfpqMetaPageData *meta, GpuIvfpqChainCursor *cur,
					 const GpuIvfpqAdcBound *bound, const GpuIvfpqKeyRange *range, GpuIvfpqLabels *out,
					 int64 stop_at)
{
	GpuIvfpqEntryLayout el = GpuIvfpqLayoutOf(meta);
	float	   *dists = bound ? (float *) palloc(sizeof(float) * GpuIvfpqEntriesPerPage(&el)) : NULL;
	int64		entries = 0;

	if (range != NULL && !el.keyed)
		elog(ERROR, "gpu_ivfpq: filter range on an index without filter keys");
	while (cur->next != InvalidBlockNumber && out->n < stop_at)
		GpuIvfpqChainCursorStep(index, cur, &el, true, [&](const char *ent, int n, BlockNumber) {
			if (out->n + n > out->cap)
			{
				out->cap = Max(Max(out->cap * 2, out->n + n), 1024);
				out->labels = out->labels
					? (int64 *) repalloc_huge(out->labels, sizeof(int64) * out->cap)
					: (int64 *) palloc_extended(sizeof(int64) * out->cap, MCXT_ALLOC_HUGE);
			}
			if (bound != NULL)
				GpuIvfpqGuard("list scan", [&] {
					gpuivfpq::adc_scan(GpuIvfpqEntryCode(ent, 0, &el), n, el.size, bound->table,
									   el.m, bound->base, dists);
				});
			for (int i = 0; i < n; i++)
			{
				if (!GpuIvfpqEntryInRange(ent, i, &el, range))
					continue;
				entries++;

				/*
				 * An ADC distance that overflowed bounds nothing (the true
				 * distance may be anything): the entry stays a candidate.
				 */
				if (bound == NULL || dists[i] <= bound->limit || dists[i] >= gpuivfpq::kOverflowDistance)
					out->labels[out->n++] = GpuIvfpqEntryLabel(ent, i, &el);
			}
		});
	if (dists)
		pfree(dists);
	return entries;
}

/*
 * The most entries index can hold now: every block of it a full list page.
 * No scan round and no batch search asks for more candidates than that, so
 * their arrays stay within the index's size whatever gpu_ivfpq.rerank says.
 */
int64
GpuIvfpqEntriesBound(Relation index, const GpuIvfpqMetaPageData *meta)
{
	GpuIvfpqEntryLayout el = GpuIvfpqLayoutOf(meta);
	int64		entries = (int64) RelationGetNumberOfBlocks(index) * GpuIvfpqEntriesPerPage(&el);

	/* Candidate counts are ints: keep clear of their range too. */
	return Max(Min(entries, (int64) INT_MAX / 4), (int64) 1);
}
