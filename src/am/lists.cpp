// The CPU engine's IVFADC list scan over index pages: the entries of the
// probed lists ranked by ADC distance into a k-selection heap. Shared by
// index scans and batch search.
#include "am/am.h"
#include "common/guard.h"
#include "engine/ivfpq.h"
#include "engine/topk.h"

/*
 * Offers every entry of the first probes lists of a prepared query to topk
 * (labels are TIDs). Returns how many entries those lists hold.
 */
int64
GpuIvfpqRankLists(Relation index, const GpuIvfpqMetaPageData *meta, const GpuIvfpqListDirEntry *dir,
				  gpuivfpq::IvfPqModel *model, const gpuivfpq::IvfPqQuery *prepared, int probes,
				  gpuivfpq::TopK *topk)
{
	int			m = meta->m;
	int			esz = GpuIvfpqEntrySize(m);
	int			per_page = GpuIvfpqEntriesPerPage(m);
	float	   *table = (float *) palloc(sizeof(float) * m * 256);
	float	   *dists = (float *) palloc(sizeof(float) * per_page);
	int64		seen = 0;

	for (int p = 0; p < probes; p++)
	{
		int			list = prepared->lists[p];
		float		base = 0.0f;

		GpuIvfpqGuard("lookup tables", [&] { model->list_table(*prepared, p, table, &base); });
		GpuIvfpqWalkList(index, dir[list].head, m, [&](const char *ent, int n) {
			seen += n;
			GpuIvfpqGuard("list scan", [&] {
				gpuivfpq::adc_scan((const uint8 *) ent + GPU_IVFPQ_TID_BYTES, n, esz, table, m, base,
								   dists);
				for (int i = 0; i < n; i++)
				{
					if (dists[i] < topk->threshold())
					{
						ItemPointerData tid;

						memcpy(&tid, ent + (Size) i * esz, GPU_IVFPQ_TID_BYTES);
						topk->push(dists[i], GpuIvfpqTidToLabel(&tid));
					}
				}
			});
		});
	}
	pfree(dists);
	pfree(table);
	return seen;
}
