// The GPU service's shared state: reserved when gpu_ivfpq is in
// shared_preload_libraries, with the background worker (service_worker.cpp)
// registered beside it; and the status functions behind gpu_ivfpq_status
// and gpu_ivfpq_mirrors.
#include "service/shmem.h"

extern "C" {
#include "funcapi.h"
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/shmem.h"
#include "utils/array.h"
#include "utils/builtins.h"

PG_FUNCTION_INFO_V1(gpu_ivfpq_status);
PG_FUNCTION_INFO_V1(gpu_ivfpq_mirrors);
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
		s->log_lock = &(GetNamedLWLockTranche("gpu_ivfpq"))->lock;
		s->nslots = MaxBackends;
		for (int i = 0; i < s->nslots; i++)
			SpinLockInit(&s->slots[i].mutex);
	}
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
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS;
	/* Standbys answer k-NN queries too, so start once reads are possible. */
	worker.bgw_start_time = BgWorkerStart_ConsistentState;
	worker.bgw_restart_time = 5;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "gpu_ivfpq");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "gpu_ivfpq_service_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "gpu_ivfpq service");
	snprintf(worker.bgw_type, BGW_MAXLEN, "gpu_ivfpq service");
	RegisterBackgroundWorker(&worker);
}

/* Array offsets of a request's DSM segment (service_shmem.h). */
GpuIvfpqDsmLayout
GpuIvfpqDsmLayoutFor(RequestKind kind, const GpuIvfpqDsmHeader *h)
{
	GpuIvfpqDsmLayout l;
	Size		n = (Size) h->n;
	Size		model_c = (Size) h->lists * h->d * sizeof(float);
	Size		model_b = (Size) 256 * h->d * sizeof(float);
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
		off += MAXALIGN(n * h->m);
	}
	if (kind == REQ_LOAD)
	{
		l.labels = off;
		off += MAXALIGN(n * sizeof(int64));
	}
	l.total = off;
	return l;
}

static const char *
StateName(ServiceState state)
{
	switch (state)
	{
		case SERVICE_STARTING:
			return "starting";
		case SERVICE_CPU_ONLY:
			return "running (no GPU: scans use the CPU)";
		case SERVICE_GPU:
			return "running (GPU)";
		case SERVICE_EMULATED:
			return "running (GPU emulated on the CPU, for tests)";
		case SERVICE_STOPPED:
			break;
	}
	return "stopped";
}

/* gpu_ivfpq_status(): one row describing the service and what it served. */
Datum
gpu_ivfpq_status(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[15];
	bool		nulls[15];
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "gpu_ivfpq_status must return a composite type");
	memset(nulls, 0, sizeof(nulls));
	if (s == NULL)
	{
		values[0] = CStringGetTextDatum("not loaded (add gpu_ivfpq to shared_preload_libraries)");
		for (int i = 1; i < 15; i++)
			nulls[i] = true;
	}
	else
	{
		GpuIvfpqServiceShared copy;
		uint64		batches = pg_atomic_read_u64(&s->batches);
		uint64		gpu = pg_atomic_read_u64(&s->queries_gpu);
		Datum		hist[GPU_IVFPQ_BATCH_BUCKETS];

		SpinLockAcquire(&s->mutex);
		memcpy(&copy, s, offsetof(GpuIvfpqServiceShared, queries_gpu));
		SpinLockRelease(&s->mutex);
		for (int i = 0; i < GPU_IVFPQ_BATCH_BUCKETS; i++)
			hist[i] = Int64GetDatum((int64) pg_atomic_read_u64(&s->batch_hist[i]));

		values[0] = CStringGetTextDatum(StateName(copy.state));
		values[1] = Int32GetDatum(copy.pid);
		nulls[1] = copy.pid == 0;
		values[2] = CStringGetTextDatum(copy.device);
		values[3] = Int32GetDatum(copy.starts);
		values[4] = TimestampTzGetDatum(copy.started_at);
		nulls[4] = copy.starts == 0;
		values[5] = Int64GetDatum((int64) gpu);
		values[6] = Int64GetDatum((int64) pg_atomic_read_u64(&s->queries_cpu));
		values[7] = Int64GetDatum((int64) pg_atomic_read_u64(&s->fallbacks));
		values[8] = Int64GetDatum((int64) batches);
		values[9] = Float8GetDatum(batches > 0 ? (double) gpu / batches : 0.0);
		nulls[9] = batches == 0;
		values[10] = PointerGetDatum(construct_array(hist, GPU_IVFPQ_BATCH_BUCKETS, INT8OID, 8,
													 FLOAT8PASSBYVAL, TYPALIGN_DOUBLE));
		values[11] = Int32GetDatum(copy.nmirrors);
		values[12] = Float8GetDatum((double) copy.memory_used / (1024.0 * 1024.0));
		values[13] = Float8GetDatum((double) copy.memory_budget / (1024.0 * 1024.0));
		nulls[13] = copy.memory_budget == 0;
		values[14] = CStringGetTextDatum(copy.last_error);
		nulls[14] = copy.last_error[0] == '\0';
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/* gpu_ivfpq_mirrors(): the indexes mirrored in GPU memory, as last published. */
Datum
gpu_ivfpq_mirrors(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	GpuIvfpqMirrorStatus mirrors[GPU_IVFPQ_STATUS_MIRRORS];
	int			n = 0;

	InitMaterializedSRF(fcinfo, 0);
	if (s == NULL)
		PG_RETURN_VOID();
	SpinLockAcquire(&s->mutex);
	n = s->nmirrors;
	memcpy(mirrors, s->mirrors, sizeof(GpuIvfpqMirrorStatus) * n);
	SpinLockRelease(&s->mutex);
	for (int i = 0; i < n; i++)
	{
		Datum		values[7];
		bool		nulls[7];

		memset(nulls, 0, sizeof(nulls));
		values[0] = ObjectIdGetDatum(mirrors[i].key.db);
		values[1] = ObjectIdGetDatum(mirrors[i].key.index);
		values[2] = ObjectIdGetDatum(mirrors[i].key.relnode);
		values[3] = Int64GetDatum((int64) mirrors[i].key.build);
		values[4] = Int64GetDatum(mirrors[i].entries);
		values[5] = Float8GetDatum((double) mirrors[i].bytes / (1024.0 * 1024.0));
		values[6] = Int64GetDatum(mirrors[i].queries);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	PG_RETURN_VOID();
}
