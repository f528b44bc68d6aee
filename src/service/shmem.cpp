// The GPU service's shared state: reserved when gpu_ivfpq is in
// shared_preload_libraries, with the background worker (worker.cpp)
// registered beside it; and the layout of the requests' DSM segments.
#include "gpu_process/gpu_process_protocol.h"
#include "service/shmem.h"

extern "C" {
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
}

GpuIvfpqServiceShared *gpu_ivfpq_service = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* One slot per process that can run a query (MaxBackends covers them all). */
static Size
ServiceShmemSize(void)
{
	return add_size(offsetof(GpuIvfpqServiceShared, slots),
					mul_size(MaxBackends, sizeof(GpuIvfpqSlot)));
}

static void
ServiceShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(ServiceShmemSize()));
	RequestAddinShmemSpace(MAXALIGN(GPU_IVFPQ_VECTOR_RING_BYTES));
	RequestNamedLWLockTranche("gpu_ivfpq", 1);
}

static void
ServiceShmemStartup(void)
{
	bool		found;
	GpuIvfpqServiceShared *s;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	s = (GpuIvfpqServiceShared *) ShmemInitStruct("gpu_ivfpq service", ServiceShmemSize(), &found);
	if (!found)
	{
		memset(s, 0, ServiceShmemSize());
		SpinLockInit(&s->mutex);
		s->state = SERVICE_STOPPED;
		pg_atomic_init_u64(&s->queries_gpu, 0);
		pg_atomic_init_u64(&s->queries_cpu, 0);
		pg_atomic_init_u64(&s->fallbacks, 0);
		pg_atomic_init_u64(&s->batches, 0);
		for (int i = 0; i < GPU_IVFPQ_BATCH_BUCKETS; i++)
			pg_atomic_init_u64(&s->batch_hist[i], 0);
		pg_atomic_init_u64(&s->log_applied, 0);
		pg_atomic_init_u64(&s->log_head_pub, 0);
		pg_atomic_init_u32(&s->applied_seq, 0);
		pg_atomic_init_u64(&s->append_calls, 0);
		pg_atomic_init_u64(&s->time_append_ns, 0);
		pg_atomic_init_u64(&s->time_append_device_ns, 0);
		s->log_lock = &(GetNamedLWLockTranche("gpu_ivfpq"))->lock;
		s->nslots = MaxBackends;
		for (int i = 0; i < s->nslots; i++)
			SpinLockInit(&s->slots[i].mutex);
	}
	s->vec_ring = (char *) ShmemInitStruct("gpu_ivfpq vector ring", GPU_IVFPQ_VECTOR_RING_BYTES, &found);
	gpu_ivfpq_service = s;
	LWLockRelease(AddinShmemInitLock);
}

/*
 * Called from _PG_init while shared_preload_libraries is processed: sets up
 * shared memory and registers the service. CUDA is never touched here (this
 * runs in the postmaster, before fork).
 */
void
GpuIvfpqServiceRegister(void)
{
	BackgroundWorker worker;

	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = ServiceShmemRequest;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = ServiceShmemStartup;

	memset(&worker, 0, sizeof(worker));
	/*
	 * A connection to no database (shared catalogs only, like the logical
	 * replication launcher): the service then shows in pg_stat_activity with
	 * its own backend_type, and one service serves every database.
	 */
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	/* Standbys answer k-NN queries too, so start once reads are possible. */
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "gpu_ivfpq");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "gpu_ivfpq_service_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "gpu_ivfpq service");
	snprintf(worker.bgw_type, BGW_MAXLEN, "gpu_ivfpq service");
	RegisterBackgroundWorker(&worker);
}

/*
 * Bytes of a request's codebooks: PQ codebooks, or the model blob of RaBitQ
 * codes (the GPU process's model_bytes, which it checks the region against).
 */
Size
GpuIvfpqDsmModelBytes(const GpuIvfpqDsmHeader *h)
{
	return (Size) gpuivfpq::gpuproc::model_bytes((uint64) h->d, (uint64) h->lists, (uint64) h->rabitq_bits);
}

/* Array offsets of a request's DSM segment (service_shmem.h). */
GpuIvfpqDsmLayout
GpuIvfpqDsmLayoutFor(RequestKind kind, const GpuIvfpqDsmHeader *h)
{
	GpuIvfpqDsmLayout l;
	Size		n = (Size) h->n;
	Size		model_c = (Size) h->lists * h->d * sizeof(float);
	Size		model_b = GpuIvfpqDsmModelBytes(h);
	Size		off = MAXALIGN(sizeof(GpuIvfpqDsmHeader));

	memset(&l, 0, sizeof(l));
	if (kind == REQ_TRAIN)
	{
		l.rows = off;
		off += MAXALIGN(n * h->d * sizeof(float));
	}
	l.centroids = off;
	off += MAXALIGN(model_c);
	l.codebooks = off;
	off += MAXALIGN(model_b);
	if (kind == REQ_ENCODE)
	{
		l.rows = off;
		off += MAXALIGN(n * h->d * sizeof(float));
	}
	if (kind == REQ_LOAD || kind == REQ_ENCODE)
	{
		l.lists = off;
		off += MAXALIGN(n * sizeof(int32));
		l.codes = off;
		/* RaBitQ codes: m is a row's bytes (its planes, then its factors). */
		off += MAXALIGN(n * h->m);
	}
	if (kind == REQ_LOAD)
	{
		l.labels = off;
		off += MAXALIGN(n * sizeof(int64));
		if (h->vectors)
		{
			l.vectors = off;
			off += MAXALIGN(n * h->d * sizeof(float));
		}
		if (h->filter_keys)
		{
			l.keys = off;
			off += MAXALIGN(n * sizeof(int64));
		}
	}
	l.total = off;
	return l;
}

