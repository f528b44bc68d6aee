// The GPU service process: a background worker that starts and supervises
// the GPU process (which owns the CUDA context, or the CPU emulation for
// tests, and the index mirrors), keeps the mirrors coherent through the
// change log (log_apply.cpp), and serves the requests that carry a DSM
// segment (serve.cpp). Scans and small gpu_metric searches never come here:
// backends queue them straight to the GPU process (direct_path.cpp).
//
// The service itself never touches the device: a fault there (a signal, a
// sticky CUDA error, a hang) ends the GPU process, not a process attached to
// shared memory, so the postmaster does not reinitialise the cluster. The
// requests in flight are answered "service gone" (their backends use the
// CPU engine), and the process is started again after a backoff.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu_process/reply_checks.h"
#include "service/worker.h"

extern "C" {
#include "miscadmin.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/pmsignal.h"
#include "storage/ipc.h"
#include "tcop/tcopprot.h"
#include "utils/memutils.h"
#include "utils/resowner.h"
#include "utils/wait_event.h"

PGDLLEXPORT void gpu_ivfpq_service_main(Datum arg);
}

namespace svc {


/* Service-local state (this process only; worker.h says what each holds). */
std::unique_ptr<GpuProcess> gpu;
std::map<MirrorKey, uint64> mirror_from;
uint64		mirrors_version = 0;
std::map<MirrorKey, LoadClaim> load_claims;
uint64		log_cursor;
char	   *log_vectors;
GpuIvfpqSlot **taken;
int			ntaken;

/* Supervision of the GPU process. */
static bool gpu_expected = true;	/* false once the process said there is no device */
static bool gpu_ever_served;	/* a process served since the service started */
static TimestampTz gpu_restart_at;	/* when to start it again */
static TimestampTz gpu_started_at;
static std::vector<std::string> gpu_arguments;	/* the devices the process was started with */
static int	gpu_backoff_ms;

#define GPU_BACKOFF_MIN_MS 1000 /* first restart after a death */
#define GPU_BACKOFF_MAX_MS 60000	/* doubling while it dies young */
#define GPU_STABLE_MS 60000		/* a process that lived this long resets the backoff */
#define GPU_START_TIMEOUT_S 120 /* opening a device (a CUDA context) takes a second or so */
#define GPU_PROCESS_PROGRAM "gpu_ivfpq_gpu_process"

/* The change log's head: where a process with no mirror starts reading. */
uint64
LogHead(void)
{
	uint64		head;

	LWLockAcquire(gpu_ivfpq_service->log_lock, LW_SHARED);
	head = gpu_ivfpq_service->log_head;
	LWLockRelease(gpu_ivfpq_service->log_lock);
	return head;
}

/* The views' figures (mirrors, memory) are refreshed at most this often under writes. */
#define PUBLISH_EVERY_NS ((uint64) 100 * 1000 * 1000)
static uint64 published_at = 0;
static bool served_since_publish = false;	/* requests were answered since: publish at once */

/* A monotonic clock in nanoseconds, for the round's stage timings. */
uint64
NowNs(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64) ts.tv_sec * 1000000000 + (uint64) ts.tv_nsec;
}

bool
GpuUp(void)
{
	return gpu && gpu->alive();
}

MirrorKey
ToKey(const GpuIvfpqKey &k)
{
	MirrorKey key;

	key.db = k.db;
	key.index = k.index;
	key.relnode = k.relnode;
	key.build = k.build;
	return key;
}

static void GpuProcessLost(void);

/* The GPU process, for a call (the service has at most one outstanding). */
GpuProcess *
GpuSync(void)
{
	return gpu.get();
}


/* The answer for a failed device call: the CPU engine, silently, if the GPU process died. */
RequestResult
Failed(bool oom)
{
	if (!GpuUp())
		return RES_SERVICE_GONE;
	return oom ? RES_NO_MEMORY : RES_ERROR;
}

void
RecordError(const std::string &err)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	SpinLockAcquire(&s->mutex);
	strlcpy(s->last_error, err.c_str(), sizeof(s->last_error));
	SpinLockRelease(&s->mutex);
	ereport(LOG, (errmsg("gpu_ivfpq service: %s", err.c_str())));
}

/*
 * Answers a taken slot and wakes its owner (or frees it if abandoned). A
 * slot its owner withdrew meanwhile (free again: the service's exit answers
 * slots it never took) stays free.
 */
void
Answer(GpuIvfpqSlot *slot, RequestResult result, const char *error)
{
	Latch	   *latch = NULL;

	slot->result = result;
	strlcpy(slot->error, error ? error : "", sizeof(slot->error));
	SpinLockAcquire(&slot->mutex);
	if (slot->state == SLOT_ABANDONED)
		slot->state = SLOT_FREE;	/* owner kept: a cancelled backend reuses it */
	else if (slot->state != SLOT_FREE)
	{
		slot->state = SLOT_DONE;
		latch = slot->latch;
	}
	SpinLockRelease(&slot->mutex);
	if (latch != NULL)
		SetLatch(latch);
}

/* Publishes the mirror list and memory figures for the status functions. */
void
PublishStatus(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	gpuivfpq::gpuproc::StoreStatus st;
	std::vector<gpuivfpq::DeviceInfo> devs;
	std::string err;
	bool		known = GpuUp() && Engine([&] {
		st = GpuSync()->status();
		devs = GpuSync()->devices();
	}, err);

	/* Without an answer: no mirrors (none, or none reachable); the counts stand. */
	SpinLockAcquire(&s->mutex);
	s->nmirrors = 0;
	for (const auto &info : st.mirrors)
	{
		GpuIvfpqMirrorStatus *m;

		if (s->nmirrors >= GPU_IVFPQ_STATUS_MIRRORS)
			break;
		m = &s->mirrors[s->nmirrors++];
		m->key.db = info.key.db;
		m->key.index = info.key.index;
		m->key.relnode = info.key.relnode;
		m->key.build = info.key.build;
		m->entries = (int64) info.entries;
		m->bytes = (int64) info.bytes;
		m->queries = (int64) info.queries;
		m->vectors = info.vectors;
		m->filter_keys = info.filter_keys;
		m->placement = (int) info.placement;
		m->device_mask = info.device_mask;
		m->metric = info.kind == (uint32_t) gpuivfpq::MirrorKind::Metric;
		m->change_count = info.key.change;
	}
	s->ndevices = 0;
	for (const auto &info : devs)
	{
		GpuIvfpqDeviceStatus *d;

		if (s->ndevices >= GPU_IVFPQ_STATUS_DEVICES)
			break;
		d = &s->devices[s->ndevices++];
		d->device = (int) info.ordinal;
		d->alive = info.alive != 0;
		strlcpy(d->description, info.description, sizeof(d->description));
		d->memory_budget = (int64) info.budget;
		d->memory_used = (int64) info.bytes;
		d->queries = (int64) info.queries;
		d->batches = (int64) info.batches;
		d->busy_us = (int64) (info.busy_ns / 1000);
	}
	s->memory_used = (int64) st.bytes;
	if (known)
	{
		s->memory_budget = (int64) st.budget;
		s->evictions += (int64) st.evictions - s->evictions_base;
		s->evictions_base = (int64) st.evictions;
	}
	SpinLockRelease(&s->mutex);
}

/*
 * The mirror memory budget of each GPU: the setting, or 0 for the GPU
 * process's default, three quarters of each GPU (the rest is search
 * scratch, builds and other processes).
 */
size_t
BudgetBytes(void)
{
	return (size_t) gpu_ivfpq_gpu_memory_budget_kb * 1024;
}

/* Drops a mirror whose update failed: it reloads from the pages on next use. */
void
DropAfterFailure(const MirrorKey &key, const char *what, const std::string &err)
{
	std::string ignored;

	(void) Engine([&] { GpuSync()->drop_index(key.db, key.index); }, ignored);
	RecordError(std::string(what) + " failed, mirror dropped: " + err);
}

/* Answers every request still open when the service exits, however it exits. */
static void
ServiceExit(int code, Datum arg)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	SpinLockAcquire(&s->mutex);
	s->pid = 0;
	s->latch = NULL;
	s->state = SERVICE_STOPPED;
	s->gpu_pid = 0;				/* the GPU process goes with the service (below) */
	SpinLockRelease(&s->mutex);
	for (int i = 0; i < s->nslots; i++)
	{
		GpuIvfpqSlot *slot = &s->slots[i];
		SlotState	st;

		SpinLockAcquire(&slot->mutex);
		st = slot->state;
		SpinLockRelease(&slot->mutex);
		if (st == SLOT_PENDING || st == SLOT_RUNNING || st == SLOT_ABANDONED)
			Answer(slot, RES_SERVICE_GONE, "the gpu_ivfpq service exited");
	}
	/* Mirrors live in the GPU process's device memory: they go with it. */
	gpu.reset();
	GpuIvfpqQueueDestroy("the gpu_ivfpq service exited");
}

/* While a GPU call waits: give up (and end the GPU process) when the service must stop. */
static bool
StopWaiting(void)
{
	return ProcDiePending || !PostmasterIsAlive();
}

/* Publishes the state, the device and the GPU process's pid. */
static void
PublishState(ServiceState state, const char *device)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	SpinLockAcquire(&s->mutex);
	s->state = state;
	if (device != NULL)
		strlcpy(s->device, device, sizeof(s->device));
	s->gpu_pid = GpuUp() ? gpu->pid() : 0;
	SpinLockRelease(&s->mutex);
}

/*
 * The GPU process's device arguments: the GPUs gpu_ivfpq.devices lists
 * (blanks dropped), among as many emulated ones as the test setting asks
 * for when the GPU is emulated.
 */
static std::vector<std::string>
DeviceArguments(void)
{
	std::vector<std::string> args;
	std::string list;

	if (gpu_ivfpq_service_emulate_gpu)
		args = {"--emulated-devices", std::to_string(gpu_ivfpq_service_emulate_devices)};
	for (const char *p = gpu_ivfpq_device_list; p != NULL && *p != '\0'; p++)
		if (*p != ' ')
			list += *p;
	if (!list.empty())
		args.insert(args.end(), {"--devices", list});
	return args;
}

/*
 * Starts the GPU process (the emulation if asked for, else every CUDA
 * device it may use) and gives it the memory budget. No device at all leaves the
 * service CPU-only for good; any other failure is retried after a backoff.
 */
static void
StartGpuProcess(void)
{
	char		program[MAXPGPATH];
	std::string err;
	bool		no_device = false;
	ServiceState state;

	snprintf(program, sizeof(program), "%s/%s", pkglib_path, GPU_PROCESS_PROGRAM);
	if (!Engine([&] {
			try
			{
				gpu_arguments = DeviceArguments();
				gpu = GpuProcess::start(program, "gpu_ivfpq: GPU process", gpu_ivfpq_service_emulate_gpu,
										StopWaiting, GPU_START_TIMEOUT_S, gpu_arguments, GpuIvfpqQueueFd());
			}
			catch (const gpuivfpq::gpuproc::StartError &e)
			{
				no_device = e.no_device();
				throw;
			}
			gpu->set_timeout(gpu_ivfpq_gpu_timeout_s, GPU_BULK_TIMEOUT_FACTOR);
			/* Mirrors hold heap TIDs: a search answering anything else is malformed. */
			gpu->set_label_check(gpuivfpq::replycheck::tid_label);
			GpuSync()->set_budget(BudgetBytes());
		}, err))
	{
		gpu.reset();
		/*
		 * No device at all: CPU-only for good, unless a device served
		 * before (a GPU can vanish for a while after a fault or a driver
		 * reset): then retry, at the longest backoff.
		 */
		if (no_device && gpu_ever_served)
			gpu_backoff_ms = GPU_BACKOFF_MAX_MS;
		else if (no_device)
		{
			gpu_expected = false;
			ereport(LOG, (errmsg("gpu_ivfpq service: no usable GPU: %s", err.c_str())));
			/* The process says "none (why)"; a missing program gets the same form. */
			if (err.compare(0, 4, "none") != 0)
				err = "none (" + err + ")";
			PublishState(SERVICE_CPU_ONLY, err.c_str());
			return;
		}
		gpu_restart_at = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), gpu_backoff_ms);
		gpu_backoff_ms = Min(gpu_backoff_ms * 2, GPU_BACKOFF_MAX_MS);
		RecordError("the GPU process failed to start: " + err);
		PublishState(SERVICE_RESTARTING, NULL);
		return;
	}
	gpu_expected = true;
	gpu_ever_served = true;
	gpu_started_at = GetCurrentTimestamp();
	/* A new process holds no mirror: changes logged so far are in the pages. */
	mirror_from.clear();
	mirrors_version++;
	load_claims.clear();
	log_cursor = LogHead();
	GpuIvfpqQueueSetApplied(log_cursor);
	SpinLockAcquire(&gpu_ivfpq_service->mutex);
	gpu_ivfpq_service->evictions_base = 0;
	SpinLockRelease(&gpu_ivfpq_service->mutex);
	state = gpu->kind() == gpuivfpq::gpuproc::Kind::Gpu ? SERVICE_GPU : SERVICE_EMULATED;
	PublishStatus();			/* its devices, before the state says it serves */
	published_at = NowNs();
	PublishState(state, gpu->description().c_str());
	ereport(LOG, (errmsg("gpu_ivfpq service: GPU process %d serving on %s",
						 (int) gpu->pid(), gpu->description().c_str())));
}

/*
 * After the GPU process died (noticed by a failed call or while idle):
 * count it and its cause, forget its mirrors, and schedule the restart,
 * sooner when it had run a while, later when it keeps dying young.
 */
static void
GpuProcessLost(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	TimestampTz now = GetCurrentTimestamp();
	std::string cause = gpu->cause();

	gpu.reset();
	/* What it held or was queued for it: the CPU engine answers. */
	GpuIvfpqQueueFailAll("the GPU process is restarting");
	mirror_from.clear();
	mirrors_version++;
	load_claims.clear();
	if (TimestampDifferenceExceeds(gpu_started_at, now, GPU_STABLE_MS))
		gpu_backoff_ms = GPU_BACKOFF_MIN_MS;
	gpu_restart_at = TimestampTzPlusMilliseconds(now, gpu_backoff_ms);
	SpinLockAcquire(&s->mutex);
	s->gpu_restarts++;
	strlcpy(s->last_gpu_exit, cause.c_str(), sizeof(s->last_gpu_exit));
	s->last_gpu_exit_at = now;
	SpinLockRelease(&s->mutex);
	ereport(LOG,
			(errmsg("gpu_ivfpq service: the GPU process %s", cause.c_str()),
			 errdetail("Scans use the CPU engine until it restarts, in %d ms; mirrors reload on demand.",
					   gpu_backoff_ms)));
	gpu_backoff_ms = Min(gpu_backoff_ms * 2, GPU_BACKOFF_MAX_MS);
	PublishState(SERVICE_RESTARTING, NULL);
	PublishStatus();
}

}								/* namespace svc */

using namespace svc;

/*
 * The service's main loop. SIGTERM ends it with FATAL (exit code 1), so the
 * postmaster starts it again after bgw_restart_time unless it is shutting
 * down; an ERROR inside the loop is logged, answers the requests in hand,
 * and the loop goes on.
 */
void
gpu_ivfpq_service_main(Datum arg)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	sigjmp_buf	local_sigjmp_buf;
	MemoryContext loopctx;
	static std::string err;	/* static: survives the sigsetjmp below */

	pqsignal(SIGTERM, die);
	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	/* The GPU process is this process's child: its exit status tells why it died. */
	pqsignal(SIGCHLD, SIG_DFL);
	BackgroundWorkerUnblockSignals();
	/* No database: this only makes the service visible in pg_stat_activity. */
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_activity(STATE_IDLE, NULL);
	before_shmem_exit(ServiceExit, (Datum) 0);
	loopctx = AllocSetContextCreate(TopMemoryContext, "gpu_ivfpq service loop", ALLOCSET_DEFAULT_SIZES);

	/* Requests left by an earlier incarnation get an answer now. */
	for (int i = 0; i < s->nslots; i++)
	{
		GpuIvfpqSlot *slot = &s->slots[i];

		if (slot->state == SLOT_PENDING || slot->state == SLOT_RUNNING || slot->state == SLOT_ABANDONED)
			Answer(slot, RES_SERVICE_GONE, "the gpu_ivfpq service restarted");
	}
	log_cursor = LogHead();		/* no mirror exists yet: older changes are in the pages */

	SpinLockAcquire(&s->mutex);
	s->pid = MyProcPid;
	s->latch = MyLatch;
	s->starts++;
	s->started_at = GetCurrentTimestamp();
	s->state = SERVICE_STARTING;
	s->last_error[0] = '\0';
	SpinLockRelease(&s->mutex);
	gpu_backoff_ms = GPU_BACKOFF_MIN_MS;
	{
		char		qerr[256];

		/* Without it scans use the CPU engine; builds, loads and batch functions still use the GPU. */
		if (!GpuIvfpqQueueCreate(qerr, sizeof(qerr)))
			ereport(LOG, (errmsg("gpu_ivfpq service: no direct path for scans: %s", qerr)));
	}
	StartGpuProcess();
	PublishStatus();

	taken = (GpuIvfpqSlot **) MemoryContextAlloc(TopMemoryContext, sizeof(GpuIvfpqSlot *) * s->nslots);
	ntaken = 0;
	log_vectors = (char *) MemoryContextAllocHuge(TopMemoryContext, GPU_IVFPQ_VECTOR_RING_BYTES);
	if (sigsetjmp(local_sigjmp_buf, 1) != 0)
	{
		/*
		 * An ERROR in the loop's PostgreSQL part (the C++ part runs under
		 * GpuIvfpqTry, so no C++ frame lies between here and the error):
		 * report it, answer what was in hand, go on.
		 */
		ErrorData  *edata;

		HOLD_INTERRUPTS();
		error_context_stack = NULL;
		pgstat_report_wait_end();
		LWLockReleaseAll();
		/* The check of pg_database runs in a transaction (CheckDroppedDatabases). */
		AbortCurrentTransaction();
		MemoryContextSwitchTo(loopctx);
		edata = CopyErrorData();
		FlushErrorState();
		RecordError(edata->message ? edata->message : "error");
		for (int i = 0; i < ntaken; i++)
			if (taken[i]->state == SLOT_RUNNING || taken[i]->state == SLOT_ABANDONED)
				Answer(taken[i], RES_ERROR, "the gpu_ivfpq service failed");
		ntaken = 0;
		MemoryContextReset(loopctx);
		RESUME_INTERRUPTS();
	}
	PG_exception_stack = &local_sigjmp_buf;

	for (;;)
	{
		MemoryContextSwitchTo(loopctx);
		MemoryContextReset(loopctx);
		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
			/* Another list of GPUs: a new process opens them; mirrors reload there on demand. */
			if (DeviceArguments() != gpu_arguments)
			{
				ereport(LOG, (errmsg("gpu_ivfpq service: gpu_ivfpq.devices changed, restarting the GPU process")));
				gpu.reset();
				GpuIvfpqQueueFailAll("the GPU process is restarting");
				mirror_from.clear();
				mirrors_version++;
				load_claims.clear();
				gpu_expected = true;
				gpu_backoff_ms = GPU_BACKOFF_MIN_MS;
				gpu_restart_at = GetCurrentTimestamp();
				gpu_arguments = DeviceArguments();
				PublishState(SERVICE_RESTARTING, NULL);
				PublishStatus();
			}
			GpuIvfpqQueueSettings(gpu_ivfpq_batch_size, gpu_ivfpq_batch_wait_us, gpu_ivfpq_batches_in_flight,
								  gpu_ivfpq_gpu_poll_us);
			if (GpuUp())
				(void) Engine([&] {
					gpu->set_timeout(gpu_ivfpq_gpu_timeout_s, GPU_BULK_TIMEOUT_FACTOR);
					GpuSync()->set_budget(BudgetBytes());
					GpuSync()->enforce_budget();
				}, err);
		}
		/*
		 * Supervision: a direct-path search queued, or a batch running,
		 * longer than gpu_timeout means a hung GPU process.
		 */
		if (GpuUp() && gpu_ivfpq_gpu_timeout_s > 0)
		{
			uint64		since = GpuIvfpqQueueStalledSinceNs();

			if (since != 0 && GpuIvfpqQueueNowNs() - since > (uint64) gpu_ivfpq_gpu_timeout_s * 1000000000)
				gpu->kill_hung("did not answer within " + std::to_string(gpu_ivfpq_gpu_timeout_s) + " s");
		}
		/* Notice a death while idle; restart when the backoff is over. */
		if (gpu && (gpu->check_exit() || !gpu->alive()))
			GpuProcessLost();
		if (!gpu && gpu_expected && GetCurrentTimestamp() >= gpu_restart_at)
			StartGpuProcess();
		if (!gpu)
			GpuIvfpqQueueFailAll("the GPU process is restarting");	/* queued as it went */
		CheckDroppedDatabases();
		ResetLatch(MyLatch);
		ntaken = 0;
		(void) Collect();
		if (ntaken == 0)
		{
			long		timeout = 1000L;
			uint64		now = NowNs();
			bool		publish = served_since_publish || now - published_at >= PUBLISH_EVERY_NS;

			/*
			 * Writers wake the service for each change (commits wait for
			 * it): the log is applied at once, the views (calls to the GPU
			 * process) follow at most every PUBLISH_EVERY_NS; after
			 * requests (loads, batch functions, gpu_metric) at once.
			 */
			(void) Engine([&] {
				DrainLog();
				if (publish)
					PublishStatus();
			}, err);
			if (publish)
			{
				published_at = now;
				served_since_publish = false;
			}
			else
				timeout = PUBLISH_EVERY_NS / 1000000;
			if (!gpu && gpu_expected)
				timeout = Max(10L, Min(timeout, (long) ((gpu_restart_at - GetCurrentTimestamp()) / 1000)));
			(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH, timeout,
							 PG_WAIT_EXTENSION);
			continue;
		}
		ServeRound();
		ntaken = 0;
		served_since_publish = true;
	}
}
