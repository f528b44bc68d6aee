// Pages of a gpu_metric index: the metapage, the chain of object pages (the
// words with their heap TIDs and the method's part: a List of Clusters'
// cluster number, an SSS's pivot distances) and the chain of cluster pages;
// the checks every reader makes before trusting them; the restore of an
// index's whole state; and the WAL-logged writes of builds and inserts
// (GenericXLog: crash-safe, replayed on standbys).
//
// Locking: every reader and writer takes the metapage's buffer lock first
// and holds it while it reads or writes other pages (share to read the
// state, exclusive to insert or VACUUM), and every WAL record that changes
// an object or cluster page registers the metapage too, with its change
// count. So a reader that holds the metapage sees no change half made, on a
// primary or during replay on a standby.
#include "metric/am.h"

/* Formats a page of the given kind with gpu_metric's special space. */
void
GpuMetricInitPage(Page page, uint16 kind)
{
	GpuMetricPageOpaque opaque;

	PageInit(page, BLCKSZ, sizeof(GpuMetricPageOpaqueData));
	opaque = GpuMetricPageGetOpaque(page);
	opaque->next = InvalidBlockNumber;
	opaque->flags = kind;
	opaque->page_id = GPU_METRIC_PAGE_ID;
}

/* What a page kind is called in messages. */
static const char *
PageKindName(uint16 kind)
{
	switch (kind)
	{
		case GPU_METRIC_PAGE_META:
			return "metapage";
		case GPU_METRIC_PAGE_OBJECTS:
			return "object page";
		case GPU_METRIC_PAGE_CLUSTERS:
			return "cluster page";
	}
	return "page of an unknown type";
}

/* Errors unless block blk's page is a gpu_metric page of the given kind. */
static void
CheckPage(Relation index, BlockNumber blk, Page page, uint16 kind)
{
	GpuMetricPageOpaque opaque;

	if (PageIsNew(page))
		GpuMetricReportCorrupt(index, blk, "page is uninitialized (all zeros) where a %s belongs",
							   PageKindName(kind));
	/* pd_special first: a corrupt one would point the opaque outside the page. */
	if (((PageHeader) page)->pd_special != GPU_METRIC_SPECIAL_OFFSET)
		GpuMetricReportCorrupt(index, blk, "special space starts at %u where a gpu_metric %s has it at %d",
							   (unsigned int) ((PageHeader) page)->pd_special, PageKindName(kind),
							   (int) GPU_METRIC_SPECIAL_OFFSET);
	opaque = GpuMetricPageGetOpaque(page);
	if (opaque->page_id != GPU_METRIC_PAGE_ID)
		GpuMetricReportCorrupt(index, blk, "page id 0x%04X is not gpu_metric's 0x%04X (a %s belongs here)",
							   (unsigned int) opaque->page_id, GPU_METRIC_PAGE_ID, PageKindName(kind));
	if (opaque->flags != kind)
		GpuMetricReportCorrupt(index, blk, "%s (type %u) where a %s belongs",
							   PageKindName(opaque->flags), (unsigned int) opaque->flags, PageKindName(kind));
}

/* The bytes of content on page blk of the given kind, checked. */
static int
PageUsed(Relation index, BlockNumber blk, Page page, uint16 kind)
{
	int			used = (int) ((PageHeader) page)->pd_lower - (int) MAXALIGN(SizeOfPageHeaderData);

	CheckPage(index, blk, page, kind);
	if (used < 0 || used > GPU_METRIC_PAGE_CONTENT)
		GpuMetricReportCorrupt(index, blk, "%s's pd_lower %u lies outside its content",
							   PageKindName(kind), (unsigned int) ((PageHeader) page)->pd_lower);
	if (kind == GPU_METRIC_PAGE_CLUSTERS && used % (int) sizeof(GpuMetricClusterEntry) != 0)
		GpuMetricReportCorrupt(index, blk, "cluster page's pd_lower %u does not end a whole entry",
							   (unsigned int) ((PageHeader) page)->pd_lower);
	return used;
}

/* The bytes of records on object page blk, checked. */
int
GpuMetricObjectPageUsed(Relation index, BlockNumber blk, Page page)
{
	return PageUsed(index, blk, page, GPU_METRIC_PAGE_OBJECTS);
}

/*
 * Checks the next page of a chain before it is read: within the index, and
 * no more pages than the index has (else the chain loops). from is the page
 * that points at blk (InvalidBlockNumber: the metapage).
 */
static void
ChainStep(Relation index, BlockNumber *nblocks, BlockNumber *pages, BlockNumber from, BlockNumber blk)
{
	if (blk >= *nblocks)
		*nblocks = RelationGetNumberOfBlocks(index);
	if (blk >= *nblocks || blk == GPU_METRIC_METAPAGE_BLKNO)
		GpuMetricReportCorrupt(index, from == InvalidBlockNumber ? GPU_METRIC_METAPAGE_BLKNO : from,
							   "next page %u is not a page of the index (blocks 1..%u)", blk, *nblocks - 1);
	if (++*pages > *nblocks)
		GpuMetricReportCorrupt(index, from, "chain goes on to block %u after more pages than the index has (%u): it loops",
							   blk, *nblocks);
}

/*
 * Errors unless meta, copied from the metapage, describes an index this
 * build reads: every field a reader sizes memory or loops by is checked.
 */
void
GpuMetricCheckMeta(Relation index, const GpuMetricMetaPageData *meta)
{
	const BlockNumber blk = GPU_METRIC_METAPAGE_BLKNO;

	if (meta->magic != GPU_METRIC_MAGIC)
		GpuMetricReportCorrupt(index, blk, "metapage magic 0x%08X is not gpu_metric's 0x%08X",
							   meta->magic, GPU_METRIC_MAGIC);
	if (meta->version != GPU_METRIC_VERSION)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("gpu_metric index \"%s\" has format version %u, this build reads version %d",
						RelationGetRelationName(index), meta->version, GPU_METRIC_VERSION),
				 errhint("REINDEX the index.")));
	if (meta->method != GPU_METRIC_METHOD_LC && meta->method != GPU_METRIC_METHOD_SSS)
		GpuMetricReportCorrupt(index, blk, "metapage method %u is none that gpu_metric knows", meta->method);
	if (meta->objects >= UINT32_MAX || meta->live > meta->objects)
		GpuMetricReportCorrupt(index, blk, "metapage counts %llu live of %llu objects",
							   (unsigned long long) meta->live, (unsigned long long) meta->objects);
	if (meta->objects > 0 && meta->object_head == InvalidBlockNumber)
		GpuMetricReportCorrupt(index, blk, "metapage counts %llu objects and no object page",
							   (unsigned long long) meta->objects);
	if ((meta->object_head == InvalidBlockNumber) != (meta->object_tail == InvalidBlockNumber))
		GpuMetricReportCorrupt(index, blk, "metapage has an object chain head %u and tail %u",
							   meta->object_head, meta->object_tail);
	/*
	 * A chain that starts or ends on the metapage, or whose tails are one
	 * page, would have an insert lock a page it already holds: it would
	 * wait on itself, past any cancel.
	 */
	if (meta->object_head == blk || meta->object_tail == blk || meta->cluster_head == blk ||
		meta->cluster_tail == blk ||
		(meta->object_tail != InvalidBlockNumber && meta->object_tail == meta->cluster_tail))
		GpuMetricReportCorrupt(index, blk, "metapage chains start or end at blocks %u, %u, %u and %u",
							   meta->object_head, meta->object_tail, meta->cluster_head, meta->cluster_tail);
	if (meta->method == GPU_METRIC_METHOD_LC)
	{
		if (meta->bucket < 1 || meta->bucket > GPU_METRIC_MAX_BUCKET)
			GpuMetricReportCorrupt(index, blk, "metapage bucket size %u is outside 1..%d",
								   meta->bucket, GPU_METRIC_MAX_BUCKET);
		if (meta->clusters > meta->objects || (meta->clusters == 0) != (meta->objects == 0))
			GpuMetricReportCorrupt(index, blk, "metapage counts %u clusters for %llu objects",
								   meta->clusters, (unsigned long long) meta->objects);
		if ((meta->cluster_head == InvalidBlockNumber) != (meta->clusters == 0) ||
			(meta->cluster_tail == InvalidBlockNumber) != (meta->clusters == 0))
			GpuMetricReportCorrupt(index, blk, "metapage has a cluster chain head %u and tail %u for %u clusters",
								   meta->cluster_head, meta->cluster_tail, meta->clusters);
	}
	else
	{
		if (!(meta->alpha > 0.0 && meta->alpha <= 1.0))
			GpuMetricReportCorrupt(index, blk, "metapage alpha %g is outside (0, 1]", meta->alpha);
		if (meta->pivots > GPU_METRIC_MAX_PIVOTS || meta->pivots > meta->objects)
			GpuMetricReportCorrupt(index, blk, "metapage counts %u pivots for %llu objects (at most %d)",
								   meta->pivots, (unsigned long long) meta->objects, GPU_METRIC_MAX_PIVOTS);
	}
}

/* Copies the metapage out of metabuf (locked by the caller) and checks it. */
void
GpuMetricReadMeta(Relation index, Buffer metabuf, GpuMetricMetaPageData *meta)
{
	Page		page = BufferGetPage(metabuf);

	CheckPage(index, GPU_METRIC_METAPAGE_BLKNO, page, GPU_METRIC_PAGE_META);
	memcpy(meta, GpuMetricPageGetMeta(page), sizeof(*meta));
	GpuMetricCheckMeta(index, meta);
}

/*
 * Reads the record at off of an object page (base: PageGetContents, used:
 * its bytes of records) into hdr, checking that it lies within them, and
 * returns the offset of the next record.
 */
int
GpuMetricNextObject(Relation index, const GpuMetricMetaPageData *meta, BlockNumber blk,
					const char *base, int used, int off, GpuMetricObjectHeader *hdr)
{
	int			reclen;
	uint8		known = meta->method == GPU_METRIC_METHOD_SSS ? GPU_METRIC_OBJ_FLAGS : GPU_METRIC_OBJ_REMOVED;

	if (off + GPU_METRIC_OBJ_HEADER > used)
		GpuMetricReportCorrupt(index, blk, "object record at offset %d runs past the page's %d bytes of records",
							   off, used);
	memcpy(hdr, base + off, GPU_METRIC_OBJ_HEADER);
	/* Block 0xFFFFFFFF would read as "extend the table" in a heap fetch. */
	if (ItemPointerGetBlockNumberNoCheck(&hdr->tid) == InvalidBlockNumber ||
		ItemPointerGetOffsetNumberNoCheck(&hdr->tid) < FirstOffsetNumber ||
		ItemPointerGetOffsetNumberNoCheck(&hdr->tid) > MaxHeapTuplesPerPage)
		GpuMetricReportCorrupt(index, blk, "object record at offset %d holds heap TID (%u,%u), which no row can have",
							   off, ItemPointerGetBlockNumberNoCheck(&hdr->tid),
							   (unsigned int) ItemPointerGetOffsetNumberNoCheck(&hdr->tid));
	if (hdr->flags & ~known)
		GpuMetricReportCorrupt(index, blk, "object record at offset %d has unknown flags 0x%02X",
							   off, (unsigned int) hdr->flags);
	if (hdr->nbytes > GPU_METRIC_MAX_WORD_BYTES)
		GpuMetricReportCorrupt(index, blk, "object record at offset %d holds a word of %u bytes, more than %d",
							   off, (unsigned int) hdr->nbytes, GPU_METRIC_MAX_WORD_BYTES);
	reclen = GPU_METRIC_OBJ_HEADER + GpuMetricObjectExtra(meta) + hdr->nbytes;
	if (off + reclen > used)
		GpuMetricReportCorrupt(index, blk, "object record at offset %d (%d bytes) runs past the page's %d bytes of records",
							   off, reclen, used);
	return off + reclen;
}

/*
 * The index's whole state, for the engine to restore (palloc'd in the
 * current memory context), each object's heap TID in *tids, and where the
 * object records end (the last object page and its bytes of records, for a
 * later catch-up). The caller holds the metapage's lock (share or
 * exclusive) and read meta under it, so no insert or VACUUM changes the
 * pages meanwhile.
 */
GpuMetricStoredState *
GpuMetricReadState(Relation index, const GpuMetricMetaPageData *meta, ItemPointerData **tids,
				   BlockNumber *end_blk, int *end_off)
{
	GpuMetricStoredState *s = (GpuMetricStoredState *) palloc0(sizeof(GpuMetricStoredState));
	uint64		n = meta->objects;
	bool		lc = meta->method == GPU_METRIC_METHOD_LC;
	int			extra = GpuMetricObjectExtra(meta);
	ItemPointerData *tid = (ItemPointerData *) palloc_extended(sizeof(ItemPointerData) * Max(n, 1), MCXT_ALLOC_HUGE);
	uint8	   *removed = (uint8 *) palloc_extended(Max(n, 1), MCXT_ALLOC_HUGE);
	uint64	   *offsets = (uint64 *) palloc_extended(sizeof(uint64) * (n + 1), MCXT_ALLOC_HUGE);
	uint32	   *cluster_of = NULL;
	uint8	   *table = NULL;
	uint32	   *pivot_ids = NULL;
	Size		cap = Max((Size) 1024, (Size) n * 12);
	Size		nbytes = 0;
	char	   *bytes = (char *) palloc_extended(cap, MCXT_ALLOC_HUGE);
	uint64		id = 0;
	uint64		live = 0;
	uint32		npivots = 0;
	BlockNumber nblocks = RelationGetNumberOfBlocks(index);
	BlockNumber pages = 0;
	BlockNumber from = InvalidBlockNumber;

	if (lc)
		cluster_of = (uint32 *) palloc_extended(sizeof(uint32) * Max(n, 1), MCXT_ALLOC_HUGE);
	else
	{
		table = (uint8 *) palloc_extended(Max((Size) n * meta->pivots, 1), MCXT_ALLOC_HUGE);
		pivot_ids = (uint32 *) palloc(sizeof(uint32) * Max(meta->pivots, 1));
	}
	offsets[0] = 0;
	*end_blk = InvalidBlockNumber;
	*end_off = 0;
	for (BlockNumber blk = meta->object_head; blk != InvalidBlockNumber;)
	{
		Buffer		buf;
		Page		page;
		const char *base;
		int			used;

		ChainStep(index, &nblocks, &pages, from, blk);
		buf = ReadBuffer(index, blk);
		LockBuffer(buf, BUFFER_LOCK_SHARE);
		page = BufferGetPage(buf);
		used = GpuMetricObjectPageUsed(index, blk, page);
		base = (const char *) PageGetContents(page);
		for (int off = 0; off < used;)
		{
			GpuMetricObjectHeader hdr;
			int			next = GpuMetricNextObject(index, meta, blk, base, used, off, &hdr);
			const char *part = base + off + GPU_METRIC_OBJ_HEADER;

			if (id >= n)
				GpuMetricReportCorrupt(index, blk, "object pages hold more objects than the metapage counts (%llu)",
									   (unsigned long long) n);
			tid[id] = hdr.tid;
			removed[id] = (hdr.flags & GPU_METRIC_OBJ_REMOVED) != 0;
			live += !removed[id];
			if (lc)
			{
				memcpy(&cluster_of[id], part, sizeof(uint32));
				if (cluster_of[id] >= meta->clusters)
					GpuMetricReportCorrupt(index, blk, "object %llu is in cluster %u of %u",
										   (unsigned long long) id, cluster_of[id], meta->clusters);
			}
			else
			{
				memcpy(table + (Size) id * meta->pivots, part, meta->pivots);
				if (hdr.flags & GPU_METRIC_OBJ_PIVOT)
				{
					if (npivots >= meta->pivots)
						GpuMetricReportCorrupt(index, blk, "object pages hold more pivots than the metapage counts (%u)",
											   meta->pivots);
					pivot_ids[npivots++] = (uint32) id;
				}
			}
			if (nbytes + hdr.nbytes > cap)
			{
				cap = Max(cap * 2, nbytes + hdr.nbytes);
				bytes = (char *) repalloc_huge(bytes, cap);
			}
			memcpy(bytes + nbytes, part + extra, hdr.nbytes);
			nbytes += hdr.nbytes;
			offsets[++id] = nbytes;
			off = next;
		}
		*end_blk = blk;
		*end_off = used;
		from = blk;
		blk = GpuMetricPageGetOpaque(page)->next;
		UnlockReleaseBuffer(buf);
	}
	if (id != n || live != meta->live)
		GpuMetricReportCorrupt(index, GPU_METRIC_METAPAGE_BLKNO,
							   "object pages hold %llu objects (%llu live), the metapage counts %llu (%llu live)",
							   (unsigned long long) id, (unsigned long long) live,
							   (unsigned long long) n, (unsigned long long) meta->live);
	if (!lc && npivots != meta->pivots)
		GpuMetricReportCorrupt(index, GPU_METRIC_METAPAGE_BLKNO,
							   "object pages hold %u pivots, the metapage counts %u", npivots, meta->pivots);

	s->method = (int) meta->method;
	s->n = (size_t) n;
	s->bytes = bytes;
	s->offsets = offsets;
	s->removed = removed;
	if (lc)
	{
		uint32	   *centres = (uint32 *) palloc(sizeof(uint32) * Max(meta->clusters, 1));
		uint32	   *radii = (uint32 *) palloc(sizeof(uint32) * Max(meta->clusters, 1));
		uint32		c = 0;

		pages = 0;
		from = InvalidBlockNumber;
		for (BlockNumber blk = meta->cluster_head; blk != InvalidBlockNumber;)
		{
			Buffer		buf;
			Page		page;
			int			used;
			int			count;

			ChainStep(index, &nblocks, &pages, from, blk);
			buf = ReadBuffer(index, blk);
			LockBuffer(buf, BUFFER_LOCK_SHARE);
			page = BufferGetPage(buf);
			used = PageUsed(index, blk, page, GPU_METRIC_PAGE_CLUSTERS);
			count = used / (int) sizeof(GpuMetricClusterEntry);
			if (c + (uint32) count > meta->clusters)
				GpuMetricReportCorrupt(index, blk, "cluster pages hold more clusters than the metapage counts (%u)",
									   meta->clusters);
			for (int i = 0; i < count; i++)
			{
				GpuMetricClusterEntry e;

				memcpy(&e, (const char *) PageGetContents(page) + i * sizeof(e), sizeof(e));
				/* A centre is an object of its own cluster (so no object centres two). */
				if (e.centre >= n || cluster_of[e.centre] != c)
					GpuMetricReportCorrupt(index, blk, "cluster %u is centred on object %u, %s", c, e.centre,
										   e.centre >= n ? "which the index does not hold" :
										   "which belongs to another cluster");
				centres[c] = e.centre;
				radii[c] = e.radius;
				c++;
			}
			from = blk;
			blk = GpuMetricPageGetOpaque(page)->next;
			UnlockReleaseBuffer(buf);
		}
		if (c != meta->clusters)
			GpuMetricReportCorrupt(index, GPU_METRIC_METAPAGE_BLKNO,
								   "cluster pages hold %u clusters, the metapage counts %u", c, meta->clusters);

		s->bucket = meta->bucket;
		s->clusters = meta->clusters;
		s->centres = centres;
		s->radii = radii;
		s->cluster_of = cluster_of;
	}
	else
	{
		s->alpha = meta->alpha;
		s->max_distance = meta->max_distance;
		s->pivots = meta->pivots;
		s->pivot_ids = pivot_ids;
		s->table = table;
	}
	*tids = tid;
	return s;
}

/*
 * Writes meta to the metapage in metabuf (exclusively locked by the
 * caller), WAL-logged; full_image formats the page first (builds).
 */
void
GpuMetricWriteMeta(Relation index, Buffer metabuf, const GpuMetricMetaPageData *meta, bool full_image)
{
	GenericXLogState *state = GenericXLogStart(index);
	Page		page = GenericXLogRegisterBuffer(state, metabuf, full_image ? GENERIC_XLOG_FULL_IMAGE : 0);

	if (full_image)
		GpuMetricInitPage(page, GPU_METRIC_PAGE_META);
	memcpy(GpuMetricPageGetMeta(page), meta, sizeof(*meta));
	((PageHeader) page)->pd_lower = (char *) GpuMetricPageGetMeta(page) + sizeof(*meta) - (char *) page;
	GenericXLogFinish(state);
}

/*
 * Makes room for bytes more on the last object page: when it lacks them (or
 * there is none), links a new empty page to the chain, in a WAL record of
 * its own (an empty last page is harmless if the insert then fails). The
 * caller holds metabuf exclusively; meta is updated with the metapage.
 */
void
GpuMetricEnsureRoom(Relation index, Buffer metabuf, GpuMetricMetaPageData *meta, uint16 kind, int bytes)
{
	Buffer		tailbuf = InvalidBuffer;
	Buffer		newbuf;
	BlockNumber newblk;
	GenericXLogState *state;
	Page		mpage;
	Page		npage;

	Assert(kind == GPU_METRIC_PAGE_OBJECTS);
	if (meta->object_tail != InvalidBlockNumber)
	{
		BlockNumber nblocks = RelationGetNumberOfBlocks(index);
		BlockNumber pages = 0;

		ChainStep(index, &nblocks, &pages, InvalidBlockNumber, meta->object_tail);
		tailbuf = ReadBuffer(index, meta->object_tail);
		LockBuffer(tailbuf, BUFFER_LOCK_EXCLUSIVE);
		if (GpuMetricObjectPageUsed(index, meta->object_tail, BufferGetPage(tailbuf)) + bytes <=
			GPU_METRIC_PAGE_CONTENT)
		{
			UnlockReleaseBuffer(tailbuf);
			return;
		}
	}
	newbuf = GpuIvfpqNewBuffer(index, MAIN_FORKNUM);
	newblk = BufferGetBlockNumber(newbuf);
	state = GenericXLogStart(index);
	mpage = GenericXLogRegisterBuffer(state, metabuf, 0);
	npage = GenericXLogRegisterBuffer(state, newbuf, GENERIC_XLOG_FULL_IMAGE);
	GpuMetricInitPage(npage, GPU_METRIC_PAGE_OBJECTS);
	if (BufferIsValid(tailbuf))
		GpuMetricPageGetOpaque(GenericXLogRegisterBuffer(state, tailbuf, 0))->next = newblk;
	else
		meta->object_head = newblk;
	meta->object_tail = newblk;
	memcpy(GpuMetricPageGetMeta(mpage), meta, sizeof(*meta));
	GenericXLogFinish(state);
	UnlockReleaseBuffer(newbuf);
	if (BufferIsValid(tailbuf))
		UnlockReleaseBuffer(tailbuf);
}

/*
 * Appends one object record to the last object page (GpuMetricEnsureRoom
 * made room) and, for a List of Clusters, records its cluster: a new last
 * cluster (new_cluster), or the last cluster's grown radius; with meta (its
 * counts already advanced by the caller), in one WAL record. The caller
 * holds metabuf exclusively. Returns where the records of meta->object_tail
 * now end.
 */
int
GpuMetricAppend(Relation index, Buffer metabuf, GpuMetricMetaPageData *meta, const char *record,
				int reclen, const GpuMetricClusterEntry *cluster, bool new_cluster)
{
	Buffer		objbuf;
	Buffer		cbuf = InvalidBuffer;
	Buffer		nbuf = InvalidBuffer;
	int			used;
	int			cused = 0;
	GenericXLogState *state;
	Page		mpage;
	Page		page;

	/* Every check before the WAL record starts: nothing below can fail. */
	objbuf = ReadBuffer(index, meta->object_tail);
	LockBuffer(objbuf, BUFFER_LOCK_EXCLUSIVE);
	used = GpuMetricObjectPageUsed(index, meta->object_tail, BufferGetPage(objbuf));
	if (used + reclen > GPU_METRIC_PAGE_CONTENT)
		elog(ERROR, "gpu_metric: no room for an object record on block %u", meta->object_tail);
	if (cluster != NULL && meta->cluster_tail != InvalidBlockNumber)
	{
		cbuf = ReadBuffer(index, meta->cluster_tail);
		LockBuffer(cbuf, BUFFER_LOCK_EXCLUSIVE);
		cused = PageUsed(index, meta->cluster_tail, BufferGetPage(cbuf), GPU_METRIC_PAGE_CLUSTERS);
		if (!new_cluster)
		{
			GpuMetricClusterEntry last;

			/* The last page holds the last cluster: pages are made only with an entry. */
			if (cused == 0)
				GpuMetricReportCorrupt(index, meta->cluster_tail, "the last cluster page is empty%s", "");
			memcpy(&last, (const char *) PageGetContents(BufferGetPage(cbuf)) + cused - sizeof(last),
				   sizeof(last));
			if (last.centre != cluster->centre)
				GpuMetricReportCorrupt(index, meta->cluster_tail,
									   "the last cluster is centred on object %u, the index's on %u",
									   last.centre, cluster->centre);
		}
	}
	if (cluster != NULL && new_cluster &&
		(!BufferIsValid(cbuf) || cused + (int) sizeof(GpuMetricClusterEntry) > GPU_METRIC_PAGE_CONTENT))
		nbuf = GpuIvfpqNewBuffer(index, MAIN_FORKNUM);
	else if (cluster != NULL && !BufferIsValid(cbuf))
		elog(ERROR, "gpu_metric: a cluster grew in an index without clusters");

	state = GenericXLogStart(index);
	mpage = GenericXLogRegisterBuffer(state, metabuf, 0);
	page = GenericXLogRegisterBuffer(state, objbuf, 0);
	memcpy((char *) PageGetContents(page) + used, record, reclen);
	((PageHeader) page)->pd_lower += reclen;
	if (cluster != NULL)
	{
		if (BufferIsValid(nbuf))
		{
			BlockNumber nblk = BufferGetBlockNumber(nbuf);
			Page		npage = GenericXLogRegisterBuffer(state, nbuf, GENERIC_XLOG_FULL_IMAGE);

			GpuMetricInitPage(npage, GPU_METRIC_PAGE_CLUSTERS);
			memcpy(PageGetContents(npage), cluster, sizeof(*cluster));
			((PageHeader) npage)->pd_lower += sizeof(*cluster);
			if (BufferIsValid(cbuf))
				GpuMetricPageGetOpaque(GenericXLogRegisterBuffer(state, cbuf, 0))->next = nblk;
			else
				meta->cluster_head = nblk;
			meta->cluster_tail = nblk;
		}
		else
		{
			page = GenericXLogRegisterBuffer(state, cbuf, 0);
			if (new_cluster)
			{
				memcpy((char *) PageGetContents(page) + cused, cluster, sizeof(*cluster));
				((PageHeader) page)->pd_lower += sizeof(*cluster);
			}
			else
				memcpy((char *) PageGetContents(page) + cused - sizeof(*cluster), cluster, sizeof(*cluster));
		}
	}
	memcpy(GpuMetricPageGetMeta(mpage), meta, sizeof(*meta));
	GenericXLogFinish(state);
	UnlockReleaseBuffer(objbuf);
	if (BufferIsValid(cbuf))
		UnlockReleaseBuffer(cbuf);
	if (BufferIsValid(nbuf))
		UnlockReleaseBuffer(nbuf);
	return used + reclen;
}

/* Starts writing a chain of pages of one kind into new pages (builds). */
void
GpuMetricWriterBegin(GpuMetricPageWriter *w, Relation index, uint16 kind)
{
	memset(w, 0, sizeof(*w));
	w->index = index;
	w->kind = kind;
	w->buf = InvalidBuffer;
	w->head = InvalidBlockNumber;
	w->tail = InvalidBlockNumber;
}

/* WAL-logs the current page (a full image) and releases it. */
static void
WriterFlush(GpuMetricPageWriter *w)
{
	GenericXLogState *state = GenericXLogStart(w->index);
	Page		page = GenericXLogRegisterBuffer(state, w->buf, GENERIC_XLOG_FULL_IMAGE);

	memcpy(page, w->image.data, BLCKSZ);
	GenericXLogFinish(state);
	UnlockReleaseBuffer(w->buf);
	w->buf = InvalidBuffer;
}

/* Appends len bytes (one record: never split) to the chain, on a new page when full. */
void
GpuMetricWriterAdd(GpuMetricPageWriter *w, const void *data, int len)
{
	Page		image = (Page) w->image.data;

	Assert(len <= GPU_METRIC_PAGE_CONTENT);
	if (!BufferIsValid(w->buf) ||
		(int) ((PageHeader) image)->pd_lower + len > (int) MAXALIGN(SizeOfPageHeaderData) + GPU_METRIC_PAGE_CONTENT)
	{
		/* The next page first: the current one links to it before it is logged. */
		Buffer		next = GpuIvfpqNewBuffer(w->index, MAIN_FORKNUM);
		BlockNumber blk = BufferGetBlockNumber(next);

		if (BufferIsValid(w->buf))
		{
			GpuMetricPageGetOpaque(image)->next = blk;
			WriterFlush(w);
		}
		else
			w->head = blk;
		w->buf = next;
		w->tail = blk;
		w->pages++;
		GpuMetricInitPage(image, w->kind);
	}
	memcpy((char *) image + ((PageHeader) image)->pd_lower, data, len);
	((PageHeader) image)->pd_lower += len;
}

/* Writes the last page of the chain. */
void
GpuMetricWriterEnd(GpuMetricPageWriter *w)
{
	if (BufferIsValid(w->buf))
		WriterFlush(w);
}
