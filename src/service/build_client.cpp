// Work that ships whole arrays to the service's device through DSM segments:
// index builds (CREATE INDEX sends its training sample, then batches of rows;
// the service trains with the GPU k-means and encodes on the GPU) and exact
// brute-force search. Whenever the service cannot, the caller goes on with
// the CPU engine.
#include "common/guard.h"
#include "gpu_process/reply_checks.h"
#include "service/shmem.h"

extern "C" {
#include "miscadmin.h"
#include "utils/timestamp.h"
}

/* Rows per encode request: a DSM segment of about this many bytes of vectors. */
#define ENCODE_SEGMENT_BYTES	(32 * 1024 * 1024)

struct GpuIvfpqRemoteEncoder
{
	dsm_segment *seg;
	char	   *base;
	GpuIvfpqDsmHeader h;
	GpuIvfpqDsmLayout l;
};

/*
 * May the build use the service? With gpu_ivfpq.device = gpu it must, or
 * the build fails saying why.
 */
static bool
BuildCanUseService(int d, int m)
{
	const char *reason = NULL;

	if (!GpuIvfpqServiceWanted())
		return false;
	if (gpu_ivfpq_service == NULL)
		reason = "The extension gpu_ivfpq is not in shared_preload_libraries";
	else if (!GpuIvfpqServiceServing())
		reason = "The gpu_ivfpq service has no GPU or is not running";
	else if (m > GPU_IVFPQ_SERVICE_MAX_M)
		reason = psprintf("The GPU path handles up to m = %d sub-quantizers", GPU_IVFPQ_SERVICE_MAX_M);
	else if (d > GPU_IVFPQ_SERVICE_MAX_DIM)
		reason = psprintf("The GPU path handles up to %d dimensions", GPU_IVFPQ_SERVICE_MAX_DIM);
	if (reason != NULL && gpu_ivfpq_device == GPU_IVFPQ_DEVICE_GPU)
		GpuIvfpqGpuRequiredError("index build", reason);
	return reason == NULL;
}


/* Sends a segment request (k: for exact search) and waits; a failure is a WARNING. */
static bool
Submit(dsm_segment *seg, RequestKind kind, int64 n, int k, const char *what)
{
	GpuIvfpqSlot *slot = GpuIvfpqAcquireSlot();
	RequestResult result;

	if (slot == NULL)
	{
		/* This session's slot still serves a request it cancelled: the CPU, or the reason. */
		if (gpu_ivfpq_device == GPU_IVFPQ_DEVICE_GPU)
			GpuIvfpqGpuRequiredError(what, "No request slot is free");
		return false;
	}
	memset(&slot->key, 0, sizeof(slot->key));
	slot->kind = kind;
	slot->n = n;
	slot->k = k;
	slot->dsm = dsm_segment_handle(seg);
	result = GpuIvfpqSubmitAndWait(slot);
	if (result != RES_OK)
		ereport(WARNING,
				(errmsg("gpu_ivfpq: %s failed on the GPU, continuing on the CPU", what),
				 errdetail("%s", slot->error[0] ? slot->error : "the service exited")));
	GpuIvfpqFinishSlot(slot);
	return result == RES_OK;
}

/*
 * Trains the quantizers on the service's device; false when it could not
 * (the caller trains on the CPU).
 */
bool
GpuIvfpqServiceTrain(const float *sample, int64 n, int d, int lists, int m, int metric,
					 int iterations, int max_points_per_centroid, uint64 seed,
					 float *centroids, float *codebooks)
{
	GpuIvfpqDsmHeader h;
	GpuIvfpqDsmLayout l;
	dsm_segment *seg;
	char	   *base;
	bool		ok;
	TimestampTz started;
	TimestampTz copied;

	if (!BuildCanUseService(d, m))
		return false;
	memset(&h, 0, sizeof(h));
	h.d = d;
	h.lists = lists;
	h.m = m;
	h.metric = metric;
	h.n = n;
	h.iterations = iterations;
	h.max_points_per_centroid = max_points_per_centroid;
	h.seed = seed;
	l = GpuIvfpqDsmLayoutFor(REQ_TRAIN, &h);
	started = GetCurrentTimestamp();
	seg = GpuIvfpqCreateSegment(l.total, "training");
	if (seg == NULL)
		return false;
	base = (char *) dsm_segment_address(seg);
	memcpy(base, &h, sizeof(h));
	memcpy(base + l.rows, sample, sizeof(float) * n * d);
	copied = GetCurrentTimestamp();
	ok = Submit(seg, REQ_TRAIN, n, 0, "training");
	elog(DEBUG1, "gpu_ivfpq build: training request: %.3f s to place the sample, %.3f s in the service",
		 (double) (copied - started) / 1000000.0, (double) (GetCurrentTimestamp() - copied) / 1000000.0);
	if (ok)
	{
		memcpy(centroids, base + l.centroids, sizeof(float) * lists * d);
		memcpy(codebooks, base + l.codebooks, sizeof(float) * 256 * d);
	}
	dsm_detach(seg);
	return ok;
}

/*
 * Starts GPU encoding with a trained model (model: the PQ codebooks, or
 * with rabitq_bits the RaBitQ codes' model blob; m: the code's bytes, or a
 * RaBitQ row's); NULL when the service cannot.
 */
GpuIvfpqRemoteEncoder *
GpuIvfpqServiceEncoderBegin(const float *centroids, const void *model, int d, int lists,
							int m, int metric, int rabitq_bits, int *capacity)
{
	GpuIvfpqRemoteEncoder *enc;
	dsm_segment *seg;

	/* RaBitQ rows of any width the codes allow (the bound on m is PQ's). */
	if (!BuildCanUseService(d, rabitq_bits != 0 ? 0 : m))
		return NULL;
	enc = (GpuIvfpqRemoteEncoder *) palloc0(sizeof(GpuIvfpqRemoteEncoder));
	enc->h.d = d;
	enc->h.lists = lists;
	enc->h.m = m;
	enc->h.metric = metric;
	enc->h.rabitq_bits = rabitq_bits;
	/* RaBitQ rows come back in the segment too: a row's bytes count. */
	enc->h.n = Max(1024, ENCODE_SEGMENT_BYTES / ((int64) d * sizeof(float) + (rabitq_bits != 0 ? m : 0)));
	enc->l = GpuIvfpqDsmLayoutFor(REQ_ENCODE, &enc->h);
	seg = GpuIvfpqCreateSegment(enc->l.total, "encoding");
	if (seg == NULL)
	{
		pfree(enc);
		return NULL;
	}
	enc->seg = seg;
	enc->base = (char *) dsm_segment_address(seg);
	memcpy(enc->base, &enc->h, sizeof(enc->h));
	memcpy(enc->base + enc->l.centroids, centroids, sizeof(float) * lists * d);
	memcpy(enc->base + enc->l.codebooks, model, GpuIvfpqDsmModelBytes(&enc->h));
	*capacity = (int) enc->h.n;
	return enc;
}

/* Where the caller puts the rows of the next batch (capacity x d floats). */
float *
GpuIvfpqServiceEncoderRows(GpuIvfpqRemoteEncoder *enc)
{
	return (float *) (enc->base + enc->l.rows);
}

/*
 * Encodes the first n rows: their lists and codes (RaBitQ codes: rows of m
 * bytes, bit planes then factors); false when the GPU failed (encode them
 * on the CPU).
 */
bool
GpuIvfpqServiceEncode(GpuIvfpqRemoteEncoder *enc, int n, int32 *lists, uint8 *codes)
{
	const char *bad = NULL;

	if (!Submit(enc->seg, REQ_ENCODE, n, 0, "encoding"))
		return false;
	memcpy(lists, enc->base + enc->l.lists, sizeof(int32) * n);
	memcpy(codes, enc->base + enc->l.codes, (Size) n * enc->h.m);
	/* The build indexes its lists by them. */
	if (!gpuivfpq::replycheck::all_within<int32_t>(lists, (size_t) n, 0, enc->h.lists))
		bad = "The GPU service assigned rows to lists the model does not have.";
	else if (enc->h.rabitq_bits != 0 &&
			 ((size_t) enc->h.m != gpuivfpq::rabitq_row_bytes(enc->h.d, enc->h.rabitq_bits) ||
			  !gpuivfpq::replycheck::rabitq_rows_sound(codes, (size_t) n, enc->h.d, enc->h.rabitq_bits,
													   enc->h.metric == (int) gpuivfpq::Metric::InnerProduct)))
		bad = "The GPU service answered RaBitQ rows that no encoding writes.";
	if (bad != NULL)
	{
		ereport(WARNING,
				(errmsg("gpu_ivfpq: encoding failed on the GPU, continuing on the CPU"),
				 errdetail("%s", bad)));
		return false;
	}
	return true;
}

void
GpuIvfpqServiceEncoderEnd(GpuIvfpqRemoteEncoder *enc)
{
	if (enc == NULL)
		return;
	dsm_detach(enc->seg);
	pfree(enc);
}

/*
 * Exact k-NN of nq queries among n base rows on the service's device (one
 * request); false when it cannot (the caller computes it on the CPU). With
 * gpu_ivfpq.device = gpu, "cannot" is an error.
 */
bool
GpuIvfpqServiceExact(const float *queries, int64 nq, const float *base, int64 n, int d, int metric,
					 int k, float *dist, int64 *labels)
{
	GpuIvfpqDsmHeader h;
	GpuIvfpqExactLayout l;
	dsm_segment *seg;
	char	   *addr;
	bool		ok;

	if (!GpuIvfpqServiceWanted())
		return false;
	if (!GpuIvfpqServiceServing() || k > GPU_IVFPQ_SERVICE_MAX_K)
	{
		if (gpu_ivfpq_device == GPU_IVFPQ_DEVICE_GPU)
			GpuIvfpqGpuRequiredError("exact search", !GpuIvfpqServiceServing()
									 ? "The gpu_ivfpq service has no GPU, is not running or is not preloaded"
									 : psprintf("The GPU selects at most %d neighbours per query",
												GPU_IVFPQ_SERVICE_MAX_K));
		return false;
	}
	memset(&h, 0, sizeof(h));
	h.d = d;
	h.n = n;
	h.m = (int32) nq;
	h.metric = metric;
	l = GpuIvfpqExactLayoutFor(nq, n, d, k);
	seg = GpuIvfpqCreateSegment(l.total, "exact search");
	if (seg == NULL)
		return false;
	addr = (char *) dsm_segment_address(seg);
	memcpy(addr, &h, sizeof(h));
	memcpy(addr + l.queries, queries, sizeof(float) * nq * d);
	memcpy(addr + l.base, base, sizeof(float) * n * d);
	ok = Submit(seg, REQ_EXACT, n, k, "exact search");
	if (ok)
	{
		memcpy(dist, addr + l.dist, sizeof(float) * nq * k);
		memcpy(labels, addr + l.labels, sizeof(int64) * nq * k);
		/* The caller indexes the base rows by them (-1: none). */
		ok = gpuivfpq::replycheck::all_within<int64_t>(labels, (size_t) nq * k, -1, n);
		if (!ok)
			ereport(WARNING,
					(errmsg("gpu_ivfpq: exact search failed on the GPU, continuing on the CPU"),
					 errdetail("The GPU service answered rows that are not among the rows sent.")));
	}
	dsm_detach(seg);
	return ok;
}
