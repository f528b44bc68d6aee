// Page-level storage of the index: metapage, float blobs (centroids and
// codebooks), the list directory and appends to inverted-list chains.
#include "am/am.h"

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

/* Copies the metapage out, checking that this is a gpu_ivfpq index we can read. */
void
GpuIvfpqReadMeta(Relation index, GpuIvfpqMetaPageData *meta)
{
	Buffer		buf = ReadBuffer(index, GPU_IVFPQ_METAPAGE_BLKNO);
	Page		page;

	LockBuffer(buf, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buf);
	memcpy(meta, GpuIvfpqPageGetMeta(page), sizeof(GpuIvfpqMetaPageData));
	UnlockReleaseBuffer(buf);

	if (meta->magic != GPU_IVFPQ_MAGIC)
		ereport(ERROR,
				(errcode(ERRCODE_INDEX_CORRUPTED),
				 errmsg("index \"%s\" is not a gpu_ivfpq index", RelationGetRelationName(index))));
	if (meta->version != GPU_IVFPQ_VERSION)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("gpu_ivfpq index \"%s\" has format version %u, this build reads version %d",
						RelationGetRelationName(index), meta->version, GPU_IVFPQ_VERSION),
				 errhint("REINDEX the index.")));
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

/* Reads bytes of blob data starting at block start into data. */
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
		if (GpuIvfpqPageGetOpaque(page)->flags != GPU_IVFPQ_PAGE_BLOB)
			ereport(ERROR,
					(errcode(ERRCODE_INDEX_CORRUPTED),
					 errmsg("gpu_ivfpq index \"%s\": block %u is not a data page",
							RelationGetRelationName(index), blk)));
		memcpy(dst + done, PageGetContents(page), chunk);
		UnlockReleaseBuffer(buf);
		done += chunk;
		blk++;
		CHECK_FOR_INTERRUPTS();
	}
}

/* Returns a palloc'd copy of the whole list directory (meta->lists entries). */
GpuIvfpqListDirEntry *
GpuIvfpqReadListDir(Relation index, const GpuIvfpqMetaPageData *meta)
{
	GpuIvfpqListDirEntry *dir = (GpuIvfpqListDirEntry *)
		palloc(sizeof(GpuIvfpqListDirEntry) * meta->lists);

	for (uint32 p = 0; p < meta->listdir_pages; p++)
	{
		Buffer		buf = ReadBuffer(index, meta->listdir_start + p);
		uint32		first = p * GPU_IVFPQ_LISTDIR_PER_PAGE;
		uint32		n = Min((uint32) GPU_IVFPQ_LISTDIR_PER_PAGE, meta->lists - first);

		LockBuffer(buf, BUFFER_LOCK_SHARE);
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
	Buffer		buf = ReadBuffer(index, meta->listdir_start + list / GPU_IVFPQ_LISTDIR_PER_PAGE);

	LockBuffer(buf, mode);
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

/* Copies up to count entries into the free tail of page; returns how many. */
static int
FillListPage(Page page, int m, const char *entries, int count)
{
	int			esz = GpuIvfpqEntrySize(m);
	int			have = GpuIvfpqPageEntryCount(page, m);
	int			n = Min(count, GpuIvfpqEntriesPerPage(m) - have);

	if (n <= 0)
		return 0;
	memcpy((char *) PageGetContents(page) + (Size) have * esz, entries, (Size) n * esz);
	((PageHeader) page)->pd_lower += n * esz;
	return n;
}

/*
 * Appends count packed entries (TID + code) to inverted list `list`, filling
 * free space from the list's insert hint onward (space VACUUM freed is
 * reused) and extending the chain at its tail. Also raises the list's
 * covering radius to at least radius and its quantization error to at
 * least qerror.
 */
void
GpuIvfpqAppendEntries(Relation index, const GpuIvfpqMetaPageData *meta, int list,
					  const char *entries, int count, float radius, float qerror)
{
	int			m = meta->trained ? meta->m : 0;
	int			esz = GpuIvfpqEntrySize(m);
	GpuIvfpqListDirEntry entry;
	Buffer		dirbuf;
	BlockNumber blk;
	BlockNumber last_blk;

	dirbuf = LockListDirEntry(index, meta, list, BUFFER_LOCK_SHARE, &entry);
	UnlockReleaseBuffer(dirbuf);

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
		Buffer		buf = ReadBuffer(index, blk);
		Page		page;
		GpuIvfpqPageOpaque opaque;
		int			room;

		LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
		page = BufferGetPage(buf);
		opaque = GpuIvfpqPageGetOpaque(page);
		room = GpuIvfpqEntriesPerPage(m) - GpuIvfpqPageEntryCount(page, m);

		if (room > 0)
		{
			GenericXLogState *state = GenericXLogStart(index);
			Page		wpage = GenericXLogRegisterBuffer(state, buf, 0);
			int			n = FillListPage(wpage, m, entries, count);

			GenericXLogFinish(state);
			entries += (Size) n * esz;
			count -= n;
		}
		last_blk = blk;
		if (count > 0 && opaque->next != InvalidBlockNumber)
		{
			blk = opaque->next;
			UnlockReleaseBuffer(buf);
			continue;
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
			n = FillListPage(npage, m, entries, count);
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
 * The trained quantizers as the pages hold them, palloc'd in cxt: centroids
 * (lists x dim floats) and codebooks (m x 256 x dim/m floats).
 */
void
GpuIvfpqReadQuantizers(Relation index, const GpuIvfpqMetaPageData *meta, MemoryContext cxt,
					   float **centroids, float **codebooks)
{
	Size		centroid_bytes = (Size) meta->lists * meta->dimensions * sizeof(float);
	Size		codebook_bytes = (Size) 256 * meta->dimensions * sizeof(float);

	Assert(meta->trained);
	*centroids = (float *) MemoryContextAllocHuge(cxt, centroid_bytes);
	*codebooks = (float *) MemoryContextAllocHuge(cxt, codebook_bytes);
	GpuIvfpqReadBlob(index, meta->centroid_start, *centroids, centroid_bytes);
	GpuIvfpqReadBlob(index, meta->codebook_start, *codebooks, codebook_bytes);
}
