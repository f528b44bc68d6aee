// Reading inverted lists: the CPU engine's IVFADC ranking of the probed
// lists into a k-selection heap, and the collection of a list's entries
// (all, or those within an ADC bound). Shared by index scans, batch and
// range search; the only readers of list entries outside pages.cpp.
#include "am/am.h"
#include "common/guard.h"
#include "engine/ivfpq.h"
#include "engine/topk.h"

extern "C" {
#include "access/relation.h"
#include "commands/defrem.h"
}

/*
 * The CPU engine's candidates: ranks every entry of the first probes lists
 * of a prepared query by ADC distance through topk (emptied again on
 * return) and writes the best labels (TIDs), nearest first, to labels (room
 * for topk->k()); *nlabels says how many. Returns how many entries those
 * lists hold.
 */
int64
GpuIvfpqRankLists(Relation index, const GpuIvfpqMetaPageData *meta, const GpuIvfpqListDirEntry *dir,
				  gpuivfpq::IvfPqModel *model, const gpuivfpq::IvfPqQuery *prepared, int probes,
				  gpuivfpq::TopK *topk, int64 *labels, int *nlabels)
{
	int			m = meta->m;
	int			esz = GpuIvfpqEntrySize(m);
	float	   *table = (float *) palloc(sizeof(float) * m * 256);
	float	   *dists = (float *) palloc(sizeof(float) * GpuIvfpqEntriesPerPage(m));
	int64		seen = 0;

	for (int p = 0; p < probes; p++)
	{
		int			list = prepared->lists[p];
		float		base = 0.0f;

		GpuIvfpqGuard("lookup tables", [&] { model->list_table(*prepared, p, table, &base); });
		GpuIvfpqWalkList(index, dir[list].head, m, [&](const char *ent, int n) {
			seen += n;
			GpuIvfpqGuard("list scan", [&] {
				gpuivfpq::adc_scan(GpuIvfpqEntryCode(ent, 0, m), n, esz, table, m, base, dists);
				for (int i = 0; i < n; i++)
					if (dists[i] < topk->threshold())
						topk->push(dists[i], GpuIvfpqEntryLabel(ent, i, m));
			});
		});
	}
	pfree(dists);
	pfree(table);
	*nlabels = 0;
	GpuIvfpqGuard("k-selection", [&] {
		for (const auto &nb : topk->take_sorted())
			labels[(*nlabels)++] = nb.label;
	});
	return seen;
}

/*
 * Appends the labels of the list starting at head to out: every entry, or
 * with a bound only those whose ADC distance is within it. Returns how many
 * entries the list holds.
 */
int64
GpuIvfpqCollectList(Relation index, const GpuIvfpqMetaPageData *meta, BlockNumber head,
					const GpuIvfpqAdcBound *bound, GpuIvfpqLabels *out)
{
	int			m = meta->trained ? meta->m : 0;
	float	   *dists = bound ? (float *) palloc(sizeof(float) * GpuIvfpqEntriesPerPage(m)) : NULL;
	int64		entries = 0;

	GpuIvfpqWalkList(index, head, m, [&](const char *ent, int n) {
		entries += n;
		if (out->n + n > out->cap)
		{
			out->cap = Max(Max(out->cap * 2, out->n + n), 1024);
			out->labels = out->labels
				? (int64 *) repalloc_huge(out->labels, sizeof(int64) * out->cap)
				: (int64 *) palloc_extended(sizeof(int64) * out->cap, MCXT_ALLOC_HUGE);
		}
		if (bound != NULL)
			GpuIvfpqGuard("list scan", [&] {
				gpuivfpq::adc_scan(GpuIvfpqEntryCode(ent, 0, m), n, GpuIvfpqEntrySize(m), bound->table,
								   m, bound->base, dists);
			});
		for (int i = 0; i < n; i++)
			if (bound == NULL || dists[i] <= bound->limit)
				out->labels[out->n++] = GpuIvfpqEntryLabel(ent, i, m);
	});
	if (dists)
		pfree(dists);
	return entries;
}

/* Opens a gpu_ivfpq index (AccessShareLock), or errors for another kind of relation. */
Relation
GpuIvfpqOpenIndex(Oid relid)
{
	Relation	index = try_relation_open(relid, AccessShareLock);

	/* An OID that names no relation (a dropped one, or a number): a user error. */
	if (index == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation with OID %u does not exist", relid)));
	if (index->rd_rel->relkind != RELKIND_INDEX ||
		index->rd_rel->relam != get_index_am_oid("gpu_ivfpq", false))
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a gpu_ivfpq index", RelationGetRelationName(index)),
				 errhint("Pass an index created with USING gpu_ivfpq.")));
	return index;
}
