// Batch search over a gpu_ivfpq index: candidates for many queries from the
// GPU service (one request per chunk) or the CPU engine, re-ranked with
// exact distances on the GPU or from the index's vector copies (then the
// backend only checks which rows are visible), or from the visible heap
// rows in an index without vector copies. Used by gpu_ivfpq_knn_batch and
// gpu_ivfpq_knn_graph.
#pragma once

#include "common/rerank.h"
#include "functions/queries.h"

/* Called for each result: query number (from 0 in the call), rank (from 0), row, distance. */
typedef void (*GpuIvfpqBatchEmit) (void *arg, int64 query, int rank, ItemPointer tid, double dist);

typedef struct GpuIvfpqBatchSearch
{
	Relation	index;
	Relation	heap;
	GpuIvfpqMetaPageData meta;
	GpuIvfpqListDirEntry *dir;
	gpuivfpq::IvfPqModel *model;	/* owned by the backend's model cache */
	gpuivfpq::IvfPqQuery *prepared; /* owned by the caller's memory context */
	gpuivfpq::TopK *topk;		/* CPU k-selection, idem */
	GpuIvfpqHeapFetch hf;
	const GpuIvfpqVisibleRows *visible; /* if set: rows known visible to hf's snapshot */
	int			metric;
	int			dim;
	int			k;				/* results per query */
	int			want;			/* candidates per query */
	int			probes;
	int64		chunk;			/* queries per GPU request */
	dsm_segment *segment;		/* the GPU requests' segment, kept between chunks */
	int64	   *labels;			/* chunk x want */
	double	   *exact;			/* chunk x want: exact distances of re-ranked candidates */
	bool		vectors;		/* the index keeps vector copies */
	int		   *counts;
	GpuIvfpqHit *hits;
	int64		hits_cap;
	GpuIvfpqLabels all;			/* every entry, sorted, once all_read */
	bool		all_read;		/* for an untrained index, or a query too long to rank */
	int64		gpu_queries;
	int64		cpu_queries;
	int64		fetched;		/* candidates fetched from the heap by bound (RaBitQ codes) */
	int64		widened;		/* wider searches of queries left short of k visible rows */
	GpuIvfpqHit *par_hits;		/* chunk x k: the parallel re-rank's results (once used) */
	int64	   *par_counts;		/* chunk: their number per query */
	double		search_secs;	/* in the GPU requests or the CPU engine's list scans */
	double		finish_secs;	/* visibility checks, re-ranks from the heap, the caller's rows */
} GpuIvfpqBatchSearch;

extern void GpuIvfpqBatchBegin(GpuIvfpqBatchSearch *bs, Relation index, Relation heap, int dim,
							   int k, int want);
extern void GpuIvfpqBatchRun(GpuIvfpqBatchSearch *bs, const float *queries, int64 nq,
							 GpuIvfpqBatchEmit emit, void *arg);
extern void GpuIvfpqBatchEnd(GpuIvfpqBatchSearch *bs);

/* Most neighbours per query of the batch functions (knn_batch, knn_graph). */
#define GPU_IVFPQ_BATCH_MAX_K 1000
extern void GpuIvfpqCheckBatchK(int k);
