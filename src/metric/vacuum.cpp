// VACUUM of a gpu_metric index: the records of dead rows are marked
// removed, not erased. Their words stay because the index may route
// through them (a List of Clusters' centre, an SSS pivot keep their roles);
// no search reports a removed object. REINDEX reclaims the space.
#include "metric/am.h"

/*
 * Walks the object pages; with a callback, marks the records it reports
 * dead removed, one WAL record per page changed (with the metapage, whose
 * live count and change count it updates). Counts live records into stats.
 */
static void
WalkObjects(IndexVacuumInfo *info, IndexBulkDeleteResult *stats, IndexBulkDeleteCallback callback,
			void *callback_state)
{
	Relation	index = info->index;
	Buffer		metabuf = ReadBuffer(index, GPU_METRIC_METAPAGE_BLKNO);
	GpuMetricMetaPageData meta;
	BlockNumber blk;
	BlockNumber nblocks = RelationGetNumberOfBlocks(index);
	BlockNumber pages = 0;
	int			offsets[GPU_METRIC_PAGE_CONTENT / GPU_METRIC_OBJ_HEADER + 1];

	LockBuffer(metabuf, BUFFER_LOCK_SHARE);
	GpuMetricReadMeta(index, metabuf, &meta);
	blk = meta.object_head;
	LockBuffer(metabuf, BUFFER_LOCK_UNLOCK);

	while (blk != InvalidBlockNumber)
	{
		Buffer		buf;
		Page		page;
		const char *base;
		int			used;
		int			dead = 0;
		BlockNumber next;

		GpuIvfpqVacuumDelayPoint();
		if (blk >= nblocks)
			nblocks = RelationGetNumberOfBlocks(index);
		if (blk >= nblocks || blk == GPU_METRIC_METAPAGE_BLKNO || ++pages > nblocks)
			GpuMetricReportCorrupt(index, blk, "object chain reaches block %u, not a page of its chain (%u blocks)",
								   blk, nblocks);
		/* Metapage first, as every writer and reader locks them. */
		LockBuffer(metabuf, callback ? BUFFER_LOCK_EXCLUSIVE : BUFFER_LOCK_SHARE);
		GpuMetricReadMeta(index, metabuf, &meta);
		buf = ReadBufferExtended(index, MAIN_FORKNUM, blk, RBM_NORMAL, info->strategy);
		LockBuffer(buf, callback ? BUFFER_LOCK_EXCLUSIVE : BUFFER_LOCK_SHARE);
		page = BufferGetPage(buf);
		used = GpuMetricObjectPageUsed(index, blk, page);
		base = (const char *) PageGetContents(page);
		for (int off = 0; off < used;)
		{
			GpuMetricObjectHeader hdr;
			int			nextoff = GpuMetricNextObject(index, &meta, blk, base, used, off, &hdr);

			if (!(hdr.flags & GPU_METRIC_OBJ_REMOVED))
			{
				if (callback && callback(&hdr.tid, callback_state))
					offsets[dead++] = off;
				else
					stats->num_index_tuples++;
			}
			off = nextoff;
		}
		if (dead > 0)
		{
			GenericXLogState *state = GenericXLogStart(index);
			Page		mpage = GenericXLogRegisterBuffer(state, metabuf, 0);
			char	   *wbase = (char *) PageGetContents(GenericXLogRegisterBuffer(state, buf, 0));

			for (int i = 0; i < dead; i++)
				wbase[offsets[i] + GPU_METRIC_OBJ_FLAGS_OFFSET] |= GPU_METRIC_OBJ_REMOVED;
			meta.live -= dead;
			meta.change_count++;
			meta.vacuum_count++;
			memcpy(GpuMetricPageGetMeta(mpage), &meta, sizeof(meta));
			GenericXLogFinish(state);
			stats->tuples_removed += dead;
		}
		next = GpuMetricPageGetOpaque(page)->next;
		UnlockReleaseBuffer(buf);
		LockBuffer(metabuf, BUFFER_LOCK_UNLOCK);
		blk = next;
	}
	ReleaseBuffer(metabuf);
}

/* ambulkdelete: marks the records of dead heap tuples removed. */
IndexBulkDeleteResult *
gpumetricbulkdelete(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
					IndexBulkDeleteCallback callback, void *callback_state)
{
	if (stats == NULL)
		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
	stats->num_index_tuples = 0;
	WalkObjects(info, stats, callback, callback_state);
	return stats;
}

/* amvacuumcleanup: reports sizes; counts live entries when no bulk delete ran. */
IndexBulkDeleteResult *
gpumetricvacuumcleanup(IndexVacuumInfo *info, IndexBulkDeleteResult *stats)
{
	if (info->analyze_only)
		return stats;
	if (stats == NULL)
	{
		Buffer		metabuf = ReadBuffer(info->index, GPU_METRIC_METAPAGE_BLKNO);
		GpuMetricMetaPageData meta;

		stats = (IndexBulkDeleteResult *) palloc0(sizeof(IndexBulkDeleteResult));
		LockBuffer(metabuf, BUFFER_LOCK_SHARE);
		GpuMetricReadMeta(info->index, metabuf, &meta);
		UnlockReleaseBuffer(metabuf);
		stats->num_index_tuples = (double) meta.live;
	}
	stats->num_pages = RelationGetNumberOfBlocks(info->index);
	return stats;
}
