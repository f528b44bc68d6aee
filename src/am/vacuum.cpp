// VACUUM: remove dead heap TIDs from the lists (compacting pages so inserts
// reuse the space) and report index statistics.
#include "am/am.h"
#include "service/service.h"

/*
 * The labels of the entries a bulk delete removed, for the GPU mirror to
 * remove in place; past GPU_IVFPQ_REMOVE_IN_PLACE_MAX it only counts (the
 * mirror is then dropped and reloaded, cheaper than that many removals).
 */
typedef struct RemovedLabels
{
	int64	   *labels;
	int			n;
	bool		overflow;
} RemovedLabels;

/*
 * Walks every list page; with a callback, removes the entries it reports
 * dead. Counts live entries into stats either way.
 */
static void
WalkLists(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
		  IndexBulkDeleteCallback callback, void *callback_state, RemovedLabels *removed_labels)
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
					if (dead[i] && removed_labels != NULL)
					{
						if (removed_labels->n < GPU_IVFPQ_REMOVE_IN_PLACE_MAX)
							removed_labels->labels[removed_labels->n++] = GpuIvfpqTidToLabel(&tid);
						else
							removed_labels->overflow = true;
					}
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
	RemovedLabels removed;

	if (stats == NULL)
		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
	stats->num_index_tuples = 0;
	removed.labels = (int64 *) palloc(sizeof(int64) * GPU_IVFPQ_REMOVE_IN_PLACE_MAX);
	removed.n = 0;
	removed.overflow = false;
	WalkLists(info, stats, callback, callback_state, &removed);

	/*
	 * The GPU mirror loses the removed entries before VACUUM lets the heap
	 * reuse their TIDs, so a mirror never offers a TID for a row it no
	 * longer describes: removed in place (the service waits for no reload),
	 * or, after a large removal, dropped and reloaded from the pages on next
	 * use. Entries moved within a page stay in their list: the mirror does
	 * not care where on the page.
	 */
	if (removed.overflow)
		GpuIvfpqServiceInvalidate(info->index, true);
	else if (removed.n > 0)
		GpuIvfpqServiceRemove(info->index, removed.labels, removed.n);
	pfree(removed.labels);
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
		WalkLists(info, stats, NULL, NULL, NULL);
	}
	stats->num_pages = RelationGetNumberOfBlocks(info->index);
	return stats;
}
