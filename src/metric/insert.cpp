// aminsert of gpu_metric: the engine's insert rule applied to the backend's
// restored copy of the index, then what it changed written to the pages
// (a new object record; for a List of Clusters a new last cluster or the
// last one's grown radius) in one WAL record with the metapage.
#include "metric/am.h"
#include "common/guard.h"
#include "engine/metric/lc_index.h"

/* Inserts one row's word: NULLs are not indexed. */
bool
gpumetricinsert(Relation index, Datum *values, bool *isnull, ItemPointer heap_tid,
				Relation heap, IndexUniqueCheck checkUnique,
				bool indexUnchanged, IndexInfo *indexInfo)
{
	MemoryContext ctx;
	MemoryContext old;
	GpuMetricMetaPageData meta;
	GpuMetricCached *entry;
	GpuMetricPlacement placement;
	GpuMetricObjectHeader hdr;
	GpuMetricClusterEntry cluster;
	bool		has_cluster = false;
	Buffer		metabuf;
	char	   *utf8;
	uint32	   *cps;
	char	   *record;
	int			len;
	int			ncp;
	int			extra;
	int			reclen;
	int			end_off;

	if (isnull[0])
		return false;

	ctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_metric insert", ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(ctx);
	utf8 = GpuMetricDatumUtf8(values[0], &len);
	GpuMetricCheckWordBytes(index, len);
	cps = GpuMetricCodePoints(utf8, len, &ncp);

	/* The metapage's exclusive lock orders inserts and VACUUM, and keeps readers out meanwhile. */
	metabuf = ReadBuffer(index, GPU_METRIC_METAPAGE_BLKNO);
	LockBuffer(metabuf, BUFFER_LOCK_EXCLUSIVE);
	GpuMetricReadMeta(index, metabuf, &meta);
	if (meta.objects + 1 >= UINT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("gpu_metric index \"%s\" holds %llu entries, the most it can",
						RelationGetRelationName(index), (unsigned long long) meta.objects),
				 errhint("REINDEX the index: a rebuild drops the entries of deleted rows.")));
	extra = GpuMetricObjectExtra(&meta);
	reclen = GPU_METRIC_OBJ_HEADER + extra + len;
	GpuMetricEnsureRoom(index, metabuf, &meta, GPU_METRIC_PAGE_OBJECTS, reclen);
	entry = GpuMetricGetCachedLocked(index, &meta);
	GpuMetricCacheReserve(entry, len);
	record = (char *) palloc(reclen);

	/* Until the pages say what the engine did, the copy is ahead of them. */
	entry->valid = false;
	GpuIvfpqGuard("insert", [&] { entry->engine->insert((const uint32_t *) cps, (size_t) ncp, &placement); });
	if (placement.id != meta.objects)
		GpuMetricReportCorrupt(index, GPU_METRIC_METAPAGE_BLKNO,
							   "the metapage counts %llu objects, the restored index %u",
							   (unsigned long long) meta.objects, placement.id);

	memset(&hdr, 0, sizeof(hdr));
	hdr.tid = *heap_tid;
	hdr.nbytes = (uint16) len;
	memcpy(record, &hdr, GPU_METRIC_OBJ_HEADER);
	if (meta.method == GPU_METRIC_METHOD_LC)
	{
		memcpy(record + GPU_METRIC_OBJ_HEADER, &placement.cluster, sizeof(uint32));
		if (placement.new_cluster || placement.radius_grew)
		{
			cluster.centre = entry->engine->lc()->centre(placement.cluster);
			cluster.radius = placement.radius;
			has_cluster = true;
		}
		if (placement.new_cluster)
			meta.clusters++;
	}
	else
		memcpy(record + GPU_METRIC_OBJ_HEADER, placement.row, extra);
	memcpy(record + GPU_METRIC_OBJ_HEADER + extra, utf8, len);
	meta.objects++;
	meta.live++;
	meta.change_count++;
	end_off = GpuMetricAppend(index, metabuf, &meta, record, reclen, has_cluster ? &cluster : NULL,
							  placement.new_cluster);

	GpuMetricCacheAppend(entry, heap_tid, utf8, len);
	entry->change_count = meta.change_count;
	entry->end_blk = meta.object_tail;
	entry->end_off = end_off;
	entry->valid = true;
	UnlockReleaseBuffer(metabuf);

	MemoryContextSwitchTo(old);
	MemoryContextDelete(ctx);
	return false;
}
