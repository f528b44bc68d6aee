// The gpu_metric access method (exact range and k-NN search over text under
// edit distance, with the engine's List of Clusters or SSS index): its
// on-disk format (known only to the files of src/metric), options,
// the per-backend cache of restored indexes, and the prototypes of each file.
#pragma once

#include "am/am.h"
#include "metric/engine.h"

/* ---- on-disk format ---- */
#define GPU_METRIC_MAGIC		0x474D4554	/* "GMET" */
#define GPU_METRIC_VERSION		1
#define GPU_METRIC_PAGE_ID		0xFF8B		/* last 2 bytes of every page */
#define GPU_METRIC_METAPAGE_BLKNO	0

/* page kinds, in the opaque flags */
#define GPU_METRIC_PAGE_META		1
#define GPU_METRIC_PAGE_OBJECTS		2	/* object records, in id order along the chain */
#define GPU_METRIC_PAGE_CLUSTERS	3	/* List of Clusters: (centre, radius) in creation order */

/*
 * Longest word an index stores, in UTF-8 bytes: a record must fit a page,
 * and words this long are rare (a B-tree takes about 2700 bytes).
 */
#define GPU_METRIC_MAX_WORD_BYTES	2048
/* Most pivots an SSS index keeps: each object's record holds a byte per pivot. */
#define GPU_METRIC_MAX_PIVOTS		1024

/* Every page carries this in its special space. */
typedef struct GpuMetricPageOpaqueData
{
	BlockNumber next;			/* next page of the chain, or Invalid */
	uint16		flags;			/* GPU_METRIC_PAGE_* */
	uint16		page_id;		/* GPU_METRIC_PAGE_ID */
} GpuMetricPageOpaqueData;
typedef GpuMetricPageOpaqueData *GpuMetricPageOpaque;

#define GpuMetricPageGetOpaque(page) \
	((GpuMetricPageOpaque) PageGetSpecialPointer(page))
#define GPU_METRIC_SPECIAL_OFFSET \
	(BLCKSZ - MAXALIGN(sizeof(GpuMetricPageOpaqueData)))
/* Bytes usable for content on one page (between header and special space). */
#define GPU_METRIC_PAGE_CONTENT \
	((int) (BLCKSZ - MAXALIGN(SizeOfPageHeaderData) - MAXALIGN(sizeof(GpuMetricPageOpaqueData))))

/*
 * Metapage contents. change_count changes with every insert and with every
 * page VACUUM changes, in the same WAL record as the pages: a backend's
 * restored copy of the index is current while its count and build_id match
 * (cache.cpp), on a primary and on a standby alike. A copy behind
 * by inserts alone (vacuum_count unchanged) catches up by reading the
 * object records appended since.
 */
typedef struct GpuMetricMetaPageData
{
	uint32		magic;
	uint32		version;
	uint32		method;			/* GPU_METRIC_METHOD_* */
	uint32		build_id;		/* random per build: with the relfilenode, the cache key */
	uint64		change_count;
	uint64		vacuum_count;	/* +1 for every page VACUUM changes (inserts only append) */
	uint64		objects;		/* object records (ids 0..objects-1), removed ones included */
	uint64		live;			/* objects not removed */
	uint64		build_tuples;	/* rows indexed by the build */
	uint32		bucket;			/* List of Clusters: bucket size */
	uint32		clusters;		/* List of Clusters: entries on the cluster pages */
	float8		alpha;			/* SSS: pivot selection */
	uint32		max_distance;	/* SSS: M, as the build used it */
	uint32		pivots;			/* SSS: pivots (objects flagged GPU_METRIC_OBJ_PIVOT) */
	BlockNumber object_head;	/* chain of object pages (Invalid: none yet) */
	BlockNumber object_tail;	/* its last page, where inserts append */
	BlockNumber cluster_head;	/* chain of cluster pages */
	BlockNumber cluster_tail;
} GpuMetricMetaPageData;
typedef GpuMetricMetaPageData *GpuMetricMetaPage;

#define GpuMetricPageGetMeta(page) ((GpuMetricMetaPage) PageGetContents(page))

/*
 * Object pages hold packed records from PageGetContents to pd_lower, in id
 * order along the chain (object id = position):
 *   header (GPU_METRIC_OBJ_HEADER bytes): heap TID, flags, word bytes;
 *   List of Clusters: the cluster (uint32) the object centres or is in;
 *   SSS: one byte per pivot, min(d(pivot, object), 255);
 *   the word, UTF-8.
 * Unaligned: read and written with memcpy.
 */
#define GPU_METRIC_OBJ_REMOVED	0x1		/* VACUUM found its row dead; still routes */
#define GPU_METRIC_OBJ_PIVOT	0x2		/* SSS: a pivot */
#define GPU_METRIC_OBJ_FLAGS	(GPU_METRIC_OBJ_REMOVED | GPU_METRIC_OBJ_PIVOT)

typedef struct GpuMetricObjectHeader
{
	ItemPointerData tid;
	uint8		flags;
	uint8		reserved;
	uint16		nbytes;			/* the word's UTF-8 bytes */
} GpuMetricObjectHeader;

#define GPU_METRIC_OBJ_HEADER	((int) sizeof(GpuMetricObjectHeader))
#define GPU_METRIC_OBJ_FLAGS_OFFSET	((int) offsetof(GpuMetricObjectHeader, flags))

/* Bytes between an object's header and its word: the method's part. */
static inline int
GpuMetricObjectExtra(const GpuMetricMetaPageData *meta)
{
	return meta->method == GPU_METRIC_METHOD_LC ? (int) sizeof(uint32) : (int) meta->pivots;
}

/* One cluster on the cluster pages (List of Clusters). */
typedef struct GpuMetricClusterEntry
{
	uint32		centre;			/* object id */
	uint32		radius;			/* covering radius */
} GpuMetricClusterEntry;

#define GPU_METRIC_CLUSTERS_PER_PAGE \
	(GPU_METRIC_PAGE_CONTENT / (int) sizeof(GpuMetricClusterEntry))

/* ---- operator class ---- */
#define GPU_METRIC_RANGE_STRATEGY	1	/* text <% edit_range */
#define GPU_METRIC_ORDER_STRATEGY	2	/* ORDER BY text <~> text */

/* ---- options ---- */
typedef struct GpuMetricOptions
{
	int32		vl_len_;		/* varlena header (do not touch directly!) */
	int			method;			/* GPU_METRIC_METHOD_* */
	int			bucket;
	double		alpha;
} GpuMetricOptions;

#define GPU_METRIC_DEFAULT_BUCKET	32
#define GPU_METRIC_MAX_BUCKET		65536
#define GPU_METRIC_DEFAULT_ALPHA	0.5

/* Most neighbours per query of gpu_metric_knn_batch. */
#define GPU_METRIC_BATCH_MAX_K		1000

/*
 * ERROR for a broken invariant of the on-disk format, naming the index, the
 * block and what is wrong (fmt takes at least one argument).
 */
#define GpuMetricReportCorrupt(index, blk, fmt, ...) \
	ereport(ERROR, \
			(errcode(ERRCODE_INDEX_CORRUPTED), \
			 errmsg("index \"%s\" block %u: " fmt, RelationGetRelationName(index), \
					(unsigned int) (blk), __VA_ARGS__), \
			 errhint("REINDEX the index to rebuild it from its table.")))

/* ---- text.cpp ---- */
extern char *GpuMetricUtf8(text *t, int *len);
extern char *GpuMetricDatumUtf8(Datum value, int *len);
extern void GpuMetricCheckLength(const char *utf8, int len);
extern uint32 *GpuMetricCodePoints(const char *utf8, int len, int *ncp);
extern void GpuMetricCheckWordBytes(Relation index, int len);
extern bool GpuMetricRangeArg(Datum range, Datum *word, int32 *radius);
extern void GpuMetricCheckRadius(int32 radius);
extern int	GpuMetricSearchThreads(void);

/* ---- pages.cpp ---- */
extern void GpuMetricInitPage(Page page, uint16 kind);
extern void GpuMetricCheckMeta(Relation index, const GpuMetricMetaPageData *meta);
extern void GpuMetricReadMeta(Relation index, Buffer metabuf, GpuMetricMetaPageData *meta);
extern int	GpuMetricObjectPageUsed(Relation index, BlockNumber blk, Page page);
extern int	GpuMetricNextObject(Relation index, const GpuMetricMetaPageData *meta, BlockNumber blk,
								const char *base, int used, int off, GpuMetricObjectHeader *hdr);
extern GpuMetricStoredState *GpuMetricReadState(Relation index, const GpuMetricMetaPageData *meta,
												ItemPointerData **tids, BlockNumber *end_blk, int *end_off);
extern void GpuMetricWriteMeta(Relation index, Buffer metabuf, const GpuMetricMetaPageData *meta,
							   bool full_image);
extern void GpuMetricEnsureRoom(Relation index, Buffer metabuf, GpuMetricMetaPageData *meta,
								uint16 kind, int bytes);
extern int	GpuMetricAppend(Relation index, Buffer metabuf, GpuMetricMetaPageData *meta,
							const char *record, int reclen, const GpuMetricClusterEntry *cluster,
							bool new_cluster);

/* A chain of pages of one kind being written by a build. */
typedef struct GpuMetricPageWriter
{
	Relation	index;
	uint16		kind;
	Buffer		buf;			/* the page being filled (locked), or Invalid */
	PGAlignedBlock image;		/* its contents, logged as a full image when done */
	BlockNumber head;
	BlockNumber tail;
	BlockNumber pages;
} GpuMetricPageWriter;

extern void GpuMetricWriterBegin(GpuMetricPageWriter *w, Relation index, uint16 kind);
extern void GpuMetricWriterAdd(GpuMetricPageWriter *w, const void *data, int len);
extern void GpuMetricWriterEnd(GpuMetricPageWriter *w);

/* ---- cache.cpp ---- */
/* A backend's restored copy of one index, current as of a change count. */
typedef struct GpuMetricCached
{
	Oid			indexrelid;
	GpuIvfpqRelFile node;
	uint32		build_id;
	uint64		change_count;
	uint64		vacuum_count;
	BlockNumber end_blk;		/* the object page it read last (Invalid: none) */
	int			end_off;		/* and the end of the records it read there */
	bool		valid;			/* false while an insert changes it */
	uint64		last_used;
	MemoryContext cxt;			/* owns all below, the engine included */
	GpuMetricEngine *engine;
	ItemPointerData *tids;		/* object id -> heap TID */
	char	   *bytes;			/* the words' UTF-8, back to back */
	uint64	   *offsets;		/* objects + 1 */
	uint64		objects;
	uint64		capacity;		/* room in tids and offsets */
	Size		bytes_used;
	Size		bytes_capacity;
} GpuMetricCached;

extern GpuMetricCached *GpuMetricGetCached(Relation index, GpuMetricMetaPageData *meta);
extern GpuMetricCached *GpuMetricGetCachedLocked(Relation index, const GpuMetricMetaPageData *meta);
extern void GpuMetricCacheReserve(GpuMetricCached *entry, int len);
extern void GpuMetricCacheAppend(GpuMetricCached *entry, const ItemPointerData *tid, const char *utf8,
								 int len);

/* ---- search.cpp ---- */
/* The answers of a batch of queries: query i's hits are hits[offsets[i], offsets[i + 1]). */
typedef struct GpuMetricHits
{
	int64		nq;
	uint64	   *offsets;		/* nq + 1 */
	gpuivfpq::MetricHit *hits;	/* (object id, distance), sorted by (distance, id) per query */
	uint64		evaluations;	/* distances computed for all the queries */
	uint64		live;			/* live objects: what brute force computes per query */
	bool		on_gpu;			/* a GPU service answered */
} GpuMetricHits;

extern void GpuMetricSearch(Relation index, GpuMetricCached *entry, const GpuMetricMetaPageData *meta,
							bool knn, const uint32 *cps, const uint64 *offsets, int64 nq,
							uint32 param, const uint32 *radii, int threads, GpuMetricHits *out);
extern bool GpuMetricServiceSearch(Relation index, const GpuMetricMetaPageData *meta, bool knn,
								   const uint32 *cps, const uint64 *offsets, int64 nq, uint32 param,
								   const uint32 *radii, GpuMetricHits *out);
extern void GpuMetricSearchNearest(Relation index, GpuMetricCached *entry,
								   const GpuMetricMetaPageData *meta, const uint32 *cps,
								   const uint64 *offsets, int64 nq, uint32 k, int threads,
								   GpuMetricHits *out);
extern bool GpuMetricHitTidLess(const ItemPointerData *tids, const gpuivfpq::MetricHit &a,
								const gpuivfpq::MetricHit &b);
extern void GpuMetricSortByTid(const ItemPointerData *tids, gpuivfpq::MetricHit *hits, int64 n);
extern bool GpuMetricRowVisible(IndexFetchTableData *fetch, Snapshot snapshot, TupleTableSlot *slot,
								ItemPointer tid);

/* ---- build.cpp ---- */
extern IndexBuildResult *gpumetricbuild(Relation heap, Relation index, IndexInfo *indexInfo);
extern void gpumetricbuildempty(Relation index);
extern char *gpumetricbuildphasename(int64 phase);
extern void GpuMetricIndexOptions(Relation index, int *method, int *bucket, double *alpha);

/* ---- insert.cpp ---- */
extern bool gpumetricinsert(Relation index, Datum *values, bool *isnull, ItemPointer heap_tid,
							Relation heap, IndexUniqueCheck checkUnique,
							bool indexUnchanged, IndexInfo *indexInfo);

/* ---- scan.cpp ---- */
extern IndexScanDesc gpumetricbeginscan(Relation index, int nkeys, int norderbys);
extern void gpumetricrescan(IndexScanDesc scan, ScanKey keys, int nkeys, ScanKey orderbys, int norderbys);
extern bool gpumetricgettuple(IndexScanDesc scan, ScanDirection dir);
extern int64 gpumetricgetbitmap(IndexScanDesc scan, TIDBitmap *tbm);
extern void gpumetricendscan(IndexScanDesc scan);

/* ---- vacuum.cpp ---- */
extern IndexBulkDeleteResult *gpumetricbulkdelete(IndexVacuumInfo *info, IndexBulkDeleteResult *stats,
												  IndexBulkDeleteCallback callback, void *callback_state);
extern IndexBulkDeleteResult *gpumetricvacuumcleanup(IndexVacuumInfo *info, IndexBulkDeleteResult *stats);

/* ---- handler.cpp ---- */
extern void GpuMetricRegisterOptions(void);
