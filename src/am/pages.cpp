// Page-level storage of the index: metapage, float blobs (centroids and
// codebooks), the list directory and appends to inverted-list chains; and
// the checks every reader of those pages makes before trusting them.
#include "am/am.h"
#include "engine/distances.h"

/* Formats a page of the given kind with the common special space. */
void
GpuIvfpqInitPage(Page page, uint16 flags)
{
	GpuIvfpqPageOpaque opaque;

	PageInit(page, BLCKSZ, sizeof(GpuIvfpqPageOpaqueData));
	opaque = GpuIvfpqPageGetOpaque(page);
	opaque->next = InvalidBlockNumber;
	opaque->flags = flags;
	opaque->page_id = GPU_IVFPQ_PAGE_ID;
}

/* Extends the relation by one page, returned pinned and exclusively locked. */
Buffer
GpuIvfpqNewBuffer(Relation index, ForkNumber fork)
{
	Buffer		buf;
	bool		need_lock = !RELATION_IS_LOCAL(index);

	if (need_lock)
		LockRelationForExtension(index, ExclusiveLock);
	buf = ReadBufferExtended(index, fork, P_NEW, RBM_NORMAL, NULL);
	LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
	if (need_lock)
		UnlockRelationForExtension(index, ExclusiveLock);
	return buf;
}

/* What a page kind is called in messages. */
static const char *
PageKindName(uint16 kind)
{
	switch (kind)
	{
		case GPU_IVFPQ_PAGE_META:
			return "metapage";
		case GPU_IVFPQ_PAGE_BLOB:
			return "data page";
		case GPU_IVFPQ_PAGE_LISTDIR:
			return "list directory page";
		case GPU_IVFPQ_PAGE_LIST:
			return "list page";
	}
	return "page of an unknown type";
}

/*
 * Reports the first invariant that block blk's page breaks for
 * GpuIvfpqCheckPage (a page of this kind) or GpuIvfpqListPageEntries
 * (entries laid out as el says; list named when not -1).
 */
void
GpuIvfpqReportBadPage(Relation index, BlockNumber blk, Page page, uint16 kind,
					  const GpuIvfpqEntryLayout *el, int list)
{
	PageHeader	header = (PageHeader) page;
	GpuIvfpqPageOpaque opaque;
	int			used = (int) header->pd_lower - (int) MAXALIGN(SizeOfPageHeaderData);
	int			esz = el != NULL ? el->size : 1;
	char		what[32];

	if (PageIsNew(page))
		GpuIvfpqReportCorrupt(index, blk, "page is uninitialized (all zeros) where a %s belongs",
							  PageKindName(kind));
	if (header->pd_special != GPU_IVFPQ_SPECIAL_OFFSET)
		GpuIvfpqReportCorrupt(index, blk, "special space starts at %u where a gpu_ivfpq %s has it at %d",
							  (unsigned int) header->pd_special, PageKindName(kind),
							  (int) GPU_IVFPQ_SPECIAL_OFFSET);
	opaque = GpuIvfpqPageGetOpaque(page);
	if (opaque->page_id != GPU_IVFPQ_PAGE_ID)
		GpuIvfpqReportCorrupt(index, blk, "page id 0x%04X is not gpu_ivfpq's 0x%04X (a %s belongs here)",
							  (unsigned int) opaque->page_id, GPU_IVFPQ_PAGE_ID, PageKindName(kind));
	if (opaque->flags != kind)
		GpuIvfpqReportCorrupt(index, blk, "%s (type %u) where a %s belongs",
							  PageKindName(opaque->flags), (unsigned int) opaque->flags, PageKindName(kind));

	Assert(kind == GPU_IVFPQ_PAGE_LIST);
	if (list >= 0)
		snprintf(what, sizeof(what), "list %d", list);
	else
		strlcpy(what, "list", sizeof(what));
	if (used < 0)
		GpuIvfpqReportCorrupt(index, blk, "%s page's pd_lower %u lies inside the page header",
							  what, (unsigned int) header->pd_lower);
	if (used % esz != 0)
		GpuIvfpqReportCorrupt(index, blk, "%s page's pd_lower %u does not end a whole %d-byte entry",
							  what, (unsigned int) header->pd_lower, esz);
	/* The vector region's start: GenericXLog keeps only what lies outside pd_lower..pd_upper. */
	if (el->vdim > 0 && used > 0 && used / esz <= el->capacity &&
		header->pd_upper != MAXALIGN(SizeOfPageHeaderData) + el->vec_offset)
		GpuIvfpqReportCorrupt(index, blk, "%s page's pd_upper %u is not where its vectors start (%d)",
							  what, (unsigned int) header->pd_upper,
							  (int) (MAXALIGN(SizeOfPageHeaderData) + el->vec_offset));
	GpuIvfpqReportCorrupt(index, blk, "%s entry count %d exceeds the page capacity %d",
						  what, used / esz, GpuIvfpqEntriesPerPage(el));
}

/* The failed check of GpuIvfpqChainStep: asks the size again, errors if blk is still wrong. */
void
GpuIvfpqChainRecheck(Relation index, GpuIvfpqChainWalk *walk, BlockNumber from, BlockNumber blk)
{
	walk->nblocks = RelationGetNumberOfBlocks(index);
	if (blk >= walk->nblocks)
	{
		if (from == InvalidBlockNumber)
			ereport(ERROR,
					(errcode(ERRCODE_INDEX_CORRUPTED),
					 errmsg("index \"%s\": a list starts at block %u, past the end of the index (%u blocks)",
							RelationGetRelationName(index), blk, walk->nblocks),
					 errhint("REINDEX the index to rebuild it from its table.")));
		GpuIvfpqReportCorrupt(index, from, "next page %u is past the end of the index (%u blocks)",
							  blk, walk->nblocks);
	}
	/* Every page of a chain is a distinct block: more pages than blocks means a loop. */
	if (walk->pages >= walk->nblocks)
		GpuIvfpqReportCorrupt(index, from, "list chain goes on to block %u after more pages than the index has (%u blocks): it loops",
							  blk, walk->nblocks);
}

/*
 * Errors unless meta, copied from the metapage, describes an index this
 * build can read: every field a reader sizes memory or pages by is checked.
 */
void
GpuIvfpqCheckMeta(Relation index, const GpuIvfpqMetaPageData *meta)
{
	const BlockNumber blk = GPU_IVFPQ_METAPAGE_BLKNO;
	uint8		trained;
	uint32		dir_pages = (meta->lists + GPU_IVFPQ_LISTDIR_PER_PAGE - 1) / GPU_IVFPQ_LISTDIR_PER_PAGE;

	if (meta->magic != GPU_IVFPQ_MAGIC)
		GpuIvfpqReportCorrupt(index, blk, "metapage magic 0x%08X is not gpu_ivfpq's 0x%08X",
							  meta->magic, GPU_IVFPQ_MAGIC);
	if (meta->version != GPU_IVFPQ_VERSION)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("gpu_ivfpq index \"%s\" has format version %u, this build reads version %d",
						RelationGetRelationName(index), meta->version, GPU_IVFPQ_VERSION),
				 errhint("REINDEX the index.")));
	if (meta->features & GPU_IVFPQ_FEATURE_RETIRED)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("gpu_ivfpq index \"%s\" was built by a development version whose list pages this build does not read",
						RelationGetRelationName(index)),
				 errhint("REINDEX the index.")));
	if (meta->features & ~(uint32) (GPU_IVFPQ_FEATURES_KNOWN | GPU_IVFPQ_FEATURE_RETIRED))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("gpu_ivfpq index \"%s\" uses format features 0x%x that this build does not read",
						RelationGetRelationName(index),
						meta->features & ~(uint32) (GPU_IVFPQ_FEATURES_KNOWN | GPU_IVFPQ_FEATURE_RETIRED)),
				 errhint("Upgrade the extension, or REINDEX the index.")));
	/* A bool holding neither 0 nor 1 must not be read as a bool. */
	memcpy(&trained, &meta->trained, 1);
	if (trained > 1)
		GpuIvfpqReportCorrupt(index, blk, "metapage trained flag is %u, not 0 or 1", (unsigned int) trained);
	if (GpuIvfpqIsRabitq(meta))
	{
		/* RaBitQ codes: bits per dimension, and m the bytes of a code with its factors. */
		if (meta->nbits < 1 || meta->nbits > 8)
			GpuIvfpqReportCorrupt(index, blk, "metapage has %u bits per dimension of RaBitQ codes, not 1..8",
								  (unsigned int) meta->nbits);
		if (meta->dimensions < 1 || meta->dimensions > GPU_IVFPQ_RABITQ_MAX_DIM ||
			meta->m != GpuIvfpqRabitqRowBytes((int) meta->dimensions, meta->nbits))
			GpuIvfpqReportCorrupt(index, blk, "metapage has %u-byte RaBitQ codes for %u dimensions of %u bits",
								  (unsigned int) meta->m, meta->dimensions, (unsigned int) meta->nbits);
		if (meta->features & (GPU_IVFPQ_FEATURE_VECTORS | GPU_IVFPQ_FEATURE_QERROR))
			GpuIvfpqReportCorrupt(index, blk, "metapage features 0x%x: RaBitQ entries keep no vectors and no PQ error",
								  meta->features);
	}
	else if (meta->features & GPU_IVFPQ_FEATURE_RABITQ)
		GpuIvfpqReportCorrupt(index, blk, "untrained index has features 0x%x: RaBitQ codes need trained quantizers",
							  meta->features);
	else if (meta->nbits != GPU_IVFPQ_NBITS)
		GpuIvfpqReportCorrupt(index, blk, "metapage has %u bits per code, gpu_ivfpq writes %d",
							  (unsigned int) meta->nbits, GPU_IVFPQ_NBITS);
	if (meta->metric > (uint8) gpuivfpq::Metric::Cosine)
		GpuIvfpqReportCorrupt(index, blk, "metapage metric %u is none that gpu_ivfpq knows",
							  (unsigned int) meta->metric);
	if (meta->dimensions > GPU_IVFPQ_MAX_DIM)
		GpuIvfpqReportCorrupt(index, blk, "metapage dimensions %u exceed the limit %d",
							  meta->dimensions, GPU_IVFPQ_MAX_DIM);
	if (meta->lists < 1 || meta->lists > GPU_IVFPQ_MAX_LISTS)
		GpuIvfpqReportCorrupt(index, blk, "metapage lists %u is outside 1..%d", meta->lists, GPU_IVFPQ_MAX_LISTS);
	if (trained && GpuIvfpqIsRabitq(meta))
		;						/* m checked above */
	else if (trained)
	{
		if (meta->m < 1 || meta->m > GPU_IVFPQ_MAX_M)
			GpuIvfpqReportCorrupt(index, blk, "metapage m %u is outside 1..%d", (unsigned int) meta->m,
								  GPU_IVFPQ_MAX_M);
		if (meta->dimensions == 0 || meta->dimensions % meta->m != 0)
			GpuIvfpqReportCorrupt(index, blk, "metapage m %u does not divide the dimensions %u",
								  (unsigned int) meta->m, meta->dimensions);
	}
	else
	{
		/* Untrained: one list of unquantized entries (build.cpp). */
		if (meta->m != 0)
			GpuIvfpqReportCorrupt(index, blk, "untrained index has m %u, expected 0", (unsigned int) meta->m);
		if (meta->lists != 1)
			GpuIvfpqReportCorrupt(index, blk, "untrained index has %u lists, expected 1", meta->lists);
	}
	if (meta->listdir_pages != dir_pages)
		GpuIvfpqReportCorrupt(index, blk, "metapage counts %u list directory pages for %u lists, expected %u",
							  meta->listdir_pages, meta->lists, dir_pages);
	/* Vector copies exist only in trained indexes, and only where an entry fits a page. */
	if ((meta->features & GPU_IVFPQ_FEATURE_VECTORS) &&
		(!trained || !GpuIvfpqVectorsFit((int) meta->dimensions, meta->m,
										 (meta->features & GPU_IVFPQ_FEATURE_FILTER) != 0)))
		GpuIvfpqReportCorrupt(index, blk, "metapage says list entries keep vectors of %u dimensions, which %s",
							  meta->dimensions, trained ? "do not fit an index page" : "an untrained index never does");
	/* The entries' filter keys exist exactly when the index has a filter column. */
	if (((meta->features & GPU_IVFPQ_FEATURE_FILTER) != 0) != GpuIvfpqHasFilterColumn(index))
		GpuIvfpqReportCorrupt(index, blk, "metapage says list entries %s filter keys, but the index has %s",
							  (meta->features & GPU_IVFPQ_FEATURE_FILTER) ? "carry" : "carry no",
							  GpuIvfpqHasFilterColumn(index) ? "a filter column" : "none");
}

/* Copies the metapage out, checking that this is a gpu_ivfpq index we can read. */
void
GpuIvfpqReadMeta(Relation index, GpuIvfpqMetaPageData *meta)
{
	Buffer		buf = ReadBuffer(index, GPU_IVFPQ_METAPAGE_BLKNO);
	Page		page;

	LockBuffer(buf, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buf);
	GpuIvfpqCheckPage(index, GPU_IVFPQ_METAPAGE_BLKNO, page, GPU_IVFPQ_PAGE_META);
	memcpy(meta, GpuIvfpqPageGetMeta(page), sizeof(GpuIvfpqMetaPageData));
	UnlockReleaseBuffer(buf);
	GpuIvfpqCheckMeta(index, meta);
}

/* Pages a blob of bytes occupies (one even when empty, as GpuIvfpqWriteBlob writes it). */
BlockNumber
GpuIvfpqBlobPages(Size bytes)
{
	return (BlockNumber) Max((Size) 1, (bytes + GPU_IVFPQ_PAGE_CONTENT - 1) / GPU_IVFPQ_PAGE_CONTENT);
}

/* Bytes of the centroids blob: lists x dim floats. */
Size
GpuIvfpqCentroidBytes(const GpuIvfpqMetaPageData *meta)
{
	return (Size) meta->lists * meta->dimensions * sizeof(float);
}

/*
 * Bytes of the codebooks blob: m x 256 x dim/m floats; in an index with
 * RaBitQ codes the rotation (dim x dim floats) and, from
 * GpuIvfpqRabitqRotatedOffset, the rotated centroids (lists x dim doubles).
 */
Size
GpuIvfpqCodebookBytes(const GpuIvfpqMetaPageData *meta)
{
	if (GpuIvfpqIsRabitq(meta))
		return (Size) gpuivfpq::rabitq_model_bytes(meta->dimensions, meta->lists);
	return (Size) 256 * meta->dimensions * sizeof(float);
}

/* Errors unless the npages pages from start, which the metapage gives to what, lie in the index. */
void
GpuIvfpqCheckExtent(Relation index, const char *what, BlockNumber start, BlockNumber npages)
{
	BlockNumber nblocks = RelationGetNumberOfBlocks(index);

	if (start == GPU_IVFPQ_METAPAGE_BLKNO || start >= nblocks || npages > nblocks - start)
		GpuIvfpqReportCorrupt(index, GPU_IVFPQ_METAPAGE_BLKNO,
							  "metapage places the %s at blocks %u..%llu, outside blocks 1..%u of the index",
							  what, start, (unsigned long long) start + npages - 1, nblocks - 1);
}

/* Errors unless block blk is a data page holding chunk bytes (its part of a blob). */
void
GpuIvfpqCheckBlobPage(Relation index, BlockNumber blk, Page page, Size chunk)
{
	Size		lower = ((PageHeader) page)->pd_lower;

	GpuIvfpqCheckPage(index, blk, page, GPU_IVFPQ_PAGE_BLOB);
	if (lower != MAXALIGN(SizeOfPageHeaderData) + chunk)
		GpuIvfpqReportCorrupt(index, blk, "data page's pd_lower %zu does not end its %zu bytes of data",
							  lower, chunk);
}

/* How many directory entries page p (from 0) of the list directory holds. */
int
GpuIvfpqListDirPageEntries(const GpuIvfpqMetaPageData *meta, uint32 p)
{
	return (int) Min((uint32) GPU_IVFPQ_LISTDIR_PER_PAGE, meta->lists - p * GPU_IVFPQ_LISTDIR_PER_PAGE);
}

/* Errors unless block blk is a list directory page holding entries entries. */
void
GpuIvfpqCheckListDirPage(Relation index, BlockNumber blk, Page page, int entries)
{
	Size		lower = ((PageHeader) page)->pd_lower;

	GpuIvfpqCheckPage(index, blk, page, GPU_IVFPQ_PAGE_LISTDIR);
	if (lower != MAXALIGN(SizeOfPageHeaderData) + MAXALIGN(sizeof(GpuIvfpqListDirEntry) * entries))
		GpuIvfpqReportCorrupt(index, blk, "list directory page's pd_lower %zu does not end its %d entries",
							  lower, entries);
}

/*
 * Writes bytes of data to new consecutive pages and returns the first block.
 * Used only while the index is being built, when nobody else extends it.
 */
BlockNumber
GpuIvfpqWriteBlob(Relation index, const void *data, Size bytes)
{
	const char *src = (const char *) data;
	BlockNumber start = InvalidBlockNumber;
	Size		done = 0;

	while (done < bytes || start == InvalidBlockNumber)
	{
		Buffer		buf = GpuIvfpqNewBuffer(index, MAIN_FORKNUM);
		GenericXLogState *state = GenericXLogStart(index);
		Page		page = GenericXLogRegisterBuffer(state, buf, GENERIC_XLOG_FULL_IMAGE);
		Size		chunk = Min((Size) GPU_IVFPQ_PAGE_CONTENT, bytes - done);

		GpuIvfpqInitPage(page, GPU_IVFPQ_PAGE_BLOB);
		memcpy(PageGetContents(page), src + done, chunk);
		((PageHeader) page)->pd_lower = MAXALIGN(SizeOfPageHeaderData) + chunk;
		if (start == InvalidBlockNumber)
			start = BufferGetBlockNumber(buf);
		else
			Assert(BufferGetBlockNumber(buf) == start + (BlockNumber) (done / GPU_IVFPQ_PAGE_CONTENT));
		GenericXLogFinish(state);
		UnlockReleaseBuffer(buf);
		done += chunk;
		if (bytes == 0)
			break;
	}
	return start;
}

/*
 * Reads bytes of blob data starting at block start into data (the caller
 * checked that the blob's pages lie in the index: GpuIvfpqCheckExtent).
 */
void
GpuIvfpqReadBlob(Relation index, BlockNumber start, void *data, Size bytes)
{
	char	   *dst = (char *) data;
	Size		done = 0;
	BlockNumber blk = start;

	while (done < bytes)
	{
		Buffer		buf = ReadBuffer(index, blk);
		Page		page;
		Size		chunk = Min((Size) GPU_IVFPQ_PAGE_CONTENT, bytes - done);

		LockBuffer(buf, BUFFER_LOCK_SHARE);
		page = BufferGetPage(buf);
		GpuIvfpqCheckBlobPage(index, blk, page, chunk);
		memcpy(dst + done, PageGetContents(page), chunk);
		UnlockReleaseBuffer(buf);
		done += chunk;
		blk++;
		CHECK_FOR_INTERRUPTS();
	}
}

/*
 * Makes room in index's buffer hints (GpuIvfpqBufferHints) for block blk
 * (below GPU_IVFPQ_BUFFER_HINTS_MAX): sized to the index, at least doubled,
 * the hints kept. Returns the hints.
 */
GpuIvfpqBufferHints *
GpuIvfpqGrowBufferHints(Relation index, BlockNumber blk)
{
	GpuIvfpqBufferHints *old = (GpuIvfpqBufferHints *) index->rd_amcache;
	GpuIvfpqBufferHints *h;
	BlockNumber n = Max(RelationGetNumberOfBlocks(index), blk + 1);

	Assert(blk < GPU_IVFPQ_BUFFER_HINTS_MAX);
	if (old != NULL)
		n = Max(n, Min(old->n, GPU_IVFPQ_BUFFER_HINTS_MAX / 2) * 2);
	n = Min(n, GPU_IVFPQ_BUFFER_HINTS_MAX);
	h = (GpuIvfpqBufferHints *) MemoryContextAllocZero(index->rd_indexcxt,
													   offsetof(GpuIvfpqBufferHints, buf) +
													   sizeof(Buffer) * n);
	h->n = n;
	if (old != NULL)
	{
		memcpy(h->buf, old->buf, sizeof(Buffer) * old->n);
		pfree(old);
	}
	index->rd_amcache = h;
	return h;
}

/* Returns a palloc'd copy of the whole list directory (meta->lists entries). */
GpuIvfpqListDirEntry *
GpuIvfpqReadListDir(Relation index, const GpuIvfpqMetaPageData *meta)
{
	GpuIvfpqListDirEntry *dir = (GpuIvfpqListDirEntry *)
		palloc(sizeof(GpuIvfpqListDirEntry) * meta->lists);

	GpuIvfpqCheckExtent(index, "list directory", meta->listdir_start, meta->listdir_pages);
	for (uint32 p = 0; p < meta->listdir_pages; p++)
	{
		BlockNumber blk = meta->listdir_start + p;
		Buffer		buf = ReadBuffer(index, blk);
		uint32		first = p * GPU_IVFPQ_LISTDIR_PER_PAGE;
		int			n = GpuIvfpqListDirPageEntries(meta, p);

		LockBuffer(buf, BUFFER_LOCK_SHARE);
		GpuIvfpqCheckListDirPage(index, blk, BufferGetPage(buf), n);
		memcpy(dir + first, PageGetContents(BufferGetPage(buf)), n * sizeof(GpuIvfpqListDirEntry));
		UnlockReleaseBuffer(buf);
	}
	return dir;
}

/* Locks the directory page of list and returns its buffer and entry. */
static Buffer
LockListDirEntry(Relation index, const GpuIvfpqMetaPageData *meta, int list, int mode,
				 GpuIvfpqListDirEntry *entry)
{
	BlockNumber blk = meta->listdir_start + list / GPU_IVFPQ_LISTDIR_PER_PAGE;
	Buffer		buf = ReadBuffer(index, blk);

	LockBuffer(buf, mode);
	/*
	 * Inserts write where the directory says: it must be one, with room for
	 * all its entries (generic WAL zeroes what lies past pd_lower: a short
	 * pd_lower would wipe the other lists' entries with this one's update).
	 */
	GpuIvfpqCheckListDirPage(index, blk, BufferGetPage(buf),
							 GpuIvfpqListDirPageEntries(meta, (uint32) (list / GPU_IVFPQ_LISTDIR_PER_PAGE)));
	memcpy(entry, (GpuIvfpqListDirEntry *) PageGetContents(BufferGetPage(buf)) +
		   list % GPU_IVFPQ_LISTDIR_PER_PAGE, sizeof(*entry));
	return buf;
}

/* Applies fn to list's directory entry under an exclusive lock, WAL-logged. */
template <typename Fn>
static void
UpdateListDirEntry(Relation index, const GpuIvfpqMetaPageData *meta, int list, Fn fn)
{
	GpuIvfpqListDirEntry entry;
	Buffer		buf = LockListDirEntry(index, meta, list, BUFFER_LOCK_EXCLUSIVE, &entry);

	if (fn(&entry))
	{
		GenericXLogState *state = GenericXLogStart(index);
		Page		page = GenericXLogRegisterBuffer(state, buf, 0);

		memcpy((GpuIvfpqListDirEntry *) PageGetContents(page) + list % GPU_IVFPQ_LISTDIR_PER_PAGE,
			   &entry, sizeof(entry));
		GenericXLogFinish(state);
	}
	UnlockReleaseBuffer(buf);
}

/*
 * Copies up to count entries (in the transfer form) after the entries of
 * page, their vectors into its vector region; returns how many.
 */
static int
FillListPage(Page page, const GpuIvfpqEntryLayout *el, const char *entries, int count)
{
	int			have = GpuIvfpqPageEntryCount(page, el);
	int			n = Min(count, GpuIvfpqEntriesPerPage(el) - have);
	char	   *contents = (char *) PageGetContents(page);
	Size		vbytes = sizeof(float) * el->vdim;

	if (n <= 0)
		return 0;
	for (int i = 0; i < n; i++)
	{
		const char *x = entries + (Size) i * el->xsize;

		memcpy(contents + (Size) (have + i) * el->size, x + el->xtid, el->size);
		if (vbytes > 0)
			memcpy(contents + el->vec_offset + (Size) (have + i) * vbytes, x, vbytes);
	}
	((PageHeader) page)->pd_lower += n * el->size;
	/* The vector region is page content: GenericXLog logs from pd_upper on. */
	if (vbytes > 0)
		((PageHeader) page)->pd_upper = (LocationIndex) (MAXALIGN(SizeOfPageHeaderData) + el->vec_offset);
	return n;
}

/* Pages a build forms, writes and WAL-logs at a time (one WAL record's worth). */
#define BUILD_WRITE_PAGES	XLR_MAX_BLOCK_ID

/*
 * CREATE INDEX's list pages: count entries (transfer form) in new pages
 * chained in block order past the end of the index, formed in local memory,
 * WAL-logged whole, 32 pages a record, and written straight to the file, as
 * PostgreSQL's own index builds do; none goes through shared buffers. Each
 * write asks the next checkpoint to fsync the file; a checkpoint that began
 * after the first record was written might have taken its requests before
 * the last write, so if one began meanwhile (the redo pointer moved) the
 * file is synced here, as PostgreSQL's bulk writer does. Only for an index
 * that nobody else can see yet and that is not temporary (local buffers),
 * pages being added only here and by GpuIvfpqNewBuffer, which extends the
 * file at once. Returns the first block; *last is the last.
 */
static BlockNumber
WriteNewListPages(Relation index, const GpuIvfpqEntryLayout *el, const char *entries, int count,
				  BlockNumber *last)
{
	SMgrRelation smgr = RelationGetSmgr(index);
	BlockNumber first = smgrnblocks(smgr, MAIN_FORKNUM);
	int			per_page = GpuIvfpqEntriesPerPage(el);
	BlockNumber npages = (BlockNumber) ((count + per_page - 1) / per_page);
	/* Aligned as direct I/O wants it. */
	char	   *raw = (char *) palloc(BUILD_WRITE_PAGES * BLCKSZ + 4096);
	char	   *space = (char *) TYPEALIGN(4096, raw);
	Page		pages[BUILD_WRITE_PAGES];
	BlockNumber blknos[BUILD_WRITE_PAGES];
	bool		wal = RelationNeedsWAL(index);
	XLogRecPtr	start_redo = GetRedoRecPtr();

	Assert(count > 0 && !RelationUsesLocalBuffers(index));
	if (first >= MaxBlockNumber - npages)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("cannot extend index \"%s\" beyond %u blocks",
						RelationGetRelationName(index), MaxBlockNumber)));
	for (BlockNumber p = 0; p < npages; p += BUILD_WRITE_PAGES)
	{
		int			n = (int) Min((BlockNumber) BUILD_WRITE_PAGES, npages - p);

		for (int i = 0; i < n; i++)
		{
			Page		page = space + (Size) i * BLCKSZ;
			BlockNumber blk = first + p + i;
			int			filled;

			GpuIvfpqInitPage(page, GPU_IVFPQ_PAGE_LIST);
			filled = FillListPage(page, el, entries, count);
			entries += (Size) filled * el->xsize;
			count -= filled;
			GpuIvfpqPageGetOpaque(page)->next = count > 0 ? blk + 1 : InvalidBlockNumber;
			pages[i] = page;
			blknos[i] = blk;
		}
		/* The WAL first: it sets the pages' LSNs, which their checksums cover. */
		if (wal)
			log_newpages(GpuIvfpqSmgrRelFile(index), MAIN_FORKNUM, n, blknos, pages, true);
		for (int i = 0; i < n; i++)
		{
			PageSetChecksumInplace(pages[i], blknos[i]);
			smgrextend(smgr, MAIN_FORKNUM, blknos[i], pages[i], false);
		}
		CHECK_FOR_INTERRUPTS();
	}
	if (wal && GetRedoRecPtr() != start_redo)
		smgrimmedsync(smgr, MAIN_FORKNUM);
	pfree(raw);
	*last = first + npages - 1;
	return first;
}

/*
 * Appends count entries in the transfer form of GpuIvfpqLayoutOf(meta) to inverted list `list`, filling
 * free space from the list's insert hint onward (space VACUUM freed is
 * reused) and extending the chain at its tail. Also raises the list's
 * covering radius to at least radius and its quantization error to at
 * least qerror. building: the caller is CREATE INDEX, whose new pages go
 * to the file in bulk (WriteNewListPages).
 */
void
GpuIvfpqAppendEntries(Relation index, const GpuIvfpqMetaPageData *meta, int list,
					  const char *entries, int count, float radius, float qerror, bool building)
{
	GpuIvfpqEntryLayout el = GpuIvfpqLayoutOf(meta);
	int			esz = el.xsize;
	GpuIvfpqListDirEntry entry;
	Buffer		dirbuf;
	BlockNumber blk;
	BlockNumber last_blk;
	BlockNumber from = InvalidBlockNumber;
	GpuIvfpqChainWalk walk = {0, 0};

	dirbuf = LockListDirEntry(index, meta, list, BUFFER_LOCK_SHARE, &entry);
	UnlockReleaseBuffer(dirbuf);
	if (RelationUsesLocalBuffers(index))
		building = false;

	if (entry.head == InvalidBlockNumber && building && count > 0)
	{
		/* A build's first entries of this list: its whole chain in bulk. */
		BlockNumber first = WriteNewListPages(index, &el, entries, count, &last_blk);

		UpdateListDirEntry(index, meta, list, [&](GpuIvfpqListDirEntry *e) {
			e->head = first;
			e->insert_hint = last_blk;
			e->radius = Max(e->radius, radius);
			e->qerror = Max(e->qerror, qerror);
			return true;
		});
		return;
	}
	if (entry.head == InvalidBlockNumber)
	{
		/* First entry of this list: create its chain under the directory lock. */
		BlockNumber created = InvalidBlockNumber;

		UpdateListDirEntry(index, meta, list, [&](GpuIvfpqListDirEntry *e) {
			if (e->head != InvalidBlockNumber)
				return false;	/* somebody else created it meanwhile */
			Buffer		buf = GpuIvfpqNewBuffer(index, MAIN_FORKNUM);
			GenericXLogState *state = GenericXLogStart(index);
			Page		page = GenericXLogRegisterBuffer(state, buf, GENERIC_XLOG_FULL_IMAGE);

			GpuIvfpqInitPage(page, GPU_IVFPQ_PAGE_LIST);
			GenericXLogFinish(state);
			created = BufferGetBlockNumber(buf);
			UnlockReleaseBuffer(buf);
			e->head = e->insert_hint = created;
			return true;
		});
		dirbuf = LockListDirEntry(index, meta, list, BUFFER_LOCK_SHARE, &entry);
		UnlockReleaseBuffer(dirbuf);
	}

	blk = entry.insert_hint != InvalidBlockNumber ? entry.insert_hint : entry.head;
	last_blk = blk;
	while (count > 0)
	{
		Buffer		buf;
		Page		page;
		GpuIvfpqPageOpaque opaque;
		int			room;

		GpuIvfpqChainStep(index, &walk, from, blk);
		buf = ReadBuffer(index, blk);
		LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
		page = BufferGetPage(buf);
		opaque = GpuIvfpqPageGetOpaque(page);
		room = GpuIvfpqEntriesPerPage(&el) - GpuIvfpqListPageEntries(index, blk, page, &el, list);

		if (room > 0)
		{
			GenericXLogState *state = GenericXLogStart(index);
			Page		wpage = GenericXLogRegisterBuffer(state, buf, 0);
			int			n = FillListPage(wpage, &el, entries, count);

			GenericXLogFinish(state);
			entries += (Size) n * esz;
			count -= n;
		}
		last_blk = blk;
		if (count > 0 && opaque->next != InvalidBlockNumber)
		{
			from = blk;
			blk = opaque->next;
			UnlockReleaseBuffer(buf);
			CHECK_FOR_INTERRUPTS();
			continue;
		}
		if (count > 0 && building)
		{
			/* A build's later entries: new pages in bulk, linked from the tail. */
			BlockNumber next = WriteNewListPages(index, &el, entries, count, &last_blk);
			GenericXLogState *state = GenericXLogStart(index);
			Page		tail = GenericXLogRegisterBuffer(state, buf, 0);

			GpuIvfpqPageGetOpaque(tail)->next = next;
			GenericXLogFinish(state);
			count = 0;
		}
		/* At the tail with entries left: add pages, filling each as it is made. */
		while (count > 0)
		{
			Buffer		newbuf = GpuIvfpqNewBuffer(index, MAIN_FORKNUM);
			GenericXLogState *state = GenericXLogStart(index);
			Page		tail = GenericXLogRegisterBuffer(state, buf, 0);
			Page		npage = GenericXLogRegisterBuffer(state, newbuf, GENERIC_XLOG_FULL_IMAGE);
			int			n;

			GpuIvfpqInitPage(npage, GPU_IVFPQ_PAGE_LIST);
			n = FillListPage(npage, &el, entries, count);
			GpuIvfpqPageGetOpaque(tail)->next = BufferGetBlockNumber(newbuf);
			GenericXLogFinish(state);
			entries += (Size) n * esz;
			count -= n;
			UnlockReleaseBuffer(buf);
			buf = newbuf;
			last_blk = BufferGetBlockNumber(newbuf);
			CHECK_FOR_INTERRUPTS();
		}
		UnlockReleaseBuffer(buf);
		break;
	}

	if (last_blk != entry.insert_hint || radius > entry.radius || qerror > entry.qerror)
		UpdateListDirEntry(index, meta, list, [&](GpuIvfpqListDirEntry *e) {
			bool		changed = false;

			/* Move the hint forward only: VACUUM moves it back when it frees space. */
			if (e->insert_hint == entry.insert_hint && last_blk != e->insert_hint)
			{
				e->insert_hint = last_blk;
				changed = true;
			}
			if (qerror > e->qerror)
			{
				e->qerror = qerror;
				changed = true;
			}
			if (radius > e->radius)
			{
				e->radius = radius;
				changed = true;
			}
			return changed;
		});
}

/* The default m: the largest divisor of dim that is at most dim/8 (and 64). */
int
GpuIvfpqDefaultM(int dim)
{
	int			target = Max(1, Min(64, dim / 8));

	for (int m = target; m >= 1; m--)
		if (dim % m == 0)
			return m;
	return 1;
}

/*
 * How many entries the index may hold now: the most of its reltuples, the
 * rows its build indexed and, but for a partial index, its table's
 * reltuples. An index's reltuples can lag: VACUUM counts the entries only
 * when someone asked for it or it removed some (an autovacuum after
 * inserts alone leaves it), and an ANALYZE run with a VACUUM leaves it too;
 * the table's follows every VACUUM.
 */
double
GpuIvfpqRowsEstimate(Relation index, const GpuIvfpqMetaPageData *meta)
{
	double		rows = Max((double) index->rd_rel->reltuples, (double) meta->build_tuples);
	HeapTuple	tup;

	if (!heap_attisnull(index->rd_indextuple, Anum_pg_index_indpred, NULL))
		return rows;
	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(index->rd_index->indrelid));
	if (HeapTupleIsValid(tup))
	{
		rows = Max(rows, (double) ((Form_pg_class) GETSTRUCT(tup))->reltuples);
		ReleaseSysCache(tup);
	}
	return rows;
}

/* How the list entries of an index with this metapage are laid out. */
GpuIvfpqEntryLayout
GpuIvfpqLayoutOf(const GpuIvfpqMetaPageData *meta)
{
	return GpuIvfpqLayout(meta->trained ? meta->m : 0,
						  (meta->features & GPU_IVFPQ_FEATURE_VECTORS) ? (int) meta->dimensions : 0,
						  (meta->features & GPU_IVFPQ_FEATURE_FILTER) != 0);
}

/*
 * Whether an entry with a vector of dim floats and an m-byte code fits a
 * page (up to about 2000 dimensions; above, the vectors stay in the heap
 * only, since an index entry cannot span pages).
 */
bool
GpuIvfpqVectorsFit(int dim, int m, bool keyed)
{
	GpuIvfpqEntryLayout el = GpuIvfpqLayout(m, dim, keyed);

	return el.capacity >= 1;
}

/*
 * Whether the index has a filter column: a second key column, an integer
 * (the AM takes at most two, the first the vector; see build.cpp).
 */
bool
GpuIvfpqHasFilterColumn(Relation index)
{
	return IndexRelationGetNumberOfKeyAttributes(index) >= 2;
}

/*
 * The filter key of a filter column value: the integer widened to int64,
 * GPU_IVFPQ_NULL_FILTER_KEY for NULL.
 */
int64
GpuIvfpqFilterKeyOf(Relation index, Datum value, bool isnull)
{
	if (isnull)
		return GPU_IVFPQ_NULL_FILTER_KEY;
	switch (TupleDescAttr(RelationGetDescr(index), 1)->atttypid)
	{
		case INT2OID:
			return DatumGetInt16(value);
		case INT4OID:
			return DatumGetInt32(value);
		case INT8OID:
			return DatumGetInt64(value);
		default:
			elog(ERROR, "gpu_ivfpq filter column of type %u", TupleDescAttr(RelationGetDescr(index), 1)->atttypid);
	}
	return 0;					/* not reached */
}

/* The metric of an index, from its operator class's support function 2. */
int
GpuIvfpqMetricOf(Relation index)
{
	FmgrInfo   *proc = index_getprocinfo(index, 1, GPU_IVFPQ_METRIC_PROC);

	return DatumGetInt32(FunctionCall1Coll(proc, InvalidOid, PointerGetDatum(NULL)));
}

/* Moves list's insert hint back to blk when blk comes earlier in the chain. */
void
GpuIvfpqLowerInsertHint(Relation index, const GpuIvfpqMetaPageData *meta, int list, BlockNumber blk)
{
	/* Chains only ever grow by newly extended pages: block numbers ascend along them. */
	UpdateListDirEntry(index, meta, list, [&](GpuIvfpqListDirEntry *e) {
		if (e->insert_hint != InvalidBlockNumber && e->insert_hint <= blk)
			return false;
		e->insert_hint = blk;
		return true;
	});
}

/*
 * Records the dimension of an index built without rows, from its first
 * insert; errors if a concurrent insert fixed another dimension first.
 */
void
GpuIvfpqSetDimensions(Relation index, GpuIvfpqMetaPageData *meta, int dim)
{
	Buffer		buf = ReadBuffer(index, GPU_IVFPQ_METAPAGE_BLKNO);
	GpuIvfpqMetaPage disk;

	LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
	disk = GpuIvfpqPageGetMeta(BufferGetPage(buf));
	if (disk->dimensions == 0)
	{
		GenericXLogState *state = GenericXLogStart(index);
		Page		page = GenericXLogRegisterBuffer(state, buf, 0);

		GpuIvfpqPageGetMeta(page)->dimensions = dim;
		GenericXLogFinish(state);
	}
	meta->dimensions = GpuIvfpqPageGetMeta(BufferGetPage(buf))->dimensions;
	UnlockReleaseBuffer(buf);
}

/*
 * Sets (on) or clears a GPU_IVFPQ_META_* flag in the metapage, WAL-logged
 * unless it already is so; meta, the caller's copy, gets the page's flags.
 */
void
GpuIvfpqSetMetaFlag(Relation index, GpuIvfpqMetaPageData *meta, uint32 flag, bool on)
{
	Buffer		buf = ReadBuffer(index, GPU_IVFPQ_METAPAGE_BLKNO);
	GpuIvfpqMetaPage disk;

	LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
	GpuIvfpqCheckPage(index, GPU_IVFPQ_METAPAGE_BLKNO, BufferGetPage(buf), GPU_IVFPQ_PAGE_META);
	disk = GpuIvfpqPageGetMeta(BufferGetPage(buf));
	if (((disk->flags & flag) != 0) != on)
	{
		GenericXLogState *state = GenericXLogStart(index);
		Page		page = GenericXLogRegisterBuffer(state, buf, 0);
		GpuIvfpqMetaPage wmeta = GpuIvfpqPageGetMeta(page);
		LocationIndex end = (LocationIndex) ((char *) wmeta + sizeof(*wmeta) - (char *) page);

		if (on)
			wmeta->flags |= flag;
		else
			wmeta->flags &= ~flag;
		/*
		 * Metapages written before the features field end earlier, and
		 * GenericXLog leaves out what lies past pd_lower: the flag would
		 * not reach the standbys.
		 */
		if (((PageHeader) page)->pd_lower < end)
			((PageHeader) page)->pd_lower = end;
		GenericXLogFinish(state);
	}
	meta->flags = disk->flags;
	UnlockReleaseBuffer(buf);
}

/*
 * The trained quantizers as the pages hold them, palloc'd in cxt: centroids
 * (lists x dim floats) and codebooks (m x 256 x dim/m floats).
 */
void
GpuIvfpqReadQuantizers(Relation index, const GpuIvfpqMetaPageData *meta, MemoryContext cxt,
					   float **centroids, float **codebooks)
{
	Size		centroid_bytes = GpuIvfpqCentroidBytes(meta);
	Size		codebook_bytes = GpuIvfpqCodebookBytes(meta);

	Assert(meta->trained);
	GpuIvfpqCheckExtent(index, "centroids", meta->centroid_start, GpuIvfpqBlobPages(centroid_bytes));
	GpuIvfpqCheckExtent(index, "codebooks", meta->codebook_start, GpuIvfpqBlobPages(codebook_bytes));
	*centroids = (float *) MemoryContextAllocHuge(cxt, centroid_bytes);
	*codebooks = (float *) MemoryContextAllocHuge(cxt, codebook_bytes);
	GpuIvfpqReadBlob(index, meta->centroid_start, *centroids, centroid_bytes);
	GpuIvfpqReadBlob(index, meta->codebook_start, *codebooks, codebook_bytes);
}
