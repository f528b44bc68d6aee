// The GPU service process (a background worker started when gpu_ivfpq is in
// shared_preload_libraries) and the shared state that gpu_ivfpq_status shows.
//
// This is the first part of the service: it starts, records which device it
// found, restarts when killed, and counts the queries scans served. Queries
// are still served by the CPU engine in the backends; requests to the GPU are
// the service's next step.
#include <exception>
#include <string>

#include "gpu_ivfpq.h"
#ifdef GPU_IVFPQ_WITH_CUDA
#include "gpu_ivfpq/gpu_context.h"
#endif

extern "C" {
#include "funcapi.h"
#include "port/atomics.h"
#include "postmaster/bgworker.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/shmem.h"
#include "storage/spin.h"
#include "tcop/tcopprot.h"
#include "utils/wait_event.h"

PGDLLEXPORT void gpu_ivfpq_service_main(Datum arg);
PG_FUNCTION_INFO_V1(gpu_ivfpq_status);
}

/* Service states, as the status view names them. */
typedef enum ServiceState
{
	SERVICE_STARTING = 0,
	SERVICE_CPU_ONLY,			/* running; no usable GPU, scans use the CPU */
	SERVICE_GPU_FOUND,			/* running with a GPU; scans still use the CPU */
	SERVICE_STOPPED
} ServiceState;

typedef struct GpuIvfpqServiceShared
{
	slock_t		mutex;			/* protects the non-atomic fields */
	int			pid;			/* the service's pid, 0 when not running */
	ServiceState state;
	int			starts;			/* how often the service has started */
	TimestampTz started_at;
	char		device[128];
	char		last_error[256];
	pg_atomic_uint64 queries_gpu;
	pg_atomic_uint64 queries_cpu;
} GpuIvfpqServiceShared;

static GpuIvfpqServiceShared *service = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

/* Reserves the service's shared memory (shmem_request_hook). */
static void
ServiceShmemRequest(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(GpuIvfpqServiceShared)));
}

/* Creates or attaches the shared state (shmem_startup_hook). */
static void
ServiceShmemStartup(void)
{
	bool		found;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	service = (GpuIvfpqServiceShared *) ShmemInitStruct("gpu_ivfpq service",
														 sizeof(GpuIvfpqServiceShared), &found);
	if (!found)
	{
		memset(service, 0, sizeof(*service));
		SpinLockInit(&service->mutex);
		service->state = SERVICE_STOPPED;
		pg_atomic_init_u64(&service->queries_gpu, 0);
		pg_atomic_init_u64(&service->queries_cpu, 0);
	}
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

/* Counts one scan served by the CPU engine (a no-op without the service). */
void
GpuIvfpqCountCpuQuery(void)
{
	if (service != NULL)
		pg_atomic_fetch_add_u64(&service->queries_cpu, 1);
}

/*
 * Looks for a usable GPU (CUDA is initialised here, in the service, never in
 * the postmaster or a backend). Describes it in device, or says why there is
 * none; a CUDA failure is recorded in err instead of ending the service.
 */
static bool
ProbeDevice(char *device, size_t devlen, char *err, size_t errlen)
{
#ifdef GPU_IVFPQ_WITH_CUDA
	bool		found = false;

	/* Engine code only inside: no PostgreSQL call may longjmp over it. */
	try
	{
		if (gpuivfpq::gpu::device_count() == 0)
			snprintf(device, devlen, "none (no CUDA device found)");
		else
		{
			std::string d = gpuivfpq::gpu::device_description(0);

			snprintf(device, devlen, "%s", d.c_str());
			found = true;
		}
	}
	catch (const std::exception &e)
	{
		snprintf(device, devlen, "none (CUDA error)");
		snprintf(err, errlen, "%s", e.what());
		found = false;
	}
	return found;
#else
	snprintf(device, devlen, "none (extension built without CUDA)");
	return false;
#endif
}

/* Marks the service stopped when its process exits, however it exits. */
static void
ServiceExit(int code, Datum arg)
{
	SpinLockAcquire(&service->mutex);
	service->pid = 0;
	service->state = SERVICE_STOPPED;
	SpinLockRelease(&service->mutex);
}

/*
 * The service's main loop. SIGTERM ends it with FATAL (exit code 1), so the
 * postmaster starts it again after bgw_restart_time unless it is shutting
 * down.
 */
void
gpu_ivfpq_service_main(Datum arg)
{
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	before_shmem_exit(ServiceExit, (Datum) 0);

	{
		char		device[128];
		char		err[256];
		bool		gpu;

		err[0] = '\0';
		gpu = ProbeDevice(device, sizeof(device), err, sizeof(err));
		if (err[0] != '\0')
			ereport(LOG, (errmsg("gpu_ivfpq service: no usable GPU: %s", err)));

		SpinLockAcquire(&service->mutex);
		service->pid = MyProcPid;
		service->starts++;
		service->started_at = GetCurrentTimestamp();
		service->state = gpu ? SERVICE_GPU_FOUND : SERVICE_CPU_ONLY;
		memcpy(service->device, device, sizeof(device));
		if (err[0] != '\0')
			memcpy(service->last_error, err, sizeof(err));
		SpinLockRelease(&service->mutex);
	}

	for (;;)
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, 10000L,
						 PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
		CHECK_FOR_INTERRUPTS();
	}
}

/* gpu_ivfpq_status(): one row describing the service and what it served. */
Datum
gpu_ivfpq_status(PG_FUNCTION_ARGS)
{
	TupleDesc	tupdesc;
	Datum		values[8];
	bool		nulls[8];
	static const char *const state_names[] = {"starting", "running (CPU only)",
		"running (GPU found; scans use the CPU)", "stopped"};

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "gpu_ivfpq_status must return a composite type");
	memset(nulls, 0, sizeof(nulls));
	if (service == NULL)
	{
		values[0] = CStringGetTextDatum("not loaded (add gpu_ivfpq to shared_preload_libraries)");
		for (int i = 1; i < 8; i++)
			nulls[i] = true;
	}
	else
	{
		int			pid;
		int			starts;
		ServiceState state;
		TimestampTz started_at;
		char		device[128];
		char		last_error[256];

		SpinLockAcquire(&service->mutex);
		pid = service->pid;
		starts = service->starts;
		state = service->state;
		started_at = service->started_at;
		memcpy(device, service->device, sizeof(device));
		memcpy(last_error, service->last_error, sizeof(last_error));
		SpinLockRelease(&service->mutex);

		values[0] = CStringGetTextDatum(state_names[state]);
		values[1] = Int32GetDatum(pid);
		nulls[1] = pid == 0;
		values[2] = CStringGetTextDatum(device);
		values[3] = Int32GetDatum(starts);
		values[4] = TimestampTzGetDatum(started_at);
		nulls[4] = starts == 0;
		values[5] = Int64GetDatum((int64) pg_atomic_read_u64(&service->queries_gpu));
		values[6] = Int64GetDatum((int64) pg_atomic_read_u64(&service->queries_cpu));
		values[7] = CStringGetTextDatum(last_error);
		nulls[7] = last_error[0] == '\0';
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}
