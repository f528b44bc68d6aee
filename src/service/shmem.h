// Shared memory between the backends and the GPU service: one request slot
// per process, the change log that keeps mirrors coherent with the pages,
// and the counters the status view shows. Private to src/service.
#pragma once

#include "gpu_process/metric_request.h"
#include "service/service.h"

extern "C" {
#include "port/atomics.h"
#include "storage/dsm.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
}

/* A search's query goes in, its labels and distances come back, in place. */
#define GPU_IVFPQ_SLOT_PAYLOAD	(32 * 1024)
#define GPU_IVFPQ_SERVICE_MAX_DIM ((int) (GPU_IVFPQ_SLOT_PAYLOAD / sizeof(float)))
#define GPU_IVFPQ_SERVICE_MAX_M ((int) gpuivfpq::kMaxGpuSubQuantizers)	/* PQ sub-quantizers the GPU handles */
#define GPU_IVFPQ_LOG_SIZE		16384	/* change-log entries kept for the service */
/* Bytes of the ring that carries appended entries' vectors and wide codes (1 KiB per log entry). */
#define GPU_IVFPQ_VECTOR_RING_BYTES ((Size) GPU_IVFPQ_LOG_SIZE * 1024)
#define GPU_IVFPQ_STATUS_MIRRORS 1024	/* mirrors listed by gpu_ivfpq_mirrors() */
#define GPU_IVFPQ_MIRRORED_MAX 256	/* indexes listed as mirrored (more: every commit waits) */
#define GPU_IVFPQ_BATCH_BUCKETS 8		/* batch sizes 1, 2-3, 4-7, ..., 128+ */

typedef enum ServiceState
{
	SERVICE_STARTING = 0,
	SERVICE_CPU_ONLY,			/* no usable GPU: backends use the CPU engine */
	SERVICE_GPU,				/* serving from a GPU */
	SERVICE_EMULATED,			/* serving from the CPU emulation (tests) */
	SERVICE_RESTARTING,			/* the GPU process died: the CPU engine serves until it is back */
	SERVICE_STOPPED
} ServiceState;

typedef enum SlotState
{
	SLOT_FREE = 0,				/* the owner may fill it */
	SLOT_PENDING,				/* submitted, not yet taken by the service */
	SLOT_RUNNING,				/* taken by the service */
	SLOT_DONE,					/* answered: result and payload are valid */
	SLOT_ABANDONED				/* the owner gave up waiting; the service frees it */
} SlotState;

typedef enum RequestKind
{
	REQ_SEARCH = 0,
	REQ_LOAD,					/* build a mirror from the entries in a DSM segment */
	REQ_TRAIN,					/* train quantizers on a sample (index build) */
	REQ_ENCODE,					/* assign and encode rows (index build) */
	REQ_SEARCH_BATCH,			/* many queries in a DSM segment (batch search) */
	REQ_EXACT,					/* exact k-NN of queries among base rows in a DSM segment */
	REQ_METRIC_LOAD,			/* mirror a gpu_metric index from its state in a DSM segment */
	REQ_METRIC_SEARCH			/* gpu_metric range or k-NN queries, in the payload or a DSM segment */
} RequestKind;

typedef enum RequestResult
{
	RES_OK = 0,
	RES_NOT_LOADED,				/* no mirror: the caller should send REQ_LOAD */
	RES_LOADING,				/* another backend is loading it: use the CPU */
	RES_NO_MEMORY,				/* does not fit the GPU memory budget */
	RES_ERROR,					/* the device failed; error holds the message */
	RES_SERVICE_GONE			/* the service exited before answering */
} RequestResult;

/* Identity of an index version (see gpuivfpq::MirrorKey). */
typedef struct GpuIvfpqKey
{
	Oid			db;
	Oid			index;
	Oid			relnode;
	uint32		build;
} GpuIvfpqKey;

typedef struct GpuIvfpqSlot
{
	slock_t		mutex;			/* protects state and owner */
	SlotState	state;
	int			owner;			/* pid of the backend holding the slot, 0 = none */
	Latch	   *latch;			/* the owner's latch, set when answered */

	/* request, written by the owner before PENDING */
	RequestKind kind;
	GpuIvfpqKey key;
	int			dim;
	int			k;
	int			nprobe;
	bool		filtered;		/* SEARCH: only entries with a filter key in [key_lo, key_hi] */
	bool		brute;			/* SEARCH_BATCH: exact k-NN over every stored vector */
	int64		key_lo;
	int64		key_hi;
	int64		n;				/* LOAD: entries, TRAIN: sample rows, ENCODE: rows */
	uint64		log_start;		/* LOAD: change-log position before the pages were read */
	dsm_handle	dsm;
	/* METRIC_*: the index's metapage change count (part of the mirror's key) */
	uint64		change_count;
	/* METRIC_SEARCH: code points of the queries (n of them), radii (0: k-NN), bytes of the request */
	int64		ncps;
	int			nradii;
	Size		capacity;

	/* answer, written by the service before DONE */
	RequestResult result;
	int			batch;			/* SEARCH: queries in the GPU batch that served it */
	int64		matched;		/* SEARCH, filtered: entries of the probed lists in its range */
	uint8		dists;			/* SEARCH, SEARCH_BATCH: a GpuIvfpqAnswerDists (exact distances, lower bounds) */
	Size		needed;			/* METRIC_SEARCH: bytes its answer needs when they exceed capacity, else 0 */
	int64		live;			/* METRIC_SEARCH: live objects of the mirror */
	uint64		evaluations;	/* METRIC_SEARCH: distances the GPU computed for its queries */
	char		error[256];

	/*
	 * SEARCH: the query (dim floats) in; out k labels (int64) and, with
	 * dists, their k distances (double) after them (k <= 2048 fills it)
	 */
	union
	{
		int64		align;
		char		bytes[GPU_IVFPQ_SLOT_PAYLOAD];
	}			payload;
} GpuIvfpqSlot;

typedef enum LogKind
{
	LOG_APPEND = 1,				/* an entry was added to a list page */
	LOG_INVALIDATE,				/* the index was rebuilt, dropped or changed a lot: drop the mirror */
	LOG_REMOVE					/* VACUUM removed entries: m labels in code[] */
} LogKind;

/*
 * Code bytes a log entry holds in place: every PQ code (at most
 * GPU_IVFPQ_SERVICE_MAX_M sub-quantizers) and narrow RaBitQ rows. A longer
 * code (a RaBitQ row of up to GPU_IVFPQ_LOG_MAX_CODE bytes) travels in the
 * vector ring, after the entry's vector if it has one.
 */
#define GPU_IVFPQ_LOG_INLINE_CODE 128
/* The longest code an entry carries: the widest RaBitQ row. */
#define GPU_IVFPQ_LOG_MAX_CODE	((int) gpuivfpq::kRabitqMaxRowBytes)
/* Labels one LOG_REMOVE entry carries (in its code bytes). */
#define GPU_IVFPQ_LOG_REMOVE_LABELS ((int) (GPU_IVFPQ_LOG_INLINE_CODE / sizeof(int64)))

typedef struct GpuIvfpqLogEntry
{
	uint64		seq;
	GpuIvfpqKey key;
	uint8		kind;
	uint16		m;				/* APPEND: code bytes; REMOVE: labels in code[] */
	int32		list;
	int64		label;
	/*
	 * APPEND: floats of its vector in the vector ring (0: none; -1 in a
	 * reader's copy: the ring's bytes were overwritten before it read them)
	 */
	int32		vdim;
	/* where its ring bytes start (a byte count that only grows): vector, then a code too long for code[] */
	uint64		vec_pos;
	int64		filter_key;		/* APPEND: the entry's filter key (an index with a filter column) */
	uint8		code[GPU_IVFPQ_LOG_INLINE_CODE];	/* the code when m <= GPU_IVFPQ_LOG_INLINE_CODE */
} GpuIvfpqLogEntry;

StaticAssertDecl(GPU_IVFPQ_SERVICE_MAX_M <= GPU_IVFPQ_LOG_INLINE_CODE, "PQ codes lie in a log entry");
StaticAssertDecl(GPU_IVFPQ_LOG_MAX_CODE <= PG_UINT16_MAX, "a log entry's m holds the widest RaBitQ row");
StaticAssertDecl(GPU_IVFPQ_LOG_MAX_CODE % sizeof(float) == 0, "RaBitQ rows keep the ring's vectors aligned");

/*
 * Bytes an append's entry takes in the vector ring: its vector, then its
 * code when that does not lie in the entry, rounded up to whole floats so
 * the next vector stays aligned.
 */
static inline Size
GpuIvfpqLogRingBytes(const GpuIvfpqLogEntry *e)
{
	Size		bytes = sizeof(float) * (Size) Max(e->vdim, 0);

	if (e->kind == LOG_APPEND && e->m > GPU_IVFPQ_LOG_INLINE_CODE)
		bytes += TYPEALIGN(sizeof(float), e->m);
	return bytes;
}

typedef struct GpuIvfpqMirrorStatus
{
	GpuIvfpqKey key;
	int64		entries;
	int64		bytes;
	int64		queries;
	bool		vectors;		/* keeps exact vectors: re-ranks on the device */
	bool		filter_keys;	/* keeps filter keys: filters on the device */
	int			placement;		/* GPU_IVFPQ_PLACEMENT_REPLICATE or _SHARD */
	uint32		device_mask;	/* bit i: the GPU process's device i holds a part */
	bool		metric;			/* a gpu_metric index's mirror (else gpu_ivfpq) */
	uint64		change_count;	/* metric: the metapage change count it mirrors */
} GpuIvfpqMirrorStatus;

#define GPU_IVFPQ_STATUS_DEVICES 16 /* devices listed by gpu_ivfpq_devices() */

/* One GPU of the GPU process, as gpu_ivfpq_devices() lists it. */
typedef struct GpuIvfpqDeviceStatus
{
	int			device;			/* its CUDA device number */
	bool		alive;			/* false once it failed: nothing goes to it */
	char		description[96];
	int64		memory_budget;
	int64		memory_used;	/* by mirrors */
	int64		queries;
	int64		batches;
	int64		busy_us;		/* time it ran calls */
} GpuIvfpqDeviceStatus;

/* The stage counters of the direct path. */
typedef struct GpuIvfpqQueueStats
{
	uint64		batches;
	uint64		queries;
	uint64		hist[GPU_IVFPQ_BATCH_BUCKETS];
	uint64		wait_ns;
	uint64		catchup_ns;
	uint64		catchup_searches;
	uint64		gpu_ns;
	uint64		deliver_ns;
	uint64		failed;
	uint64		not_found;
} GpuIvfpqQueueStats;

/* An index of a database, as the mirrored list names it. */
typedef struct GpuIvfpqIndexRef
{
	Oid			db;
	Oid			index;
} GpuIvfpqIndexRef;

typedef struct GpuIvfpqServiceShared
{
	slock_t		mutex;			/* protects the fields up to the atomics */
	int			pid;			/* 0 when not running */
	Latch	   *latch;			/* the service's latch, set to wake it */
	ServiceState state;
	int			starts;
	TimestampTz started_at;
	char		device[128];
	char		last_error[256];
	int			gpu_pid;		/* the GPU process, 0 when none runs */
	int			gpu_restarts;	/* times the GPU process died and was restarted */
	char		last_gpu_exit[256]; /* how it last died */
	TimestampTz last_gpu_exit_at;
	int			nmirrors;
	GpuIvfpqMirrorStatus mirrors[GPU_IVFPQ_STATUS_MIRRORS];
	int			ndevices;
	GpuIvfpqDeviceStatus devices[GPU_IVFPQ_STATUS_DEVICES];
	int64		memory_used;
	int64		memory_budget;
	int64		evictions;		/* over every GPU process */
	int64		evictions_base; /* the current GPU process's count, already added */

	pg_atomic_uint64 queries_gpu;
	pg_atomic_uint64 queries_cpu;
	pg_atomic_uint64 fallbacks;		/* scans that wanted the GPU and used the CPU */
	pg_atomic_uint64 batches;
	pg_atomic_uint64 batch_hist[GPU_IVFPQ_BATCH_BUCKETS];
	pg_atomic_uint64 log_applied;	/* the service has read the log up to here */
	pg_atomic_uint64 log_head_pub;	/* log_head, for readers that take no lock */
	pg_atomic_uint32 applied_seq;	/* bumped (a futex word) whenever log_applied advances */

	/*
	 * The direct path's segment (direct_path.cpp): its POSIX shared memory
	 * name, size and generation (0: none; under mutex). A backend maps it
	 * again when the generation changes.
	 */
	char		queue_name[64];
	Size		queue_bytes;
	uint64		queue_generation;
	/* The counters of the segments before it (a restarted service's), under mutex. */
	GpuIvfpqQueueStats queue_past;

	/*
	 * The gpu_ivfpq indexes (database, index) the GPU process may hold a
	 * mirror of, or is loading one of (under mutex; published by the
	 * service, PublishMirrored): a commit that appended to none of them
	 * need not wait for the change log (DropsAtXactEnd). mirrored_all:
	 * more than fit, every commit waits.
	 */
	int			nmirrored;
	bool		mirrored_all;
	GpuIvfpqIndexRef mirrored[GPU_IVFPQ_MIRRORED_MAX];

	/* Appends of logged entries to mirrors (within the log's time). */
	pg_atomic_uint64 append_calls;
	pg_atomic_uint64 time_append_ns;	/* append calls to the GPU process, round trip */
	pg_atomic_uint64 time_append_device_ns;	/* of which the GPU process worked */

	/* change log, a ring; head is the next sequence number (under log_lock) */
	LWLock	   *log_lock;
	uint64		log_head;
	GpuIvfpqLogEntry log[GPU_IVFPQ_LOG_SIZE];
	/*
	 * The appended entries' vectors and codes too long for an entry, a byte
	 * ring of its own (they vary in size; under log_lock): bytes [vec_pos,
	 * vec_pos + GpuIvfpqLogRingBytes) of an entry are intact while vec_head
	 * <= vec_pos + GPU_IVFPQ_VECTOR_RING_BYTES.
	 */
	uint64		vec_head;
	char	   *vec_ring;

	int			nslots;
	GpuIvfpqSlot slots[FLEXIBLE_ARRAY_MEMBER];
} GpuIvfpqServiceShared;

/* NULL unless gpu_ivfpq is in shared_preload_libraries. */
extern GpuIvfpqServiceShared *gpu_ivfpq_service;

/* DSM layout of REQ_LOAD / REQ_TRAIN / REQ_ENCODE: this header, then arrays. */
typedef struct GpuIvfpqDsmHeader
{
	int32		d;
	int32		lists;
	int32		m;
	int32		metric;
	int64		n;
	int32		iterations;
	int32		max_points_per_centroid;
	uint64		seed;
	int32		vectors;		/* LOAD: the entries' vectors follow (n x d floats) */
	int32		filter_keys;	/* LOAD: the entries' filter keys follow (n int64) */
	int32		placement;		/* LOAD: GPU_IVFPQ_PLACEMENT_* over the service's GPUs */
	int32		rabitq_bits;	/* LOAD, ENCODE: RaBitQ codes of these bits per dimension (0: PQ codes) */
} GpuIvfpqDsmHeader;

/*
 * Offsets of the arrays after the header, each MAXALIGNed:
 * LOAD:   centroids, codebooks (RaBitQ codes: the model blob, GpuIvfpqDsmModelBytes),
 *         list ids (n int32), codes (n x m), labels (n int64),
 *         vectors (n x d floats, when the header says so), filter keys (n int64, likewise)
 * TRAIN:  sample (n x d), centroids out, codebooks out
 * ENCODE: centroids, codebooks, rows (n x d), list ids out (n int32), codes out (n x m)
 */
typedef struct GpuIvfpqDsmLayout
{
	Size		centroids;
	Size		codebooks;
	Size		lists;
	Size		labels;
	Size		codes;
	Size		rows;
	Size		vectors;
	Size		keys;
	Size		total;
} GpuIvfpqDsmLayout;

extern GpuIvfpqDsmLayout GpuIvfpqDsmLayoutFor(RequestKind kind, const GpuIvfpqDsmHeader *h);
extern Size GpuIvfpqDsmModelBytes(const GpuIvfpqDsmHeader *h);

/*
 * REQ_SEARCH_BATCH segment: slot->n queries of slot->dim floats from
 * GPU_IVFPQ_BATCH_QUERIES, then slot->k labels per query at
 * GpuIvfpqBatchLabelsOffset (padded with -1), then, when the answer is
 * exact, their exact distances (double) at GpuIvfpqBatchExactOffset.
 */
#define GPU_IVFPQ_BATCH_QUERIES MAXALIGN(sizeof(GpuIvfpqDsmHeader))

/*
 * REQ_EXACT segment: the header (d, n = base rows, m = queries, metric), then
 * queries (m x d), base rows (n x d), distances (m x k floats) and labels
 * (m x k int64, base row numbers).
 */
typedef struct GpuIvfpqExactLayout
{
	Size		queries;
	Size		base;
	Size		dist;
	Size		labels;
	Size		total;
} GpuIvfpqExactLayout;

static inline GpuIvfpqExactLayout
GpuIvfpqExactLayoutFor(int64 nq, int64 n, int d, int k)
{
	GpuIvfpqExactLayout l;

	l.queries = MAXALIGN(sizeof(GpuIvfpqDsmHeader));
	l.base = l.queries + MAXALIGN((Size) nq * d * sizeof(float));
	l.dist = l.base + MAXALIGN((Size) n * d * sizeof(float));
	l.labels = l.dist + MAXALIGN((Size) nq * k * sizeof(float));
	l.total = l.labels + MAXALIGN((Size) nq * k * sizeof(int64));
	return l;
}
static inline Size
GpuIvfpqBatchLabelsOffset(int64 nq, int dim)
{
	return GPU_IVFPQ_BATCH_QUERIES + MAXALIGN((Size) nq * dim * sizeof(float));
}
static inline Size
GpuIvfpqBatchExactOffset(int64 nq, int dim, int k)
{
	return GpuIvfpqBatchLabelsOffset(nq, dim) + MAXALIGN((Size) nq * k * sizeof(int64));
}
static inline Size
GpuIvfpqBatchSegmentBytes(int64 nq, int dim, int k)
{
	return GpuIvfpqBatchExactOffset(nq, dim, k) + MAXALIGN((Size) nq * k * sizeof(double));
}

/*
 * REQ_METRIC_LOAD segment: this header, then (each MAXALIGNed) the words'
 * code points (ncps uint32), offsets (n + 1 uint64), removed flags (n
 * bytes), the structure (LC: centres then radii, 2 x clusters uint32; SSS:
 * pivot ids, clusters uint32) and each object's part of it (LC: its cluster,
 * n uint32; SSS: its table row, n x clusters bytes). Object i is the
 * index's object i; the mirror labels it i.
 */
typedef struct GpuMetricLoadHeader
{
	int32		method;			/* GPU_METRIC_METHOD_* */
	int32		bucket;			/* LC */
	int64		n;
	int64		ncps;
	int64		clusters;		/* LC clusters or SSS pivots */
	double		alpha;			/* SSS */
	uint32		max_distance;	/* SSS */
} GpuMetricLoadHeader;

typedef struct GpuMetricLoadLayout
{
	Size		cps;
	Size		offsets;
	Size		removed;
	Size		structure;
	Size		parts;
	Size		total;
} GpuMetricLoadLayout;

static inline GpuMetricLoadLayout
GpuMetricLoadLayoutFor(const GpuMetricLoadHeader *h)
{
	GpuMetricLoadLayout l;
	bool		lc = h->method == 1;	/* GPU_METRIC_METHOD_LC */

	l.cps = MAXALIGN(sizeof(GpuMetricLoadHeader));
	l.offsets = l.cps + MAXALIGN((Size) h->ncps * sizeof(uint32));
	l.removed = l.offsets + MAXALIGN((Size) (h->n + 1) * sizeof(uint64));
	l.structure = l.removed + MAXALIGN((Size) h->n);
	l.parts = l.structure + MAXALIGN((Size) h->clusters * (lc ? 2 : 1) * sizeof(uint32));
	l.total = l.parts + MAXALIGN(lc ? (Size) h->n * sizeof(uint32) : (Size) h->n * h->clusters);
	return l;
}

/*
 * REQ_METRIC_SEARCH request, in a DSM segment of slot->capacity bytes
 * (searches that fit a slot of the direct path go there instead:
 * direct_path.cpp): the layout of gpu_process/metric_request.h.
 */
typedef gpuivfpq::MetricSearchLayout GpuMetricSearchLayout;

static inline GpuMetricSearchLayout
GpuMetricSearchLayoutFor(int64 nq, int64 ncps, int nradii)
{
	return gpuivfpq::metric_search_layout((uint64) nq, (uint64) ncps, (uint64) nradii);
}

/* request.cpp: the request protocol, shared by the service's clients. */
extern void GpuIvfpqFillKey(GpuIvfpqKey *key, Relation index, const GpuIvfpqMetaPageData *meta);
extern const char *GpuIvfpqNotServableReason(const GpuIvfpqMetaPageData *meta);
extern void GpuIvfpqCountFallback(void);
extern dsm_segment *GpuIvfpqCreateSegment(Size bytes, const char *what);
extern bool GpuIvfpqServiceServing(void);
extern void GpuIvfpqSearchFellBack(Relation index, RequestResult result, const char *error, const char *am,
								   const char *noun, const char *what, bool required);
extern GpuIvfpqSlot *GpuIvfpqAcquireSlot(void);
extern int	GpuIvfpqMySlotIndex(void);
extern RequestResult GpuIvfpqSubmitAndWait(GpuIvfpqSlot *slot);
extern void GpuIvfpqFinishSlot(GpuIvfpqSlot *slot);

/*
 * A mirror load for GpuIvfpqLoadToldMirror: loads index's mirror with slot
 * (arg: the caller's, as it passed it), sets *count for the DEBUG1 line and
 * error on failure.
 */
typedef RequestResult (*GpuIvfpqMirrorLoader) (GpuIvfpqSlot *slot, Relation index, const void *arg,
											   int64 *count, char *error, Size errlen);
extern bool GpuIvfpqLoadToldMirror(GpuIvfpqSlot **slot, GpuIvfpqMirrorLoader load, const void *arg,
								   Relation index, const char *am, const char *unit, RequestResult *result,
								   char *error, Size errlen);
extern GpuIvfpqSlot *GpuIvfpqPrewarmSlot(Relation index, const char *reason, const char *hint);
extern void GpuIvfpqPrewarmLoaded(Relation index, RequestResult result, const char *error);

/*
 * change_log.cpp: pushing to the change log, also for the WAL replay of
 * the records that announce its entries (wal_announce.cpp). Each returns
 * the entry's position (GpuIvfpqLogPushRemove: the position after its
 * last); GpuIvfpqLogDropAll makes the service drop every mirror, as when
 * writers lap it.
 */
extern uint64 GpuIvfpqLogPush(const GpuIvfpqLogEntry *entry, const float *vector, const uint8 *code);
extern uint64 GpuIvfpqSearchLogPos(void);
extern void GpuIvfpqLogAppliedAdvanced(void);
extern uint64 GpuIvfpqLogPushRemove(const GpuIvfpqKey *key, const int64 *labels, int n);
extern void GpuIvfpqLogDropAll(void);

/*
 * Whether a mirror of the index can exist, so that its changes go to the
 * change log (and to WAL for standbys): trained, with RaBitQ codes (rows of
 * any size an index has) or PQ codes of at most GPU_IVFPQ_SERVICE_MAX_M
 * sub-quantizers.
 */
static inline bool
GpuIvfpqLogsChanges(const GpuIvfpqMetaPageData *meta)
{
	if (!meta->trained)
		return false;
	if (GpuIvfpqIsRabitq(meta))
		return meta->m <= GPU_IVFPQ_LOG_MAX_CODE;
	return meta->m <= GPU_IVFPQ_SERVICE_MAX_M;
}
extern void GpuIvfpqServiceWake(void);

/*
 * wal_announce.cpp: the same changes as WAL records for standbys, written
 * after the page's own record (nothing when gpu_ivfpq's resource manager
 * is not registered or the index is not WAL-logged).
 */
extern void GpuIvfpqWalAnnounceAppend(Relation index, const GpuIvfpqLogEntry *entry, const float *vector,
									  const uint8 *code);
extern void GpuIvfpqWalAnnounceRemove(Relation index, const GpuIvfpqKey *key, const int64 *labels, int n);
extern void GpuIvfpqWalAnnounceInvalidate(const GpuIvfpqKey *key, bool logged);

/*
 * direct_path.cpp: the segment where backends and the GPU process meet
 * (gpu_process/query_queue.h). The service creates it, hands it to each GPU
 * process, publishes the change-log position the mirrors include, and
 * answers what a dead GPU process leaves; backends queue scan rounds there.
 */
extern bool GpuIvfpqQueueCreate(char *error, Size errlen);
extern void GpuIvfpqQueueDestroy(const char *message);
extern int	GpuIvfpqQueueFd(void);
extern void GpuIvfpqQueueSetApplied(uint64 pos);
extern void GpuIvfpqQueueSettings(int batch_size, int batch_wait_us, int batches_in_flight, int poll_us);
extern void GpuIvfpqQueueFailAll(const char *message);
extern uint64 GpuIvfpqQueueStalledSinceNs(void);
extern uint64 GpuIvfpqQueueNowNs(void);
extern const char *GpuIvfpqQueueUnavailable(void);
extern void GpuIvfpqQueueGiveUpLoad(bool on_error);
extern void GpuIvfpqQueueLoading(bool loading);
extern void GpuIvfpqQueueExitGiveUp(void);
extern uint32 GpuIvfpqQueueLoadsGivenUp(int slot);
/* Bytes of a direct-path slot's payload (a gpu_metric request and its answer). */
#define GPU_IVFPQ_QUEUE_PAYLOAD (32 * 1024)
extern RequestResult GpuIvfpqQueueMetricSearch(const GpuIvfpqKey *key, uint64 change, int64 nq, int64 ncps,
											   int nradii, int k, char *buf, uint64 *needed, uint64 *live,
											   uint64 *evaluations, char *error, Size errlen);
extern RequestResult GpuIvfpqQueueSearch(const GpuIvfpqKey *key, int d, const float *query, int k, int nprobe,
										 const GpuIvfpqKeyRange *range, int64 *labels, double *exact,
										 int *nlabels, GpuIvfpqAnswerDists *dists, int *batch, int64 *matched,
										 char *error, Size errlen);
extern bool GpuIvfpqQueueReadStats(GpuIvfpqQueueStats *out);
