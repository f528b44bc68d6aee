// VACUUM: remove dead heap TIDs from the lists (compacting pages so inserts
// reuse the space) and report index statistics.
#include "am/am.h"
#include "service/service.h"
#include "service/wal_announce.h"

/*
 * What a bulk delete told the GPU mirror: the labels of the removed entries
 * are logged page by page, for the mirror to remove in place; past
 * GPU_IVFPQ_REMOVE_IN_PLACE_MAX the mirror is invalidated instead (dropped
 * and reloaded, cheaper than that many removals). pos: the log position to
 * wait for before the heap may reuse the TIDs.
 */
typedef struct MirrorRemoval
{
	int			logged;
	bool		invalidated;
	uint64		pos;
} MirrorRemoval;

/*
 * Walks every list page; with a callback, removes the entries it reports
 * dead. Counts live entries into stats either way.
 */
static void
WalkLists(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
		  IndexBulkDeleteCallback callback, void *callback_state, MirrorRemoval *mirror)
{
	Relation	index = info->index;
	GpuIvfpqMetaPageData meta;
	GpuIvfpqListDirEntry *dir;
	GpuIvfpqEntryLayout el;
	int			esz;

	GpuIvfpqReadMeta(index, &meta);
	dir = GpuIvfpqReadListDir(index, &meta);
	el = GpuIvfpqLayoutOf(&meta);
	esz = el.size;

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
			int64		gone[GPU_IVFPQ_PAGE_CONTENT / GPU_IVFPQ_TID_BYTES + 1];

			GpuIvfpqVacuumDelayPoint();
			GpuIvfpqChainStep(index, &walk, from, blk);
			buf = ReadBufferExtended(index, MAIN_FORKNUM, blk, RBM_NORMAL, info->strategy);
			LockBuffer(buf, callback ? BUFFER_LOCK_EXCLUSIVE : BUFFER_LOCK_SHARE);
			page = BufferGetPage(buf);
			/* Checked: dead[] holds a page's capacity. */
			n = GpuIvfpqListPageEntries(index, blk, page, &el, (int) l);
			base = (char *) PageGetContents(page);

			if (callback)
			{
				for (int i = 0; i < n; i++)
				{
					ItemPointerData tid;

					GpuIvfpqEntryTid(base, i, &el, &tid);
					dead[i] = callback(&tid, callback_state);
					if (dead[i])
						gone[removed++] = GpuIvfpqTidToLabel(&tid);
				}
			}
			if (removed > 0)
			{
				GenericXLogState *state;
				Page		wpage;
				char	   *wbase;

				/* Before the page: a standby learns first whether it will hear of the removal. */
				GpuIvfpqWalNoteChange(index, &meta);
				state = GenericXLogStart(index);
				wpage = GenericXLogRegisterBuffer(state, buf, 0);
				wbase = (char *) PageGetContents(wpage);

				/* Compact in place (entries and vectors), keeping the order of the survivors. */
				for (int i = 0; i < n; i++)
				{
					if (dead[i])
						continue;
					if (kept != i)
					{
						Size		vbytes = sizeof(float) * el.vdim;

						memmove(wbase + (Size) kept * esz, wbase + (Size) i * esz, esz);
						if (vbytes > 0)
							memmove(wbase + el.vec_offset + kept * vbytes,
									wbase + el.vec_offset + i * vbytes, vbytes);
					}
					kept++;
				}
				removed = n - kept;
				((PageHeader) wpage)->pd_lower -= removed * esz;
				GenericXLogFinish(state);
			}
			else
				kept = n;

			/*
			 * The page is written: tell the mirror now (while VACUUM waits
			 * at the end, before the heap reuses these TIDs), so that a
			 * VACUUM failing later has still reported this page.
			 */
			if (removed > 0 && mirror != NULL && !mirror->invalidated)
			{
				if (mirror->logged + removed <= GPU_IVFPQ_REMOVE_IN_PLACE_MAX)
				{
					uint64		pos = GpuIvfpqServiceLogRemove(index, &meta, gone, removed);

					mirror->pos = Max(mirror->pos, pos);
					mirror->logged += removed;
				}
				else
				{
					mirror->pos = Max(mirror->pos, GpuIvfpqServiceLogInvalidate(index));
					mirror->invalidated = true;
				}
			}
			stats->tuples_removed += removed;
			stats->num_index_tuples += kept;
			if (first_room == InvalidBlockNumber && kept < GpuIvfpqEntriesPerPage(&el))
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
	MirrorRemoval mirror = {0, false, 0};
	MirrorRemoval *volatile mp = &mirror;	/* read after a longjmp */

	if (stats == NULL)
		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
	stats->num_index_tuples = 0;

	/*
	 * Once the mirror is invalidated, later pages' removals are not logged:
	 * a scan meanwhile may load the mirror again from pages not yet
	 * vacuumed, and nothing in its load's window would tell it. So the
	 * pass ends with one more invalidation, whether it completes or fails
	 * (a failed pass leaves those entries off the pages for good, and the
	 * next VACUUM, which lets the heap reuse their TIDs, would not report
	 * them): every mirror loaded during the pass goes.
	 */
	PG_TRY();
	{
		WalkLists(info, stats, callback, callback_state, mp);
	}
	PG_CATCH();
	{
		if (mp->invalidated)
			(void) GpuIvfpqServiceLogInvalidate(info->index);
		PG_RE_THROW();
	}
	PG_END_TRY();
	if (mirror.invalidated)
		mirror.pos = Max(mirror.pos, GpuIvfpqServiceLogInvalidate(info->index));

	/*
	 * A pass that failed after removing entries logged its invalidation but
	 * could not wait for it; this pass lets the heap reuse those TIDs too
	 * (its own walk finds nothing of them), so it waits for everything
	 * logged before it returns. The service applies the log in order, so
	 * this is the backlog at most.
	 */
	mirror.pos = Max(mirror.pos, GpuIvfpqServiceLogPosition());

	/*
	 * The GPU mirror loses the removed entries before VACUUM lets the heap
	 * reuse their TIDs, so a mirror never offers a TID for a row it no
	 * longer describes: removed in place (no reload), or after a large
	 * removal dropped and reloaded from the pages on next use. Entries moved
	 * within a page stay in their list: the mirror does not care where on
	 * the page.
	 */
	GpuIvfpqServiceWaitApplied(mirror.pos);
	return stats;
}

/*
 * amvacuumcleanup: reports sizes; counts entries when no bulk delete ran.
 *
 * Counting reads every list page. A VACUUM that removed nothing from the
 * index leaves nothing to clean up, so an autovacuum worker (which runs
 * such VACUUMs for every batch of inserts, from
 * autovacuum_vacuum_insert_threshold) returns at once, leaving the index's
 * statistics as they were, as btree and pgvector do (the extension's own
 * estimates take the table's reltuples too: GpuIvfpqRowsEstimate); a
 * VACUUM someone asked for still counts, so that reltuples is exact after
 * it.
 */
IndexBulkDeleteResult *
gpuivfpqvacuumcleanup(IndexVacuumInfo *info, IndexBulkDeleteResult *stats)
{
	if (info->analyze_only)
		return stats;
	if (stats == NULL && GpuIvfpqInAutovacuumWorker())
		return NULL;
	if (stats == NULL)
	{
		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
		WalkLists(info, stats, NULL, NULL, NULL);
	}
	stats->num_pages = RelationGetNumberOfBlocks(info->index);
	return stats;
}
