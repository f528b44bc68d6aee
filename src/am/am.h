// The gpu_ivfpq access method: its on-disk format (known only to src/am),
// options, and the prototypes of each file of src/am.
#pragma once

#include "engine/rabitq.h"
#include "common/gpu_ivfpq.h"

namespace gpuivfpq {
class IvfPqModel;
class RabitqModel;
class TopK;
struct IvfPqQuery;
}

/* ---- on-disk format ---- */
#define GPU_IVFPQ_MAGIC			0x49565051	/* "IVPQ" */
#define GPU_IVFPQ_VERSION		1
#define GPU_IVFPQ_PAGE_ID		0xFF8A		/* last 2 bytes of every page */
#define GPU_IVFPQ_METAPAGE_BLKNO	0

/* page kinds, in the opaque flags */
#define GPU_IVFPQ_PAGE_META		1
#define GPU_IVFPQ_PAGE_BLOB		2	/* centroids or codebooks, raw floats */
#define GPU_IVFPQ_PAGE_LISTDIR	3
#define GPU_IVFPQ_PAGE_LIST		4

#define GPU_IVFPQ_NBITS			8	/* bits per PQ code (the only size) */

/* Every page carries this in its special space. */
typedef struct GpuIvfpqPageOpaqueData
{
	BlockNumber next;			/* next page of a list chain, or Invalid */
	uint16		flags;			/* GPU_IVFPQ_PAGE_* */
	uint16		page_id;		/* GPU_IVFPQ_PAGE_ID */
} GpuIvfpqPageOpaqueData;
typedef GpuIvfpqPageOpaqueData *GpuIvfpqPageOpaque;

#define GpuIvfpqPageGetOpaque(page) \
	((GpuIvfpqPageOpaque) PageGetSpecialPointer(page))

/* pd_special of every page: the opaque at the end. */
#define GPU_IVFPQ_SPECIAL_OFFSET \
	(BLCKSZ - MAXALIGN(sizeof(GpuIvfpqPageOpaqueData)))

/* Bytes usable for content on one page (between header and special space). */
#define GPU_IVFPQ_PAGE_CONTENT \
	(BLCKSZ - MAXALIGN(SizeOfPageHeaderData) - MAXALIGN(sizeof(GpuIvfpqPageOpaqueData)))

/* Metapage contents. */
typedef struct GpuIvfpqMetaPageData
{
	uint32		magic;
	uint32		version;
	uint32		dimensions;
	uint32		lists;			/* lists in the directory (1 when untrained) */
	uint16		m;				/* PQ sub-quantizers (0 when untrained) */
	uint16		nbits;
	uint8		metric;			/* gpuivfpq::Metric */
	bool		trained;		/* quantizers exist; else entries hold no code */
	uint32		build_id;		/* changes with every build: cache key */
	BlockNumber centroid_start; /* lists x dim floats, consecutive pages */
	BlockNumber codebook_start; /* m x 256 x (dim/m) floats */
	BlockNumber listdir_start;	/* consecutive list directory pages */
	uint32		listdir_pages;
	uint64		build_tuples;	/* rows indexed by the build */
	uint32		features;		/* GPU_IVFPQ_FEATURE_* (0 in indexes built before them) */
	uint32		flags;			/* GPU_IVFPQ_META_* state (0 in indexes built before them) */
} GpuIvfpqMetaPageData;

/*
 * flags took what was the struct's tail padding: the metapage keeps its
 * size (and a new build its pd_lower), and older indexes read 0 there.
 */
StaticAssertDecl(sizeof(GpuIvfpqMetaPageData) == 64, "the metapage struct changed size");

/* The list directory keeps each list's maximum quantization error (range search). */
#define GPU_IVFPQ_FEATURE_QERROR	0x1
/* List pages carry the rows' exact vectors (see GpuIvfpqEntryLayout). */
#define GPU_IVFPQ_FEATURE_VECTORS	0x4
/* A development layout with vectors inside the entries: refused (REINDEX). */
#define GPU_IVFPQ_FEATURE_RETIRED	0x2
/* Entries carry the filter column's value (a second, integer key column). */
#define GPU_IVFPQ_FEATURE_FILTER	0x8
/*
 * The entries' codes are RaBitQ codes (codes = rabitq), not PQ codes: m is
 * then the bytes of a row's code and its three float factors
 * (gpuivfpq::rabitq_row_bytes), nbits the bits per dimension, and the
 * codebook blob holds the random rotation (dimensions x dimensions floats)
 * and the rotated list centroids (GpuIvfpqRabitqRotatedOffset). Such
 * entries keep no vector copies. See docs/rabitq-codes.md.
 */
#define GPU_IVFPQ_FEATURE_RABITQ	0x10
/* Every feature this version reads; an index with another bit set is refused. */
#define GPU_IVFPQ_FEATURES_KNOWN \
	(GPU_IVFPQ_FEATURE_QERROR | GPU_IVFPQ_FEATURE_VECTORS | GPU_IVFPQ_FEATURE_FILTER | \
	 GPU_IVFPQ_FEATURE_RABITQ)

/* The most dimensions RaBitQ codes take (gpuivfpq::kRabitqMaxDims: a dense rotation). */
#define GPU_IVFPQ_RABITQ_MAX_DIM	2000

/*
 * Where the rotated centroids start in the codebook blob of RaBitQ codes:
 * after the rotation, 8-aligned (the engine's layout, which the GPU
 * mirrors read too).
 */
#define GpuIvfpqRabitqRotatedOffset(dim) \
	((Size) gpuivfpq::rabitq_rotated_offset((size_t) (dim)))

/* Whether an index's entries hold RaBitQ codes. */
#define GpuIvfpqIsRabitq(meta) \
	((meta)->trained && ((meta)->features & GPU_IVFPQ_FEATURE_RABITQ) != 0)

/*
 * The index was inserted into or vacuumed on a server that did not preload
 * gpu_ivfpq, so no WAL record announced the change to standbys' GPU
 * mirrors: a standby serves the index from its pages (CPU) until a build
 * starts over without the flag, or a server that preloads gpu_ivfpq clears
 * it (dropping the standbys' mirrors first). Unlike a feature bit it says
 * nothing about the layout: builds that do not know it ignore it.
 */
#define GPU_IVFPQ_META_UNANNOUNCED	0x1
/* Every state flag this version sets (the index checker reports others). */
#define GPU_IVFPQ_META_FLAGS_KNOWN	GPU_IVFPQ_META_UNANNOUNCED
typedef GpuIvfpqMetaPageData *GpuIvfpqMetaPage;

#define GpuIvfpqPageGetMeta(page) ((GpuIvfpqMetaPage) PageGetContents(page))

/* One inverted list in the directory. */
typedef struct GpuIvfpqListDirEntry
{
	BlockNumber head;			/* first page of the chain, or Invalid */
	BlockNumber insert_hint;	/* a page at or before the first with room */
	float4		radius;			/* covering radius: max ||x - c|| (never shrinks) */
	float4		qerror;			/* max ||x - decoded x|| (never shrinks), if FEATURE_QERROR */
} GpuIvfpqListDirEntry;

#define GPU_IVFPQ_LISTDIR_PER_PAGE \
	((int) (GPU_IVFPQ_PAGE_CONTENT / sizeof(GpuIvfpqListDirEntry)))

/*
 * List pages hold packed entries from PageGetContents, a heap TID (6 bytes)
 * followed by the m-byte PQ code; pd_lower marks their end, so GenericXLog
 * logs only the used part of a page. In indexes with
 * GPU_IVFPQ_FEATURE_VECTORS each entry also has the row's exact vector
 * (dimensions float4), which lets the mirror and the CPU re-rank compute
 * exact distances without reading the heap. The vectors live apart, in a
 * region at the end of the page (entry i's at vec_offset + i * 4 dims from
 * PageGetContents, 4-byte aligned; pd_upper marks the region's start): the
 * list scan reads only the small entries, and only the candidates it keeps
 * touch their vectors.
 *
 * In indexes with GPU_IVFPQ_FEATURE_FILTER (a second key column, an
 * integer) each entry ends with that column's value as an int64 (8 bytes,
 * unaligned; GPU_IVFPQ_NULL_FILTER_KEY for NULL), which scans compare with
 * the filter's range before ranking the entry.
 *
 * Entries travel between a build or an insert and the page in a transfer
 * form: vector (if any), then TID, code and filter key, xsize bytes each.
 */
#define GPU_IVFPQ_TID_BYTES		((int) sizeof(ItemPointerData))
#define GPU_IVFPQ_FILTER_KEY_BYTES	((int) sizeof(int64))
/*
 * The filter key of a row whose filter column is NULL. An int8 column may
 * hold this value too, so an int8 range without a lower bound holds NULLs;
 * scans recheck their filter on each row they return, so such NULL rows
 * only cost candidate slots (smallint and integer ranges, clipped to their
 * type, never hold it).
 */
#define GPU_IVFPQ_NULL_FILTER_KEY	PG_INT64_MIN

/* Where the parts of a list entry lie (GpuIvfpqLayoutOf gives an index's). */
typedef struct GpuIvfpqEntryLayout
{
	int			size;			/* bytes per entry in the entry region (TID + code + key) */
	int			m;				/* code bytes (0 in an untrained index) */
	bool		keyed;			/* entries end with a filter key */
	int			vdim;			/* floats of the exact vector (0: none) */
	int			capacity;		/* entries per page */
	int			vec_offset;		/* the vector region, from PageGetContents */
	int			xsize;			/* bytes per entry in the transfer form */
	int			xtid;			/* offset of the TID in the transfer form */
	int			xcode;			/* offset of the code in the transfer form */
	int			xkey;			/* offset of the filter key in the transfer form */
} GpuIvfpqEntryLayout;

static inline GpuIvfpqEntryLayout
GpuIvfpqLayout(int m, int vdim, bool keyed)
{
	GpuIvfpqEntryLayout el;
	int			vbytes = (int) sizeof(float) * vdim;

	el.m = m;
	el.vdim = vdim;
	el.keyed = keyed;
	el.size = GPU_IVFPQ_TID_BYTES + m + (keyed ? GPU_IVFPQ_FILTER_KEY_BYTES : 0);
	el.capacity = (int) (GPU_IVFPQ_PAGE_CONTENT / (el.size + vbytes));
	/* The vector region ends at the special space (whose offset is MAXALIGNed). */
	el.vec_offset = (int) GPU_IVFPQ_PAGE_CONTENT - el.capacity * vbytes;
	el.xtid = vbytes;
	el.xcode = el.xtid + GPU_IVFPQ_TID_BYTES;
	el.xkey = el.xcode + m;
	el.xsize = el.xkey + (keyed ? GPU_IVFPQ_FILTER_KEY_BYTES : 0);
	return el;
}

static inline int
GpuIvfpqEntriesPerPage(const GpuIvfpqEntryLayout *el)
{
	return el->capacity;
}

static inline int
GpuIvfpqPageEntryCount(Page page, const GpuIvfpqEntryLayout *el)
{
	return (int) ((((PageHeader) page)->pd_lower - MAXALIGN(SizeOfPageHeaderData)) / el->size);
}

/* TIDs travel through the engine and the GPU as 64-bit labels. */
static inline int64
GpuIvfpqTidToLabel(const ItemPointerData *tid)
{
	return ((int64) ItemPointerGetBlockNumberNoCheck(tid) << 16) |
		ItemPointerGetOffsetNumberNoCheck(tid);
}

static inline void
GpuIvfpqLabelToTid(int64 label, ItemPointerData *tid)
{
	ItemPointerSet(tid, (BlockNumber) (label >> 16), (OffsetNumber) (label & 0xFFFF));
}

/* The heap TID of entry i of a page's packed entries (unaligned on the page: copied). */
static inline void
GpuIvfpqEntryTid(const char *entries, int i, const GpuIvfpqEntryLayout *el, ItemPointerData *tid)
{
	memcpy(tid, entries + (Size) i * el->size, GPU_IVFPQ_TID_BYTES);
}

/* The heap TID of entry i of a page's packed entries, as a label. */
static inline int64
GpuIvfpqEntryLabel(const char *entries, int i, const GpuIvfpqEntryLayout *el)
{
	ItemPointerData tid;

	GpuIvfpqEntryTid(entries, i, el, &tid);
	return GpuIvfpqTidToLabel(&tid);
}

/* The PQ code of entry i of a page's packed entries. */
static inline const uint8 *
GpuIvfpqEntryCode(const char *entries, int i, const GpuIvfpqEntryLayout *el)
{
	return (const uint8 *) entries + (Size) i * el->size + GPU_IVFPQ_TID_BYTES;
}

/* The filter key of entry i of a page's packed entries (el->keyed). */
static inline int64
GpuIvfpqEntryFilterKey(const char *entries, int i, const GpuIvfpqEntryLayout *el)
{
	int64		key;

	memcpy(&key, entries + (Size) i * el->size + GPU_IVFPQ_TID_BYTES + el->m, sizeof(key));
	return key;
}

/* An inclusive range of filter keys a scan keeps (lo > hi: none). */
typedef struct GpuIvfpqKeyRange
{
	int64		lo;
	int64		hi;
} GpuIvfpqKeyRange;

/* Whether entry i passes a scan's filter: no range, or its filter key within it. */
static inline bool
GpuIvfpqEntryInRange(const char *entries, int i, const GpuIvfpqEntryLayout *el,
					 const GpuIvfpqKeyRange *range)
{
	int64		key;

	if (range == NULL)
		return true;
	key = GpuIvfpqEntryFilterKey(entries, i, el);
	return key >= range->lo && key <= range->hi;
}

/*
 * The exact vector of entry i (el->vdim floats, aligned), if the layout has
 * one; entries is the page's PageGetContents.
 */
static inline const float *
GpuIvfpqEntryVector(const char *entries, int i, const GpuIvfpqEntryLayout *el)
{
	return (const float *) (entries + el->vec_offset + (Size) i * el->vdim * sizeof(float));
}

/*
 * ERROR for a broken invariant of the on-disk format, naming the index, the
 * block and what is wrong (fmt takes at least one argument).
 */
#define GpuIvfpqReportCorrupt(index, blk, fmt, ...) \
	ereport(ERROR, \
			(errcode(ERRCODE_INDEX_CORRUPTED), \
			 errmsg("index \"%s\" block %u: " fmt, RelationGetRelationName(index), \
					(unsigned int) (blk), __VA_ARGS__), \
			 errhint("REINDEX the index to rebuild it from its table.")))

/*
 * Checks on what a reader trusts (pages.cpp reports the failures). They are
 * cheap enough for every page a scan reads, and turn a corrupt page into an
 * ERROR instead of a read past a buffer or an endless chain; the index
 * checker (check.cpp) calls the same ones, so both say the same thing.
 */
[[noreturn]] extern void GpuIvfpqReportBadPage(Relation index, BlockNumber blk, Page page, uint16 kind,
											   const GpuIvfpqEntryLayout *el, int list);

/* Whether page carries gpu_ivfpq's special space, page id and the given kind. */
static inline bool
GpuIvfpqPageIsKind(Page page, uint16 kind)
{
	GpuIvfpqPageOpaque opaque;

	/* pd_special first: a corrupt one would point the opaque outside the page. */
	if (((PageHeader) page)->pd_special != GPU_IVFPQ_SPECIAL_OFFSET)
		return false;
	opaque = GpuIvfpqPageGetOpaque(page);
	return opaque->page_id == GPU_IVFPQ_PAGE_ID && opaque->flags == kind;
}

/* Errors unless block blk's page is a gpu_ivfpq page of the given kind. */
static inline void
GpuIvfpqCheckPage(Relation index, BlockNumber blk, Page page, uint16 kind)
{
	if (unlikely(!GpuIvfpqPageIsKind(page, kind)))
		GpuIvfpqReportBadPage(index, blk, page, kind, NULL, -1);
}

/*
 * The number of entries on list page blk, after checking that it is a list
 * page whose pd_lower ends a whole number of entries within its capacity
 * (callers size arrays by the capacity). list, when known (else -1), is
 * named in the error.
 */
static inline int
GpuIvfpqListPageEntries(Relation index, BlockNumber blk, Page page, const GpuIvfpqEntryLayout *el,
						int list)
{
	int			used = (int) ((PageHeader) page)->pd_lower - (int) MAXALIGN(SizeOfPageHeaderData);
	int			esz = el->size;

	if (unlikely(!GpuIvfpqPageIsKind(page, GPU_IVFPQ_PAGE_LIST) || used < 0 || used % esz != 0 ||
				 used / esz > GpuIvfpqEntriesPerPage(el) ||
				 (el->vdim > 0 && used > 0 &&
				  ((PageHeader) page)->pd_upper != MAXALIGN(SizeOfPageHeaderData) + el->vec_offset)))
		GpuIvfpqReportBadPage(index, blk, page, GPU_IVFPQ_PAGE_LIST, el, list);
	return used / esz;
}

/* A walk along one list chain, for the checks of GpuIvfpqChainStep. */
typedef struct GpuIvfpqChainWalk
{
	BlockNumber nblocks;		/* the index's size when last asked (0: not yet) */
	BlockNumber pages;			/* pages of the chain read so far */
} GpuIvfpqChainWalk;

extern void GpuIvfpqChainRecheck(Relation index, GpuIvfpqChainWalk *walk, BlockNumber from,
								 BlockNumber blk);

/*
 * Checks blk, the next page of a chain (reached from page `from`, or from the
 * list directory when from is InvalidBlockNumber), before it is read: it lies
 * within the index, and the chain has no more pages than the index (else it
 * loops). The size is asked again only when blk seems past it: concurrent
 * inserts extend the index.
 */
static inline void
GpuIvfpqChainStep(Relation index, GpuIvfpqChainWalk *walk, BlockNumber from, BlockNumber blk)
{
	if (unlikely(blk >= walk->nblocks || walk->pages >= walk->nblocks))
		GpuIvfpqChainRecheck(index, walk, from, blk);
	walk->pages++;
}

/*
 * A backend's hints of the shared buffer that last held each block of an
 * index (index->rd_amcache, allocated in rd_indexcxt, so it goes with the
 * relcache entry). A scan reads every page of the probed lists, thousands
 * per query where entries carry vectors; with a hint it pins the page with
 * ReadRecentBuffer, which checks the buffer's tag instead of searching the
 * shared buffer mapping table, and it can prefetch the next page of a chain
 * before it reads it. A stale hint only costs the ordinary read. Blocks past
 * GPU_IVFPQ_BUFFER_HINTS_MAX get none (it bounds the array, 4 bytes a block).
 */
typedef struct GpuIvfpqBufferHints
{
	BlockNumber n;				/* blocks with room for a hint */
	Buffer		buf[FLEXIBLE_ARRAY_MEMBER]; /* InvalidBuffer: none yet */
} GpuIvfpqBufferHints;

#define GPU_IVFPQ_BUFFER_HINTS_MAX	((BlockNumber) 1 << 22)

extern GpuIvfpqBufferHints *GpuIvfpqGrowBufferHints(Relation index, BlockNumber blk);

/* The hints of index, or NULL where it has none (local buffers: a temporary index). */
static inline GpuIvfpqBufferHints *
GpuIvfpqBufferHintsOf(Relation index)
{
	if (RelationUsesLocalBuffers(index))
		return NULL;
	return (GpuIvfpqBufferHints *) index->rd_amcache;
}

/* Pins block blk of index (as ReadBuffer), through its hint when it still holds. */
static inline Buffer
GpuIvfpqReadHinted(Relation index, BlockNumber blk)
{
	GpuIvfpqBufferHints *h = GpuIvfpqBufferHintsOf(index);
	Buffer		buf;

	if (RelationUsesLocalBuffers(index) || blk >= GPU_IVFPQ_BUFFER_HINTS_MAX)
		return ReadBuffer(index, blk);
	if (h != NULL && blk < h->n && BufferIsValid(h->buf[blk]) &&
		ReadRecentBuffer(GpuIvfpqRelFileOf(index), MAIN_FORKNUM, blk, h->buf[blk]))
	{
		/* counted as ReadBuffer counts a hit (pg_statio_*_indexes) */
		pgstat_count_buffer_read(index);
		pgstat_count_buffer_hit(index);
		return h->buf[blk];
	}
	buf = ReadBuffer(index, blk);
	if (h == NULL || blk >= h->n)
		h = GpuIvfpqGrowBufferHints(index, blk);
	h->buf[blk] = buf;
	return buf;
}

/*
 * Asks the CPU to fetch the start of the page that blk's hint points to
 * (its header and first entries), its special space and its buffer
 * descriptor while the current page is being read: a
 * chain's pages lie far apart in memory, and each would otherwise stall the
 * list scan on its first entries. Only a prefetch: nothing is read.
 */
static inline void
GpuIvfpqPrefetchHinted(Relation index, BlockNumber blk)
{
	GpuIvfpqBufferHints *h = GpuIvfpqBufferHintsOf(index);

	if (h != NULL && blk < h->n && BufferIsValid(h->buf[blk]))
	{
		const char *p = (const char *) BufferGetBlock(h->buf[blk]);

		/* the buffer's descriptor, which pinning and locking update */
		__builtin_prefetch(GetBufferDescriptor(h->buf[blk] - 1), 1);

		for (int off = 0; off < 1024; off += 64)
			__builtin_prefetch(p + off);
		/* the special space, with the page's kind and its next block */
		__builtin_prefetch(p + BLCKSZ - sizeof(GpuIvfpqPageOpaqueData));
	}
}

/*
 * A place in a list chain that a walk can stop at and go on from: the page
 * to read next (InvalidBlockNumber once the chain is done) and the checks of
 * GpuIvfpqChainStep, carried over so that a walk taken in parts still stops
 * on a chain that loops.
 */
typedef struct GpuIvfpqChainCursor
{
	GpuIvfpqChainWalk walk;
	BlockNumber from;			/* the page read last (InvalidBlockNumber: none) */
	BlockNumber next;			/* the page to read next */
} GpuIvfpqChainCursor;

static inline void
GpuIvfpqChainCursorInit(GpuIvfpqChainCursor *cur, BlockNumber head)
{
	cur->walk.nblocks = 0;
	cur->walk.pages = 0;
	cur->from = InvalidBlockNumber;
	cur->next = head;
}

/*
 * Reads the cursor's next page (there must be one) and calls fn(entries, n,
 * blk) with it share-locked: n packed entries laid out as el says. With
 * hinted, the page is pinned through the index's buffer hints
 * (GpuIvfpqReadHinted) and the chain's following page is prefetched: for
 * the scans' list readers, which read many pages per call.
 */
template <typename F>
static inline void
GpuIvfpqChainCursorStep(Relation index, GpuIvfpqChainCursor *cur, const GpuIvfpqEntryLayout *el,
						bool hinted, F &&fn)
{
	BlockNumber blk = cur->next;
	Buffer		buf;
	Page		page;
	int			n;
	BlockNumber next;

	GpuIvfpqChainStep(index, &cur->walk, cur->from, blk);
	buf = hinted ? GpuIvfpqReadHinted(index, blk) : ReadBuffer(index, blk);
	LockBuffer(buf, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buf);
	n = GpuIvfpqListPageEntries(index, blk, page, el, -1);
	next = GpuIvfpqPageGetOpaque(page)->next;
	if (hinted && next != InvalidBlockNumber)
		GpuIvfpqPrefetchHinted(index, next);
	fn((const char *) PageGetContents(page), n, blk);
	cur->from = blk;
	cur->next = next;
	UnlockReleaseBuffer(buf);
	CHECK_FOR_INTERRUPTS();
}

/* Calls fn(entries, n, blk) for each page of the list chain starting at head (GpuIvfpqChainCursorStep). */
template <typename F>
static inline void
GpuIvfpqWalkListHinted(Relation index, BlockNumber head, const GpuIvfpqEntryLayout *el, bool hinted,
					   F &&fn)
{
	GpuIvfpqChainCursor cur;

	GpuIvfpqChainCursorInit(&cur, head);
	while (cur.next != InvalidBlockNumber)
		GpuIvfpqChainCursorStep(index, &cur, el, hinted, fn);
}

/* GpuIvfpqWalkListHinted without hints: one pass over a chain (builds, mirror loads, checks). */
template <typename F>
static inline void
GpuIvfpqWalkList(Relation index, BlockNumber head, const GpuIvfpqEntryLayout *el, F &&fn)
{
	GpuIvfpqWalkListHinted(index, head, el, false, fn);
}

/* ---- options ---- */
typedef struct GpuIvfpqOptions
{
	int32		vl_len_;		/* varlena header (do not touch directly!) */
	int			lists;
	int			m;				/* 0 = choose from the dimension */
	int			nbits;
	bool		store_vectors;	/* keep each row's exact vector in its entry */
	int			placement;		/* GPU_IVFPQ_PLACEMENT_*: replicas or shards over several GPUs */
	int			codes;			/* GPU_IVFPQ_CODES_*: what the entries' codes are */
	int			bits;			/* RaBitQ bits per dimension */
} GpuIvfpqOptions;

#define GPU_IVFPQ_CODES_PQ			0
#define GPU_IVFPQ_CODES_RABITQ		1
#define GPU_IVFPQ_DEFAULT_RABITQ_BITS 4

#define GPU_IVFPQ_DEFAULT_LISTS 100

/* ---- opclass support ---- */
#define GPU_IVFPQ_DISTANCE_PROC 1
#define GPU_IVFPQ_METRIC_PROC	2

/* ---- pages.cpp ---- */
extern void GpuIvfpqInitPage(Page page, uint16 flags);
extern Buffer GpuIvfpqNewBuffer(Relation index, ForkNumber fork);
extern void GpuIvfpqReadMeta(Relation index, GpuIvfpqMetaPageData *meta);
extern void GpuIvfpqCheckMeta(Relation index, const GpuIvfpqMetaPageData *meta);
extern BlockNumber GpuIvfpqBlobPages(Size bytes);
extern Size GpuIvfpqCentroidBytes(const GpuIvfpqMetaPageData *meta);
extern Size GpuIvfpqCodebookBytes(const GpuIvfpqMetaPageData *meta);
extern void GpuIvfpqCheckExtent(Relation index, const char *what, BlockNumber start, BlockNumber npages);
extern void GpuIvfpqCheckBlobPage(Relation index, BlockNumber blk, Page page, Size chunk);
extern void GpuIvfpqCheckListDirPage(Relation index, BlockNumber blk, Page page, int entries);
extern int	GpuIvfpqListDirPageEntries(const GpuIvfpqMetaPageData *meta, uint32 page);
extern BlockNumber GpuIvfpqWriteBlob(Relation index, const void *data, Size bytes);
extern void GpuIvfpqReadBlob(Relation index, BlockNumber start, void *data, Size bytes);
extern void GpuIvfpqReadQuantizers(Relation index, const GpuIvfpqMetaPageData *meta, MemoryContext cxt,
								   float **centroids, float **codebooks);
extern GpuIvfpqListDirEntry *GpuIvfpqReadListDir(Relation index, const GpuIvfpqMetaPageData *meta);
extern void GpuIvfpqAppendEntries(Relation index, const GpuIvfpqMetaPageData *meta, int list,
								  const char *entries, int count, float radius, float qerror,
								  bool building);
extern void GpuIvfpqLowerInsertHint(Relation index, const GpuIvfpqMetaPageData *meta, int list, BlockNumber blk);
extern void GpuIvfpqSetDimensions(Relation index, GpuIvfpqMetaPageData *meta, int dim);
extern void GpuIvfpqSetMetaFlag(Relation index, GpuIvfpqMetaPageData *meta, uint32 flag, bool on);
extern int	GpuIvfpqDefaultM(int dim);
extern int	GpuIvfpqMetricOf(Relation index);
extern GpuIvfpqEntryLayout GpuIvfpqLayoutOf(const GpuIvfpqMetaPageData *meta);
extern double GpuIvfpqRowsEstimate(Relation index, const GpuIvfpqMetaPageData *meta);
extern bool GpuIvfpqVectorsFit(int dim, int m, bool keyed);
extern bool GpuIvfpqHasFilterColumn(Relation index);
extern int64 GpuIvfpqFilterKeyOf(Relation index, Datum value, bool isnull);

/* ---- model_cache.cpp ---- */
extern gpuivfpq::IvfPqModel *GpuIvfpqGetModel(Relation index, const GpuIvfpqMetaPageData *meta);
extern gpuivfpq::RabitqModel *GpuIvfpqGetRabitqModel(Relation index, const GpuIvfpqMetaPageData *meta);
extern void GpuIvfpqModelTables(gpuivfpq::IvfPqModel *model);

/* ---- lists.cpp ---- */
extern int64 GpuIvfpqEntriesBound(Relation index, const GpuIvfpqMetaPageData *meta);
extern int64 GpuIvfpqRankLists(Relation index, const GpuIvfpqMetaPageData *meta,
							   const GpuIvfpqListDirEntry *dir, gpuivfpq::IvfPqModel *model,
							   const gpuivfpq::IvfPqQuery *prepared, int probes,
							   const GpuIvfpqKeyRange *range, gpuivfpq::TopK *topk,
							   const float *query, int64 *labels, double *exact, int *nlabels);

/* A growing array of labels (palloc'd in the context current when it grows). */
typedef struct GpuIvfpqLabels
{
	int64	   *labels;
	int64		n;
	int64		cap;
} GpuIvfpqLabels;

/* An ADC bound for GpuIvfpqCollectList: keep entries whose ADC distance <= limit. */
typedef struct GpuIvfpqAdcBound
{
	const float *table;			/* m x 256 lookup table of the list */
	float		base;			/* the list's constant term */
	float		limit;			/* on the engine's ADC value (squared for L2) */
} GpuIvfpqAdcBound;

extern int64 GpuIvfpqCollectList(Relation index, const GpuIvfpqMetaPageData *meta, BlockNumber head,
								 const GpuIvfpqAdcBound *bound, const GpuIvfpqKeyRange *range,
								 GpuIvfpqLabels *out);

/*
 * GpuIvfpqCollectList in parts: goes on along the chain from cur (hinted)
 * and stops after the page that brings out to stop_at labels or more, or at
 * the chain's end (cur->next InvalidBlockNumber). Returns the entries read.
 */
extern int64 GpuIvfpqCollectPages(Relation index, const GpuIvfpqMetaPageData *meta, GpuIvfpqChainCursor *cur,
								  const GpuIvfpqAdcBound *bound, const GpuIvfpqKeyRange *range,
								  GpuIvfpqLabels *out, int64 stop_at);

/* ---- rabitq.cpp ---- */
extern int	GpuIvfpqRabitqRowBytes(int dim, int bits);
extern void GpuIvfpqRabitqCheckDim(Relation index, int dim);
extern void GpuIvfpqRabitqEncode(const gpuivfpq::RabitqModel *model, const float *x, int n, int32 *lists,
								 uint8 *codes, float *radius, int threads, bool encoded);
extern int64 GpuIvfpqRabitqRankLists(Relation index, const GpuIvfpqMetaPageData *meta,
									 const GpuIvfpqListDirEntry *dir, const float *query, int probes,
									 const GpuIvfpqKeyRange *range, gpuivfpq::TopK *topk,
									 int64 *labels, double *lower, int *nlabels);
extern const char *GpuIvfpqRabitqCodeProblem(const GpuIvfpqMetaPageData *meta, const uint8 *code);

/* ---- build_read.cpp ---- */
/* One row a build reads: its TID, its vector (dim floats) and filter key. */
typedef void (*GpuIvfpqBuildRowFn) (void *state, ItemPointer tid, const float *v, int dim, int64 key);
extern bool GpuIvfpqBuildReadParallel(Relation heap, Relation index, IndexInfo *indexInfo,
									  GpuIvfpqBuildRowFn fn, void *state, double *heap_tuples);

/* ---- build.cpp ---- */
extern IndexBuildResult *gpuivfpqbuild(Relation heap, Relation index, IndexInfo *indexInfo);
extern void gpuivfpqbuildempty(Relation index);
extern char *gpuivfpqbuildphasename(int64 phase);
extern int	GpuIvfpqChooseM(Relation index, int dim, bool existing);
extern void GpuIvfpqCheckNewOptions(Relation index, Datum reloptions, int dim);
extern void GpuIvfpqRelationAltered(Oid relid);

/* ---- insert.cpp ---- */
extern bool gpuivfpqinsert(Relation index, Datum *values, bool *isnull, ItemPointer heap_tid,
						   Relation heap, IndexUniqueCheck checkUnique,
						   bool indexUnchanged, IndexInfo *indexInfo);

/* ---- scan.cpp ---- */
extern IndexScanDesc gpuivfpqbeginscan(Relation index, int nkeys, int norderbys);
extern void gpuivfpqrescan(IndexScanDesc scan, ScanKey keys, int nkeys, ScanKey orderbys, int norderbys);
extern bool gpuivfpqgettuple(IndexScanDesc scan, ScanDirection dir);
extern void gpuivfpqendscan(IndexScanDesc scan);

/* ---- vacuum.cpp ---- */
extern IndexBulkDeleteResult *gpuivfpqbulkdelete(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
												 IndexBulkDeleteCallback callback, void *callback_state);
extern IndexBulkDeleteResult *gpuivfpqvacuumcleanup(IndexVacuumInfo *info, IndexBulkDeleteResult *stats);

/* ---- handler.cpp ---- */
extern void gpuivfpqcostestimate(PlannerInfo *root, IndexPath *path, double loop_count,
								 Cost *indexStartupCost, Cost *indexTotalCost,
								 Selectivity *indexSelectivity, double *indexCorrelation,
								 double *indexPages);
extern bytea *gpuivfpqoptions(Datum reloptions, bool validate);
extern bool gpuivfpqvalidate(Oid opclassoid);
extern bool GpuIvfpqDistanceOrderableProperty(Oid index_oid, int attno, IndexAMProperty prop,
											  const char *propname, bool *res, bool *isnull);
extern double GpuIvfpqOperatorCost(PlannerInfo *root, Expr *expr);
extern void GpuIvfpqRegisterOptions(void);
