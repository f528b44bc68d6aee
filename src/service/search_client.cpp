// The backends' searches on the GPU service: one scan round, a batch of
// queries, and loading an index's mirror from its pages (also
// gpu_ivfpq_prewarm). Every path returns "not served" so the caller can run
// the CPU engine, unless gpu_ivfpq.device = gpu asks for an error.
#include "gpu_process/reply_checks.h"
#include "service/shmem.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "commands/defrem.h"
#include "miscadmin.h"

PG_FUNCTION_INFO_V1(gpu_ivfpq_prewarm);
}

/* The labels the service answers become heap TIDs (GpuIvfpqLabelToTid): checked as such first. */
StaticAssertDecl(InvalidBlockNumber == 0xFFFFFFFF && FirstOffsetNumber == 1,
				 "replycheck::tid_label knows the TIDs that labels encode");
#define GPU_IVFPQ_NOT_TIDS "the GPU service answered labels that are no heap TIDs"

/* The placement a mirror loaded now gets: the session's setting, else the index's option. */
static int
GpuIvfpqPlacementOf(Relation index)
{
	if (gpu_ivfpq_placement != GPU_IVFPQ_PLACEMENT_AUTO)
		return gpu_ivfpq_placement;
	if (index->rd_options != NULL)
		return ((GpuIvfpqOptions *) index->rd_options)->placement;
	return GPU_IVFPQ_PLACEMENT_AUTO;
}

/*
 * Reads every entry of the index from its pages (with its vector, in an
 * index that keeps them) into a DSM segment and asks the service to mirror
 * them. Changes logged after log_start are applied by the service, so
 * inserts running meanwhile are not lost.
 */
static RequestResult
LoadMirror(GpuIvfpqSlot *slot, Relation index, const GpuIvfpqMetaPageData *meta,
		   int64 *entries, char *error, Size errlen)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	GpuIvfpqListDirEntry *dir;
	GpuIvfpqEntryLayout el = GpuIvfpqLayoutOf(meta);
	int			m = meta->m;
	int			vdim = el.vdim;
	int64		budget;
	double		rows = GpuIvfpqRowsEstimate(index, meta);
	int64		n = 0;
	int64		cap = 1024;
	int32	   *lists = (int32 *) palloc(sizeof(int32) * cap);
	int64	   *labels = (int64 *) palloc(sizeof(int64) * cap);
	uint8	   *codes = (uint8 *) palloc((Size) cap * m);
	int64	   *keys = el.keyed ? (int64 *) palloc(sizeof(int64) * cap) : NULL;
	float	   *vectors;
	uint64		log_start;
	float	   *centroids;
	float	   *codebooks;
	GpuIvfpqDsmHeader h;
	GpuIvfpqDsmLayout l;
	dsm_segment *seg;
	char	   *base;
	RequestResult result;

	LWLockAcquire(s->log_lock, LW_SHARED);
	log_start = s->log_head;
	LWLockRelease(s->log_lock);

	/*
	 * Vectors that cannot fit the GPU memory budget are not even read: the
	 * service would keep the codes only (MirrorStore::load), after this
	 * backend, the segment and the GPU process had held them all.
	 */
	SpinLockAcquire(&s->mutex);
	budget = s->memory_budget;
	SpinLockRelease(&s->mutex);
	if (vdim > 0 && budget > 0 && rows * vdim * sizeof(float) > (double) budget)
		vdim = 0;

	/*
	 * The directory after log_start: a list that gets its first page later
	 * than this read has that entry logged after log_start, so the service
	 * applies it; read before, such a list would look empty and its entry,
	 * logged earlier, would be missed.
	 */
	dir = GpuIvfpqReadListDir(index, meta);
	vectors = vdim > 0 ? (float *) palloc(sizeof(float) * vdim * cap) : NULL;

	for (uint32 list = 0; list < meta->lists; list++)
		GpuIvfpqWalkList(index, dir[list].head, &el, [&](const char *ent, int cnt, BlockNumber) {
			if (n + cnt > cap)
			{
				cap = Max(cap * 2, n + cnt);
				lists = (int32 *) repalloc_huge(lists, sizeof(int32) * cap);
				labels = (int64 *) repalloc_huge(labels, sizeof(int64) * cap);
				codes = (uint8 *) repalloc_huge(codes, (Size) cap * m);
				if (keys != NULL)
					keys = (int64 *) repalloc_huge(keys, sizeof(int64) * cap);
				if (vectors != NULL)
					vectors = (float *) repalloc_huge(vectors, sizeof(float) * vdim * cap);
			}
			for (int i = 0; i < cnt; i++)
			{
				lists[n] = (int32) list;
				labels[n] = GpuIvfpqEntryLabel(ent, i, &el);
				memcpy(codes + (Size) n * m, GpuIvfpqEntryCode(ent, i, &el), m);
				if (keys != NULL)
					keys[n] = GpuIvfpqEntryFilterKey(ent, i, &el);
				if (vectors != NULL)
					memcpy(vectors + (Size) n * vdim, GpuIvfpqEntryVector(ent, i, &el),
						   sizeof(float) * vdim);
				n++;
			}
		});

	memset(&h, 0, sizeof(h));
	h.d = meta->dimensions;
	h.lists = meta->lists;
	h.m = m;
	h.metric = meta->metric;
	h.n = n;
	h.vectors = vectors != NULL;
	h.filter_keys = keys != NULL;
	h.placement = GpuIvfpqPlacementOf(index);
	h.rabitq_bits = GpuIvfpqIsRabitq(meta) ? (int32) meta->nbits : 0;
	l = GpuIvfpqDsmLayoutFor(REQ_LOAD, &h);
	seg = GpuIvfpqCreateSegment(l.total, "loading the mirror");
	if (seg == NULL)
	{
		pfree(lists);
		pfree(labels);
		pfree(codes);
		if (vectors != NULL)
			pfree(vectors);
		if (keys != NULL)
			pfree(keys);
		strlcpy(error, "no shared memory for the mirror's entries", errlen);
		*entries = n;
		return RES_ERROR;
	}
	base = (char *) dsm_segment_address(seg);
	memcpy(base, &h, sizeof(h));
	/*
	 * The quantizers straight from the pages: no CPU model (and its tables)
	 * is built. RaBitQ codes' blob (the rotation, then P c) is the model
	 * the mirror takes as it is.
	 */
	GpuIvfpqReadQuantizers(index, meta, CurrentMemoryContext, &centroids, &codebooks);
	Assert(GpuIvfpqDsmModelBytes(&h) == GpuIvfpqCodebookBytes(meta));
	memcpy(base + l.centroids, centroids, GpuIvfpqCentroidBytes(meta));
	memcpy(base + l.codebooks, codebooks, GpuIvfpqCodebookBytes(meta));
	pfree(centroids);
	pfree(codebooks);
	memcpy(base + l.lists, lists, sizeof(int32) * n);
	memcpy(base + l.labels, labels, sizeof(int64) * n);
	memcpy(base + l.codes, codes, (Size) n * m);
	if (vectors != NULL)
	{
		memcpy(base + l.vectors, vectors, sizeof(float) * vdim * n);
		pfree(vectors);
	}
	if (keys != NULL)
	{
		memcpy(base + l.keys, keys, sizeof(int64) * n);
		pfree(keys);
	}
	pfree(lists);
	pfree(labels);
	pfree(codes);

	slot->kind = REQ_LOAD;
	GpuIvfpqFillKey(&slot->key, index, meta);
	slot->n = n;
	slot->log_start = log_start;
	slot->dsm = dsm_segment_handle(seg);
	result = GpuIvfpqSubmitAndWait(slot);
	strlcpy(error, slot->error, errlen);
	GpuIvfpqFinishSlot(slot);
	dsm_detach(seg);
	*entries = n;
	return result;
}

/* LoadMirror as GpuIvfpqLoadToldMirror calls it: arg is the index's meta. */
static RequestResult
LoadToldMirror(GpuIvfpqSlot *slot, Relation index, const void *arg, int64 *entries, char *error, Size errlen)
{
	return LoadMirror(slot, index, (const GpuIvfpqMetaPageData *) arg, entries, error, errlen);
}

/* ---- search ---- */

/*
 * One round of a scan on the GPU: the k best labels by ADC distance over
 * nprobe lists, as the CPU engine would rank them; when the mirror keeps
 * the vectors (*dists EXACT), re-ranked on the GPU: exact[i] is the exact
 * distance of labels[i], in exact order; with RaBitQ codes (*dists LOWER),
 * exact[i] is the lower bound the labels are ranked by. With range, only entries whose
 * filter key lies in it are ranked, and *matched says how many the probed
 * lists hold. Returns how many labels came back, or
 * -1 when the GPU did not serve the round (the caller then runs it on the
 * CPU; with gpu_ivfpq.device = gpu that is an error instead).
 */
int
GpuIvfpqServiceSearch(Relation index, const GpuIvfpqMetaPageData *meta, const float *query,
					  int k, int nprobe, const GpuIvfpqKeyRange *range, int64 *matched,
					  int64 *labels, double *exact, GpuIvfpqAnswerDists *dists, int *batch)
{
	bool		required = gpu_ivfpq_device == GPU_IVFPQ_DEVICE_GPU;
	const char *reason = GpuIvfpqNotServableReason(meta);
	GpuIvfpqKey key;
	char		error[256];
	RequestResult result = RES_ERROR;

	if (reason == NULL && k > GPU_IVFPQ_SERVICE_MAX_K)
		reason = psprintf("The GPU selects at most %d candidates per round", GPU_IVFPQ_SERVICE_MAX_K);
	if (reason == NULL && nprobe > GPU_IVFPQ_SERVICE_MAX_K)
		reason = psprintf("The GPU probes at most %d lists per round", GPU_IVFPQ_SERVICE_MAX_K);
	if (reason == NULL)
		reason = GpuIvfpqQueueUnavailable();
	if (reason != NULL)
	{
		if (required)
			GpuIvfpqGpuRequiredError("scan", reason);
		return -1;
	}
	GpuIvfpqFillKey(&key, index, meta);

	/* The round goes straight to the GPU process (direct_path.cpp); a load goes through the service. */
	for (int attempt = 0; attempt < 2; attempt++)
	{
		int			n = 0;
		int64		m = 0;

		result = GpuIvfpqQueueSearch(&key, meta->dimensions, query, k, nprobe, range, labels, exact,
									 &n, dists, batch, &m, error, sizeof(error));
		if (result == RES_OK)
		{
			if (range != NULL)
				*matched = m;
			return n;
		}
		if (attempt == 0 && (result == RES_NOT_LOADED || (result == RES_LOADING && required)))
		{
			GpuIvfpqSlot *slot = NULL;

			if (!GpuIvfpqLoadToldMirror(&slot, LoadToldMirror, meta, index, "gpu_ivfpq", "entries",
										&result, error, sizeof(error)))
			{
				if (required)
					GpuIvfpqGpuRequiredError("scan", "No request slot is free");
				return -1;
			}
			if (result == RES_OK)
				continue;
		}
		break;
	}
	GpuIvfpqSearchFellBack(index, result, error, "gpu_ivfpq", "scan", "scan", required);
	return -1;
}

/*
 * Candidates for nq queries (the k best labels of each by ADC distance over
 * nprobe lists) in one GPU request; labels is nq x k, padded with -1. When
 * the mirror keeps the vectors (*dists EXACT), each row comes re-ranked,
 * with exact distances in exact (nq x k); with RaBitQ codes (*dists LOWER)
 * exact holds the lower bounds the rows are ranked by. Returns false when the GPU cannot
 * serve it (the caller uses the CPU; with gpu_ivfpq.device = gpu that is an
 * error instead). With keep, the request's segment is kept in *keep for the
 * caller's next request (one as large or smaller reuses it: a search in
 * chunks maps and faults in one segment, not one per chunk); the caller
 * detaches it when done.
 */
bool
GpuIvfpqServiceSearchBatch(Relation index, const GpuIvfpqMetaPageData *meta, const float *queries,
						   int64 nq, int k, int nprobe, bool brute, int64 *labels, double *exact,
						   GpuIvfpqAnswerDists *dists, dsm_segment **keep)
{
	/* Brute force has the table path behind it: it never errors for being off the GPU. */
	bool		required = gpu_ivfpq_device == GPU_IVFPQ_DEVICE_GPU && !brute;
	const char *reason = GpuIvfpqNotServableReason(meta);
	GpuIvfpqSlot *slot = NULL;
	dsm_segment *seg;
	char	   *base;
	Size		loff;
	Size		bytes;
	char		error[256];
	RequestResult result = RES_ERROR;

	if (!GpuIvfpqServiceWanted())
		return false;
	if (reason == NULL && k > GPU_IVFPQ_SERVICE_MAX_K)
		reason = psprintf("The GPU selects at most %d candidates per query", GPU_IVFPQ_SERVICE_MAX_K);
	if (reason == NULL && (slot = GpuIvfpqAcquireSlot()) == NULL)
		reason = "No request slot is free";
	if (reason != NULL)
	{
		if (required)
			GpuIvfpqGpuRequiredError("batch search", reason);
		return false;
	}
	loff = GpuIvfpqBatchLabelsOffset(nq, meta->dimensions);
	bytes = GpuIvfpqBatchSegmentBytes(nq, meta->dimensions, k);
	if (keep != NULL && *keep != NULL && dsm_segment_map_length(*keep) >= bytes)
		seg = *keep;
	else
	{
		if (keep != NULL && *keep != NULL)
		{
			dsm_detach(*keep);
			*keep = NULL;
		}
		seg = GpuIvfpqCreateSegment(bytes, "batch search");
		if (keep != NULL)
			*keep = seg;
	}
	if (seg == NULL)
	{
		GpuIvfpqCountFallback();
		if (required)
			GpuIvfpqGpuRequiredError("batch search", "No shared memory for the request");
		return false;
	}
	base = (char *) dsm_segment_address(seg);
	memcpy(base + GPU_IVFPQ_BATCH_QUERIES, queries, (Size) nq * meta->dimensions * sizeof(float));
	for (int attempt = 0; attempt < 2; attempt++)
	{
		slot->kind = REQ_SEARCH_BATCH;
		GpuIvfpqFillKey(&slot->key, index, meta);
		slot->dim = meta->dimensions;
		slot->k = k;
		slot->nprobe = nprobe;
		slot->filtered = false;
		slot->brute = brute;
		slot->n = nq;
		slot->dsm = dsm_segment_handle(seg);
		result = GpuIvfpqSubmitAndWait(slot);
		strlcpy(error, slot->error, sizeof(error));
		*dists = (GpuIvfpqAnswerDists) slot->dists;
		GpuIvfpqFinishSlot(slot);
		if (result != RES_NOT_LOADED || attempt > 0)
			break;
		{
			int64		entries;

			result = LoadMirror(slot, index, meta, &entries, error, sizeof(error));
			if (result != RES_OK)
				break;
		}
	}
	if (result == RES_OK)
	{
		memcpy(labels, base + loff, (Size) nq * k * sizeof(int64));
		if (*dists > GPU_IVFPQ_DISTS_LOWER)
		{
			result = RES_ERROR;
			strlcpy(error, "the GPU service answered distances of an unknown kind", sizeof(error));
		}
		else if (*dists != GPU_IVFPQ_DISTS_NONE)
			memcpy(exact, base + GpuIvfpqBatchExactOffset(nq, meta->dimensions, k),
				   (Size) nq * k * sizeof(double));
		if (!gpuivfpq::replycheck::tid_labels_sound(labels, (size_t) nq * k))
		{
			result = RES_ERROR;
			strlcpy(error, GPU_IVFPQ_NOT_TIDS, sizeof(error));
		}
	}
	if (keep == NULL)
		dsm_detach(seg);
	if (result == RES_OK)
		return true;
	GpuIvfpqCountFallback();
	if (required)
		GpuIvfpqGpuRequiredError("batch search", error[0] ? error : "The GPU service failed");
	if (brute)
		ereport(DEBUG1,
				(errmsg("gpu_ivfpq: exact search reads the table instead of the GPU mirror of \"%s\"",
						RelationGetRelationName(index)),
				 errdetail("%s", error[0] ? error : "The GPU service failed.")));
	else
		ereport(result == RES_SERVICE_GONE || result == RES_LOADING ? DEBUG1 : WARNING,
				(errmsg("gpu_ivfpq: batch search on \"%s\" ran on the CPU", RelationGetRelationName(index)),
				 errdetail("%s", error[0] ? error : "The GPU service failed.")));
	return false;
}

/* gpu_ivfpq_prewarm(index regclass): mirrors an index now; returns its entries. */
Datum
gpu_ivfpq_prewarm(PG_FUNCTION_ARGS)
{
	Relation	index;
	Relation	heap;
	GpuIvfpqMetaPageData meta;
	GpuIvfpqSlot *slot;
	int64		entries = 0;
	char		error[256];
	RequestResult result;

	/* As pg_prewarm: reading a relation into memory takes SELECT on it (here its table). */
	GpuIvfpqOpenIndexChecked(PG_GETARG_OID(0), "gpu_ivfpq", "gpu_ivfpq_prewarm", false, &index, &heap);
	table_close(heap, AccessShareLock);
	GpuIvfpqReadMeta(index, &meta);
	slot = GpuIvfpqPrewarmSlot(index, GpuIvfpqNotServableReason(&meta),
							   !meta.trained ? "REINDEX the index once its table holds rows: that trains its quantizers." : NULL);
	result = LoadMirror(slot, index, &meta, &entries, error, sizeof(error));
	GpuIvfpqPrewarmLoaded(index, result, error);
	relation_close(index, AccessShareLock);
	PG_RETURN_INT64(entries);
}
