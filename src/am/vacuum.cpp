// VACUUM: remove dead heap TIDs from the lists (compacting pages so inserts
// reuse the space) and report index statistics.
#include "am/am.h"
#include "service/service.h"

/*
 * Walks every list page; with a callback, removes the entries it reports
 * dead. Counts live entries into stats either way.
 */
static void
WalkLists(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
		  IndexBulkDeleteCallback callback, void *callback_state)
{
	Relation	index = info->index;
	GpuIvfpqMetaPageData meta;
	GpuIvfpqListDirEntry *dir;
	int			m;
	int			esz;

	GpuIvfpqReadMeta(index, &meta);
	dir = GpuIvfpqReadListDir(index, &meta);
	m = meta.trained ? meta.m : 0;
	esz = GpuIvfpqEntrySize(m);

	for (uint32 l = 0; l < meta.lists; l++)
	{
		BlockNumber blk = dir[l].head;
		BlockNumber first_room = InvalidBlockNumber;
		BlockNumber from = InvalidBlockNumber;
		GpuIvfpqChainWalk walk = {0, 0};

		while (blk != InvalidBlockNumber)
		{
			Buffer		buf;
			Page		page;
			int			n;
			int			kept = 0;
			int			removed = 0;
			char	   *base;
			bool		dead[GPU_IVFPQ_PAGE_CONTENT / GPU_IVFPQ_TID_BYTES + 1];

			vacuum_delay_point();
			GpuIvfpqChainStep(index, &walk, from, blk);
			buf = ReadBufferExtended(index, MAIN_FORKNUM, blk, RBM_NORMAL, info->strategy);
			LockBuffer(buf, callback ? BUFFER_LOCK_EXCLUSIVE : BUFFER_LOCK_SHARE);
			page = BufferGetPage(buf);
			/* Checked: dead[] holds a page's capacity. */
			n = GpuIvfpqListPageEntries(index, blk, page, m, (int) l);
			base = (char *) PageGetContents(page);

			if (callback)
			{
				for (int i = 0; i < n; i++)
				{
					ItemPointerData tid;

					GpuIvfpqEntryTid(base, i, m, &tid);
					dead[i] = callback(&tid, callback_state);
					removed += dead[i] ? 1 : 0;
				}
			}
			if (removed > 0)
			{
				GenericXLogState *state = GenericXLogStart(index);
				Page		wpage = GenericXLogRegisterBuffer(state, buf, 0);
				char	   *wbase = (char *) PageGetContents(wpage);

				/* Compact in place, keeping the order of the survivors. */
				for (int i = 0; i < n; i++)
				{
					if (dead[i])
						continue;
					if (kept != i)
						memmove(wbase + (Size) kept * esz, wbase + (Size) i * esz, esz);
					kept++;
				}
				removed = n - kept;
				((PageHeader) wpage)->pd_lower -= removed * esz;
				GenericXLogFinish(state);
			}
			else
				kept = n;

			stats->tuples_removed += removed;
			stats->num_index_tuples += kept;
			if (first_room == InvalidBlockNumber && kept < GpuIvfpqEntriesPerPage(m))
				first_room = blk;
			from = blk;
			blk = GpuIvfpqPageGetOpaque(page)->next;
			UnlockReleaseBuffer(buf);
		}
		if (callback && first_room != InvalidBlockNumber)
			GpuIvfpqLowerInsertHint(index, &meta, l, first_room);
	}
	pfree(dir);
}

/* ambulkdelete: removes the entries of dead heap tuples. */
IndexBulkDeleteResult *
gpuivfpqbulkdelete(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
				   IndexBulkDeleteCallback callback, void *callback_state)
{
	double		removed_before;

	if (stats == NULL)
		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
	stats->num_index_tuples = 0;
	removed_before = stats->tuples_removed;
	WalkLists(info, stats, callback, callback_state);

	/*
	 * Entries were removed and others moved: the GPU mirror goes (and is
	 * reloaded from the pages on next use) before VACUUM lets the heap reuse
	 * the removed TIDs, so a mirror never offers a TID for a row it no longer
	 * describes.
	 */
	if (stats->tuples_removed > removed_before)
		GpuIvfpqServiceInvalidate(info->index, true);
	return stats;
}

/* amvacuumcleanup: reports sizes; counts entries when no bulk delete ran. */
IndexBulkDeleteResult *
gpuivfpqvacuumcleanup(IndexVacuumInfo *info, IndexBulkDeleteResult *stats)
{
	if (info->analyze_only)
		return stats;
	if (stats == NULL)
	{
		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
		WalkLists(info, stats, NULL, NULL);
	}
	stats->num_pages = RelationGetNumberOfBlocks(info->index);
	return stats;
}
