// gpu_ivfpq_check(index, heapallindexed): verifies an index's pages the way
// contrib/amcheck verifies a B-tree, and optionally that every visible row
// of its table is in it exactly once. Every error names the index, the
// block and the broken invariant. Checks are safe to run beside inserts,
// VACUUM and scans: the index is only share-locked and read.
#include <algorithm>

#include "am/am.h"

extern "C" {
#include "access/table.h"
#include "catalog/index.h"
#include "utils/snapmgr.h"

PG_FUNCTION_INFO_V1(gpu_ivfpq_check);
}

/* Who holds a block of the index: what CheckState.owner records per block. */
#define OWNER_NONE			0
#define OWNER_META			1
#define OWNER_CENTROIDS		2
#define OWNER_CODEBOOKS		3
#define OWNER_LISTDIR		4
#define OWNER_LIST_FIRST	5	/* list l holds OWNER_LIST_FIRST + l */

/* One index entry's heap TID (as a label) and where it was found. */
typedef struct CheckedTid
{
	int64		label;
	BlockNumber blk;
	uint32		list;
} CheckedTid;

typedef struct CheckState
{
	Relation	index;
	Relation	heap;
	BufferAccessStrategy strategy;
	GpuIvfpqMetaPageData meta;
	GpuIvfpqEntryLayout el;		/* how list entries are laid out */
	GpuIvfpqListDirEntry *dir;	/* meta.lists entries */

	BlockNumber nblocks;		/* the index's size when last asked */
	BlockNumber heap_nblocks;	/* the table's size when last asked */
	uint32	   *owner;			/* per block of the index: OWNER_* */
	BlockNumber owner_size;		/* blocks owner covers */

	CheckedTid *tids;			/* every entry's TID, sorted once collected */
	int64		ntids;
	int64		tids_cap;

	PGAlignedBlock page;		/* the copy of the page being checked */
	MemoryContext rowctx;		/* heapallindexed: reset per table row */
} CheckState;

/* What owner value who is called in messages. */
static const char *
OwnerName(uint32 who, char *buf, Size len)
{
	switch (who)
	{
		case OWNER_META:
			return "the metapage";
		case OWNER_CENTROIDS:
			return "the centroids";
		case OWNER_CODEBOOKS:
			return "the codebooks";
		case OWNER_LISTDIR:
			return "the list directory";
	}
	snprintf(buf, len, "list %u", who - OWNER_LIST_FIRST);
	return buf;
}

/*
 * The index's size, asked again (and owner grown) when blk lies past the
 * size known: concurrent inserts extend the index while it is checked.
 */
static BlockNumber
IndexBlocks(CheckState *cs, BlockNumber blk)
{
	if (blk < cs->nblocks)
		return cs->nblocks;
	cs->nblocks = RelationGetNumberOfBlocks(cs->index);
	if (cs->nblocks > cs->owner_size)
	{
		BlockNumber size = Max(cs->nblocks, cs->owner_size * 2);

		cs->owner = cs->owner == NULL
			? (uint32 *) palloc_extended(sizeof(uint32) * size, MCXT_ALLOC_HUGE | MCXT_ALLOC_ZERO)
			: (uint32 *) repalloc_huge(cs->owner, sizeof(uint32) * size);
		memset(cs->owner + cs->owner_size, 0, sizeof(uint32) * (size - cs->owner_size));
		cs->owner_size = size;
	}
	return cs->nblocks;
}

/* Copies block blk of the index into cs->page (read under a share lock) and returns it. */
static Page
ReadCopy(CheckState *cs, BlockNumber blk)
{
	Buffer		buf = ReadBufferExtended(cs->index, MAIN_FORKNUM, blk, RBM_NORMAL, cs->strategy);

	LockBuffer(buf, BUFFER_LOCK_SHARE);
	memcpy(cs->page.data, BufferGetPage(buf), BLCKSZ);
	UnlockReleaseBuffer(buf);
	CHECK_FOR_INTERRUPTS();
	return (Page) cs->page.data;
}

/* Records that who holds the npages blocks from start (in the index, checked). */
static void
ClaimExtent(CheckState *cs, BlockNumber start, BlockNumber npages, uint32 who)
{
	char		a[32];
	char		b[32];

	for (BlockNumber blk = start; blk < start + npages; blk++)
	{
		if (cs->owner[blk] != OWNER_NONE)
			GpuIvfpqReportCorrupt(cs->index, GPU_IVFPQ_METAPAGE_BLKNO,
								  "metapage places %s and %s both at block %u",
								  OwnerName(cs->owner[blk], a, sizeof(a)), OwnerName(who, b, sizeof(b)), blk);
		cs->owner[blk] = who;
	}
}

/* The metapage: its page, its fields, and where it places the other structures. */
static void
CheckMetapage(CheckState *cs)
{
	Page		page;
	GpuIvfpqMetaPageData *meta = &cs->meta;
	int			opclass_metric;

	if (IndexBlocks(cs, GPU_IVFPQ_METAPAGE_BLKNO) == 0)
		GpuIvfpqReportCorrupt(cs->index, GPU_IVFPQ_METAPAGE_BLKNO, "the index has %u pages: no metapage",
							  cs->nblocks);
	page = ReadCopy(cs, GPU_IVFPQ_METAPAGE_BLKNO);
	GpuIvfpqCheckPage(cs->index, GPU_IVFPQ_METAPAGE_BLKNO, page, GPU_IVFPQ_PAGE_META);
	memcpy(meta, GpuIvfpqPageGetMeta(page), sizeof(*meta));
	GpuIvfpqCheckMeta(cs->index, meta);
	cs->owner[GPU_IVFPQ_METAPAGE_BLKNO] = OWNER_META;
	/* Readers ignore state flags they do not know; the checker names them. */
	if (meta->flags & ~(uint32) GPU_IVFPQ_META_FLAGS_KNOWN)
		GpuIvfpqReportCorrupt(cs->index, GPU_IVFPQ_METAPAGE_BLKNO, "metapage flags 0x%x include bits 0x%x that this build does not know",
							  meta->flags, meta->flags & ~(uint32) GPU_IVFPQ_META_FLAGS_KNOWN);

	opclass_metric = GpuIvfpqMetricOf(cs->index);
	if (meta->metric != opclass_metric)
		GpuIvfpqReportCorrupt(cs->index, GPU_IVFPQ_METAPAGE_BLKNO,
							  "metapage metric %u differs from the operator class's metric %d",
							  (unsigned int) meta->metric, opclass_metric);
	cs->el = GpuIvfpqLayoutOf(meta);

	if (meta->trained)
	{
		BlockNumber centroid_pages = GpuIvfpqBlobPages(GpuIvfpqCentroidBytes(meta));
		BlockNumber codebook_pages = GpuIvfpqBlobPages(GpuIvfpqCodebookBytes(meta));

		GpuIvfpqCheckExtent(cs->index, "centroids", meta->centroid_start, centroid_pages);
		GpuIvfpqCheckExtent(cs->index, "codebooks", meta->codebook_start, codebook_pages);
		(void) IndexBlocks(cs, Max(meta->centroid_start + centroid_pages, meta->codebook_start + codebook_pages) - 1);
		ClaimExtent(cs, meta->centroid_start, centroid_pages, OWNER_CENTROIDS);
		ClaimExtent(cs, meta->codebook_start, codebook_pages, OWNER_CODEBOOKS);
	}
	GpuIvfpqCheckExtent(cs->index, "list directory", meta->listdir_start, meta->listdir_pages);
	(void) IndexBlocks(cs, meta->listdir_start + meta->listdir_pages - 1);
	ClaimExtent(cs, meta->listdir_start, meta->listdir_pages, OWNER_LISTDIR);
}

/* Each page of a blob of bytes from start: a data page holding its share of the bytes. */
static void
CheckBlob(CheckState *cs, BlockNumber start, Size bytes)
{
	BlockNumber npages = GpuIvfpqBlobPages(bytes);

	for (BlockNumber p = 0; p < npages; p++)
	{
		Size		done = (Size) p * GPU_IVFPQ_PAGE_CONTENT;
		Size		chunk = Min((Size) GPU_IVFPQ_PAGE_CONTENT, bytes - done);

		GpuIvfpqCheckBlobPage(cs->index, start + p, ReadCopy(cs, start + p), chunk);
	}
}

/* The list directory: its pages, and each list's head, insert hint and bounds. */
static void
CheckListDir(CheckState *cs)
{
	const GpuIvfpqMetaPageData *meta = &cs->meta;

	cs->dir = (GpuIvfpqListDirEntry *) palloc_extended(sizeof(GpuIvfpqListDirEntry) * meta->lists,
													   MCXT_ALLOC_HUGE);
	for (uint32 p = 0; p < meta->listdir_pages; p++)
	{
		BlockNumber blk = meta->listdir_start + p;
		uint32		first = p * GPU_IVFPQ_LISTDIR_PER_PAGE;
		int			n = GpuIvfpqListDirPageEntries(meta, p);
		Page		page = ReadCopy(cs, blk);

		GpuIvfpqCheckListDirPage(cs->index, blk, page, n);
		memcpy(cs->dir + first, PageGetContents(page), sizeof(GpuIvfpqListDirEntry) * n);
		for (uint32 l = first; l < first + n; l++)
		{
			const GpuIvfpqListDirEntry *e = &cs->dir[l];

			/* A chain and its hint are created together (GpuIvfpqAppendEntries). */
			if ((e->head == InvalidBlockNumber) != (e->insert_hint == InvalidBlockNumber))
				GpuIvfpqReportCorrupt(cs->index, blk, "list %u has head %u but insert hint %u",
									  l, e->head, e->insert_hint);
			/* Both only ever grow from 0 by comparisons that a NaN never wins. */
			if (!(e->radius >= 0.0f))
				GpuIvfpqReportCorrupt(cs->index, blk, "list %u covering radius %g is not a number >= 0",
									  l, (double) e->radius);
			if (!(e->qerror >= 0.0f))
				GpuIvfpqReportCorrupt(cs->index, blk, "list %u quantization error %g is not a number >= 0",
									  l, (double) e->qerror);
		}
	}
}

/* Appends an entry's TID to cs->tids. */
static void
AddTid(CheckState *cs, const ItemPointerData *tid, BlockNumber blk, uint32 list)
{
	if (cs->ntids == cs->tids_cap)
	{
		cs->tids_cap = Max(cs->tids_cap * 2, 1024);
		cs->tids = cs->tids == NULL
			? (CheckedTid *) palloc_extended(sizeof(CheckedTid) * cs->tids_cap, MCXT_ALLOC_HUGE)
			: (CheckedTid *) repalloc_huge(cs->tids, sizeof(CheckedTid) * cs->tids_cap);
	}
	cs->tids[cs->ntids].label = GpuIvfpqTidToLabel(tid);
	cs->tids[cs->ntids].blk = blk;
	cs->tids[cs->ntids].list = list;
	cs->ntids++;
}

/*
 * The chain of list l: every page within the index, a list page of this
 * list only (no page reached twice, none shared with another list or
 * structure), its entries' TIDs valid heap addresses, and the insert hint
 * one of its pages. The TIDs are collected for CheckDuplicates.
 */
static void
CheckList(CheckState *cs, uint32 l)
{
	const GpuIvfpqListDirEntry *e = &cs->dir[l];
	uint32		me = OWNER_LIST_FIRST + l;
	BlockNumber dirblk = cs->meta.listdir_start + l / GPU_IVFPQ_LISTDIR_PER_PAGE;
	BlockNumber from = InvalidBlockNumber;
	bool		hint_seen = false;
	char		name[32];

	for (BlockNumber blk = e->head; blk != InvalidBlockNumber;)
	{
		Page		page;
		const char *entries;
		int			n;

		if (blk >= IndexBlocks(cs, blk))
		{
			if (from == InvalidBlockNumber)
				GpuIvfpqReportCorrupt(cs->index, dirblk, "list %u starts at block %u, past the end of the index (%u blocks)",
									  l, blk, cs->nblocks);
			GpuIvfpqReportCorrupt(cs->index, from, "list %u next page %u is past the end of the index (%u blocks)",
								  l, blk, cs->nblocks);
		}
		if (cs->owner[blk] == me)
			GpuIvfpqReportCorrupt(cs->index, from, "list %u leads back to block %u: the chain loops", l, blk);
		if (cs->owner[blk] != OWNER_NONE)
		{
			if (from == InvalidBlockNumber)
				GpuIvfpqReportCorrupt(cs->index, dirblk, "list %u starts at block %u, which belongs to %s",
									  l, blk, OwnerName(cs->owner[blk], name, sizeof(name)));
			GpuIvfpqReportCorrupt(cs->index, from, "list %u leads to block %u, which belongs to %s",
								  l, blk, OwnerName(cs->owner[blk], name, sizeof(name)));
		}
		cs->owner[blk] = me;
		hint_seen |= blk == e->insert_hint;

		page = ReadCopy(cs, blk);
		n = GpuIvfpqListPageEntries(cs->index, blk, page, &cs->el, (int) l);
		entries = (const char *) PageGetContents(page);
		for (int i = 0; i < n; i++)
		{
			ItemPointerData tid;
			BlockNumber hblk;
			OffsetNumber off;

			GpuIvfpqEntryTid(entries, i, &cs->el, &tid);
			hblk = ItemPointerGetBlockNumberNoCheck(&tid);
			off = ItemPointerGetOffsetNumberNoCheck(&tid);
			if (off < FirstOffsetNumber || off > MaxHeapTuplesPerPage)
				GpuIvfpqReportCorrupt(cs->index, blk, "list %u entry %d has heap TID (%u,%u), whose offset is not %d..%d",
									  l, i, hblk, (unsigned int) off, FirstOffsetNumber, (int) MaxHeapTuplesPerPage);
			if (hblk >= cs->heap_nblocks)
			{
				/* The table grows while the index is checked. */
				cs->heap_nblocks = RelationGetNumberOfBlocks(cs->heap);
				if (hblk >= cs->heap_nblocks)
					GpuIvfpqReportCorrupt(cs->index, blk, "list %u entry %d has heap TID (%u,%u), past the end of table \"%s\" (%u blocks)",
										  l, i, hblk, (unsigned int) off, RelationGetRelationName(cs->heap),
										  cs->heap_nblocks);
			}
			if (GpuIvfpqIsRabitq(&cs->meta))
			{
				const char *problem = GpuIvfpqRabitqCodeProblem(&cs->meta, GpuIvfpqEntryCode(entries, i, &cs->el));

				if (problem != NULL)
					GpuIvfpqReportCorrupt(cs->index, blk, "list %u entry %d has %s", l, i, problem);
			}
			AddTid(cs, &tid, blk, l);
		}
		from = blk;
		blk = GpuIvfpqPageGetOpaque(page)->next;
	}
	if (e->head != InvalidBlockNumber && !hint_seen)
		GpuIvfpqReportCorrupt(cs->index, dirblk, "list %u insert hint %u is not a page of its chain",
							  l, e->insert_hint);
}

/* Orders TIDs by label, then where they were found (so reports do not vary). */
static bool
CheckedTidLess(const CheckedTid &a, const CheckedTid &b)
{
	if (a.label != b.label)
		return a.label < b.label;
	if (a.list != b.list)
		return a.list < b.list;
	return a.blk < b.blk;
}

/* Whether the list page blk still holds an entry with label (read again now). */
static bool
PageHoldsLabel(CheckState *cs, BlockNumber blk, int64 label)
{
	Page		page = ReadCopy(cs, blk);
	const char *entries = (const char *) PageGetContents(page);
	int			n = GpuIvfpqListPageEntries(cs->index, blk, page, &cs->el, -1);

	for (int i = 0; i < n; i++)
		if (GpuIvfpqEntryLabel(entries, i, &cs->el) == label)
			return true;
	return false;
}

/*
 * No TID is in the index twice. Sorting the collected TIDs brings repeats
 * together. A repeat is confirmed by reading both pages again: while the
 * lists were walked, VACUUM may have removed a dead row's entry and an
 * insert reused its TID in another list, and that is no corruption.
 */
static void
CheckDuplicates(CheckState *cs)
{
	std::sort(cs->tids, cs->tids + cs->ntids, CheckedTidLess);
	for (int64 i = 1; i < cs->ntids; i++)
	{
		const CheckedTid *a = &cs->tids[i - 1];
		const CheckedTid *b = &cs->tids[i];
		ItemPointerData tid;

		if (a->label != b->label)
			continue;
		CHECK_FOR_INTERRUPTS();
		if (!PageHoldsLabel(cs, a->blk, a->label) || !PageHoldsLabel(cs, b->blk, b->label))
			continue;
		GpuIvfpqLabelToTid(b->label, &tid);
		if (a->list == b->list)
			GpuIvfpqReportCorrupt(cs->index, b->blk, "list %u holds heap TID (%u,%u) twice (also at block %u)",
								  b->list, ItemPointerGetBlockNumberNoCheck(&tid),
								  (unsigned int) ItemPointerGetOffsetNumberNoCheck(&tid), a->blk);
		GpuIvfpqReportCorrupt(cs->index, b->blk, "list %u holds heap TID (%u,%u), which list %u also holds at block %u",
							  b->list, ItemPointerGetBlockNumberNoCheck(&tid),
							  (unsigned int) ItemPointerGetOffsetNumberNoCheck(&tid), a->list, a->blk);
	}
}

/*
 * heapallindexed, in an index with vector copies or filter keys: the entry's
 * copy holds, bit for bit, the row's indexed vector (a stale or damaged copy
 * would make scans rank the row by another vector), and its filter key the
 * row's filter column (else a pushed-down filter would skip or keep the
 * wrong rows). The entry is looked up again on its page: VACUUM may have
 * moved it within the page since the lists were read.
 */
static void
CheckEntryCopies(CheckState *cs, const CheckedTid *entry, ItemPointer tid, Datum *values, bool *isnull)
{
	int			dim = 0;
	const float *v = cs->el.vdim > 0 ?
		GpuIvfpqStoredVector(values[0], GpuIvfpqIndexFormat(cs->index), &dim) : NULL;
	Page		page = ReadCopy(cs, entry->blk);
	const char *entries = (const char *) PageGetContents(page);
	int			n = GpuIvfpqListPageEntries(cs->index, entry->blk, page, &cs->el, (int) entry->list);

	for (int i = 0; i < n; i++)
	{
		if (GpuIvfpqEntryLabel(entries, i, &cs->el) != entry->label)
			continue;
		if (v != NULL &&
			(dim != cs->el.vdim ||
			 memcmp(GpuIvfpqEntryVector(entries, i, &cs->el), v, sizeof(float) * dim) != 0))
			GpuIvfpqReportCorrupt(cs->index, entry->blk,
								  "list %u entry %d keeps a vector that is not the one of row (%u,%u) of table \"%s\"",
								  entry->list, i, ItemPointerGetBlockNumber(tid),
								  (unsigned int) ItemPointerGetOffsetNumber(tid), RelationGetRelationName(cs->heap));
		if (cs->el.keyed &&
			GpuIvfpqEntryFilterKey(entries, i, &cs->el) != GpuIvfpqFilterKeyOf(cs->index, values[1], isnull[1]))
			GpuIvfpqReportCorrupt(cs->index, entry->blk,
								  "list %u entry %d keeps filter key %lld, not the filter column of row (%u,%u) of table \"%s\"",
								  entry->list, i, (long long) GpuIvfpqEntryFilterKey(entries, i, &cs->el),
								  ItemPointerGetBlockNumber(tid), (unsigned int) ItemPointerGetOffsetNumber(tid),
								  RelationGetRelationName(cs->heap));
		return;
	}
	/* Gone since the lists were read: a concurrent VACUUM; the row is checked no further. */
}

/* heapallindexed: the index holds the TID of each visible row with a non-NULL value. */
static void
HeapRowCallback(Relation index, ItemPointer tid, Datum *values, bool *isnull, bool tupleIsAlive,
				void *state)
{
	CheckState *cs = (CheckState *) state;
	CheckedTid	key;

	const CheckedTid *found;

	if (isnull[0])
		return;
	key.label = GpuIvfpqTidToLabel(tid);
	key.list = 0;
	key.blk = 0;
	found = std::lower_bound(cs->tids, cs->tids + cs->ntids, key,
							 [](const CheckedTid &a, const CheckedTid &b) { return a.label < b.label; });
	if (found == cs->tids + cs->ntids || found->label != key.label)
		ereport(ERROR,
				(errcode(ERRCODE_INDEX_CORRUPTED),
				 errmsg("index \"%s\" has no entry for row (%u,%u) of table \"%s\"",
						RelationGetRelationName(cs->index), ItemPointerGetBlockNumber(tid),
						(unsigned int) ItemPointerGetOffsetNumber(tid), RelationGetRelationName(cs->heap)),
				 errhint("REINDEX the index to rebuild it from its table.")));
	if (cs->el.vdim > 0 || cs->el.keyed)
	{
		/* The detoasted copy of each row's vector goes with the row. */
		MemoryContext old = MemoryContextSwitchTo(cs->rowctx);

		CheckEntryCopies(cs, found, tid, values, isnull);
		MemoryContextSwitchTo(old);
		MemoryContextReset(cs->rowctx);
	}
}

/*
 * Reads the table with snapshot as an index build does
 * (table_index_build_scan: the same predicate and expressions, and a HOT
 * chain's row under the TID of the chain's root, which is what the index
 * holds) and checks every row it yields against the index's TIDs. The
 * expressions and predicate are the table owner's code: they run as the
 * owner, restricted, as in the build (GpuIvfpqBecomeOwner), never with the
 * privileges of whoever runs the check.
 */
static void
CheckHeapAllIndexed(CheckState *cs, Snapshot snapshot)
{
	IndexInfo  *indexInfo = BuildIndexInfo(cs->index);
	TableScanDesc scan;
	GpuIvfpqSavedUser saved;

	/* Our own MVCC snapshot: the scan must not compute an xmin horizon of its own. */
	indexInfo->ii_Concurrent = true;
	cs->rowctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq check row", ALLOCSET_SMALL_SIZES);
	GpuIvfpqBecomeOwner(cs->heap, &saved);
	scan = table_beginscan_strat(cs->heap, snapshot, 0, NULL, true, true);
	table_index_build_scan(cs->heap, cs->index, indexInfo, true, false, HeapRowCallback, cs, scan);
	GpuIvfpqRestoreUser(&saved);
}

/*
 * Opens the index and its table, share-locked, as every function taking an
 * index does (GpuIvfpqOpenIndexChecked: the caller's SELECT privilege on the
 * table checked before any lock, the table locked first): the checker reads
 * every row's TID and, with heapallindexed, every row. Errors for anything
 * but a valid gpu_ivfpq index.
 */
static void
OpenForCheck(Oid indexoid, Relation *index, Relation *heap)
{
	GpuIvfpqOpenIndexChecked(indexoid, "gpu_ivfpq", "gpu_ivfpq_check", false, index, heap);
	if (RELATION_IS_OTHER_TEMP(*index))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot check temporary index \"%s\" of another session",
						RelationGetRelationName(*index))));
	/* An invalid index: refused by GpuIvfpqOpenIndexChecked. */
}

/*
 * gpu_ivfpq_check(index regclass, heapallindexed boolean): errors at the
 * first broken invariant (ERRCODE_INDEX_CORRUPTED), returns nothing when
 * the index is sound.
 */
extern "C" Datum
gpu_ivfpq_check(PG_FUNCTION_ARGS)
{
	Oid			indexoid = PG_GETARG_OID(0);
	bool		heapallindexed = PG_GETARG_BOOL(1);
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq_check",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	CheckState *cs = (CheckState *) palloc0(sizeof(CheckState));
	Snapshot	snapshot = InvalidSnapshot;
	Relation	index;
	Relation	heap;

	OpenForCheck(indexoid, &index, &heap);
	cs->index = index;
	cs->heap = heap;
	cs->strategy = GetAccessStrategy(BAS_BULKREAD);

	if (heapallindexed)
	{
		/*
		 * Taken before the lists are read: a row visible to it was inserted
		 * (its entry written) before it, and VACUUM keeps every row it sees.
		 * A transaction snapshot (REPEATABLE READ) may predate the index's
		 * HOT-safety horizon; then the index may legitimately lack rows.
		 */
		snapshot = RegisterSnapshot(GetTransactionSnapshot());
		if (IsolationUsesXactSnapshot() && index->rd_index->indcheckxmin &&
			!TransactionIdPrecedes(HeapTupleHeaderGetXmin(index->rd_indextuple->t_data), snapshot->xmin))
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("index \"%s\" cannot be checked with heapallindexed in this transaction's snapshot",
							RelationGetRelationName(index)),
					 errhint("Run the check in a new transaction, or in READ COMMITTED.")));
	}

	CheckMetapage(cs);
	if (cs->meta.trained)
	{
		CheckBlob(cs, cs->meta.centroid_start, GpuIvfpqCentroidBytes(&cs->meta));
		CheckBlob(cs, cs->meta.codebook_start, GpuIvfpqCodebookBytes(&cs->meta));
	}
	CheckListDir(cs);
	cs->heap_nblocks = RelationGetNumberOfBlocks(heap);
	for (uint32 l = 0; l < cs->meta.lists; l++)
		CheckList(cs, l);
	CheckDuplicates(cs);
	if (heapallindexed)
	{
		CheckHeapAllIndexed(cs, snapshot);
		UnregisterSnapshot(snapshot);
	}
	elog(DEBUG1, "gpu_ivfpq_check: index \"%s\" is sound: %u lists, %lld entries, %u blocks",
		 RelationGetRelationName(index), cs->meta.lists, (long long) cs->ntids, cs->nblocks);

	FreeAccessStrategy(cs->strategy);
	table_close(heap, AccessShareLock);
	index_close(index, AccessShareLock);
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	PG_RETURN_VOID();
}
