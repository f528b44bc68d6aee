// The direct path between the backends and the GPU process: the segment of
// gpu_process/query_queue.h, created by the service (a POSIX shared memory
// object of its own, never PostgreSQL's main shared memory, which the GPU
// process must not map) and mapped by every backend that searches.
//
// A scan round goes: the backend writes its search into its slot (the slot
// index of its request slot in the main shared memory, so that no second
// claim is needed), marks it pending and sleeps on the slot's state word; the
// GPU process batches, searches and answers there. Nothing of it passes
// through the service, which only creates the segment, publishes how far
// the mirrors follow the change log, and answers what a dead GPU process
// leaves. docs/gpu-service.md explains the choices.
#include "gpu_process/query_queue.h"
#include "service/shmem.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

extern "C" {
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/postmaster.h"
#include "storage/dsm_impl.h"
#include "storage/fd.h"
#include "storage/ipc.h"
#include "storage/pmsignal.h"
#include "utils/wait_event.h"
}

using gpuivfpq::queue::Queue;

StaticAssertDecl(GPU_IVFPQ_QUEUE_PAYLOAD == gpuivfpq::queue::kPayload, "the backends know the slots' payload");
namespace queue = gpuivfpq::queue;

/* The service's segment: its descriptor (handed to each GPU process) and mapping. */
static int	service_fd = -1;
static void *service_base = NULL;
static Size service_bytes = 0;
static Queue service_queue;

/* A backend's mapping, of the generation it was made for. */
static void *backend_base = NULL;
static Size backend_bytes = 0;
static uint64 backend_generation = 0;
static Queue backend_queue;

static void AddStats(GpuIvfpqQueueStats *out, const queue::Stats &st);

/* How long one sleep on a slot lasts before interrupts are looked at (ms). */
#define QUEUE_POLL_MS 10

/* ---- the service ---- */

/* Where the service records its segment's name, so that a later start removes one a crash left. */
#define QUEUE_NAME_FILE PG_DYNSHMEM_DIR "/gpu_ivfpq.queue"

/*
 * This cluster's prefix of segment names: its data directory's device and
 * inode, which no other cluster on the host shares while it runs (a port
 * does not tell clusters apart: two containers sharing /dev/shm may both
 * listen on 5432).
 */
static void
QueueNamePrefix(char *prefix, Size len)
{
	struct stat st;

	if (stat(DataDir, &st) != 0)
		memset(&st, 0, sizeof(st));
	snprintf(prefix, len, "/gpu_ivfpq.%llx.%llx.", (unsigned long long) st.st_dev,
			 (unsigned long long) st.st_ino);
}

/*
 * Removes the segment an earlier service of this cluster recorded and left
 * (a crash, an immediate stop), only when the recorded name carries this
 * cluster's prefix: a data directory copied from another cluster (a file
 * system backup on the same host) must not remove that cluster's segment.
 */
static void
RemoveRecordedQueue(const char *prefix)
{
	char		name[64];
	FILE	   *f = AllocateFile(QUEUE_NAME_FILE, "r");

	if (f == NULL)
		return;
	if (fgets(name, sizeof(name), f) != NULL)
	{
		name[strcspn(name, "\n")] = '\0';
		if (strncmp(name, prefix, strlen(prefix)) == 0 && strchr(name + 1, '/') == NULL)
			(void) shm_unlink(name);
	}
	FreeFile(f);
	(void) unlink(QUEUE_NAME_FILE);
}

/* Records name for RemoveRecordedQueue; a failure only leaves a crash's segment behind. */
static void
RecordQueue(const char *name)
{
	FILE	   *f = AllocateFile(QUEUE_NAME_FILE, "w");

	if (f == NULL)
		return;
	fprintf(f, "%s\n", name);
	(void) FreeFile(f);
}

/*
 * Creates the segment under a name of its own (this cluster's prefix and a
 * random part, created exclusively: no other cluster's, nor one another
 * user placed there, is ever opened or removed), sized for one slot per
 * request slot, and publishes it. Returns false with the reason when it
 * cannot.
 */
bool
GpuIvfpqQueueCreate(char *error, Size errlen)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	char		prefix[48];
	char		name[64];
	Size		bytes = Queue::bytes_for((uint32) s->nslots);
	uint64		generation;
	int			fd = -1;
	void	   *base;

	QueueNamePrefix(prefix, sizeof(prefix));
	RemoveRecordedQueue(prefix);
	for (int attempt = 0; attempt < 8 && fd < 0; attempt++)
	{
		uint64		token;

		if (!pg_strong_random(&token, sizeof(token)))
			token = ((uint64) MyProcPid << 32) ^ (uint64) GetCurrentTimestamp() ^ (uint64) attempt;
		snprintf(name, sizeof(name), "%s%016llx", prefix, (unsigned long long) token);
		fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, S_IRUSR | S_IWUSR);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0)
	{
		snprintf(error, errlen, "could not create shared memory segment \"%s\": %m", name);
		return false;
	}
	RecordQueue(name);
	/* Out of the way of the descriptors the GPU process gets (3 to 5), and not inherited. */
	{
		int			high = fcntl(fd, F_DUPFD_CLOEXEC, 10);

		if (high >= 0)
		{
			close(fd);
			fd = high;
		}
	}
	if (ftruncate(fd, (off_t) bytes) != 0)
	{
		snprintf(error, errlen, "could not size shared memory segment \"%s\" to %zu bytes: %m", name, bytes);
		close(fd);
		(void) shm_unlink(name);
		return false;
	}
	/*
	 * ftruncate reserves nothing: on a full /dev/shm the first touch of a
	 * page (Queue::create clears them all) would kill this process with
	 * SIGBUS, and with it the cluster. As PostgreSQL's own segments do, the
	 * memory is allocated now, and a shortage is an error (scans then use
	 * the CPU).
	 */
	{
		int			rc;

		do
			rc = posix_fallocate(fd, 0, (off_t) bytes);
		while (rc == EINTR);
		if (rc != 0)
		{
			errno = rc;
			snprintf(error, errlen, "could not allocate %zu bytes for shared memory segment \"%s\": %m",
					 bytes, name);
			close(fd);
			(void) shm_unlink(name);
			return false;
		}
	}
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (base == MAP_FAILED)
	{
		snprintf(error, errlen, "could not map shared memory segment \"%s\": %m", name);
		close(fd);
		(void) shm_unlink(name);
		return false;
	}
	SpinLockAcquire(&s->mutex);
	generation = s->queue_generation + 1;
	SpinLockRelease(&s->mutex);
	service_queue = Queue::create(base, bytes, (uint32) s->nslots, generation);
	service_fd = fd;
	service_base = base;
	service_bytes = bytes;
	service_queue.header().applied.store(pg_atomic_read_u64(&s->log_applied));
	GpuIvfpqQueueSettings(gpu_ivfpq_batch_size, gpu_ivfpq_batch_wait_us, gpu_ivfpq_batches_in_flight,
						  gpu_ivfpq_gpu_poll_us);
	SpinLockAcquire(&s->mutex);
	strlcpy(s->queue_name, name, sizeof(s->queue_name));
	s->queue_bytes = bytes;
	s->queue_generation = generation;
	SpinLockRelease(&s->mutex);
	return true;
}

/* Unpublishes the segment, answers what it holds with message, and removes it. */
void
GpuIvfpqQueueDestroy(const char *message)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	char		name[64];

	if (service_base == NULL)
		return;
	{
		GpuIvfpqQueueStats past;

		SpinLockAcquire(&s->mutex);
		past = s->queue_past;
		SpinLockRelease(&s->mutex);
		/* The counters stay, whatever a dead GPU process left in them: counts only grow. */
		AddStats(&past, service_queue.header().stats);
		SpinLockAcquire(&s->mutex);
		strlcpy(name, s->queue_name, sizeof(name));
		s->queue_name[0] = '\0';
		s->queue_bytes = 0;
		s->queue_past = past;
		SpinLockRelease(&s->mutex);
	}
	(void) service_queue.fail_all(message);
	(void) shm_unlink(name);
	(void) unlink(QUEUE_NAME_FILE);
	munmap(service_base, service_bytes);
	close(service_fd);
	service_base = NULL;
	service_fd = -1;
	service_queue = Queue();
}

int
GpuIvfpqQueueFd(void)
{
	return service_fd;
}

/* The mirrors include the change log up to pos: searches that waited for it may go. */
void
GpuIvfpqQueueSetApplied(uint64 pos)
{
	if (!service_queue.ok())
		return;
	service_queue.header().applied.store(pos, std::memory_order_release);
	service_queue.wake_server();
}

void
GpuIvfpqQueueSettings(int batch_size, int batch_wait_us, int batches_in_flight, int poll_us)
{
	if (!service_queue.ok())
		return;
	service_queue.header().servers.store((uint32) Max(0, batches_in_flight));
	service_queue.header().batch_size.store((uint32) Max(1, batch_size));
	service_queue.header().batch_wait_us.store((uint32) Max(0, batch_wait_us));
	service_queue.header().poll_us.store((uint32) Max(0, poll_us));
}

/* The GPU process died: whatever it held or was queued is answered "gone". */
void
GpuIvfpqQueueFailAll(const char *message)
{
	if (!service_queue.ok())
		return;
	(void) service_queue.fail_all(message);
	/* Whatever the dead process wrote over them: the settings again. */
	GpuIvfpqQueueSettings(gpu_ivfpq_batch_size, gpu_ivfpq_batch_wait_us, gpu_ivfpq_batches_in_flight,
						  gpu_ivfpq_gpu_poll_us);
}

/* Since when the GPU process owes the direct path progress (0: it owes none). */
uint64
GpuIvfpqQueueStalledSinceNs(void)
{
	return service_queue.ok() ? service_queue.stalled_since_ns() : 0;
}

uint64
GpuIvfpqQueueNowNs(void)
{
	return queue::now_ns();
}

/* ---- the backends ---- */

static void
UnmapBackendQueue(void)
{
	if (backend_base != NULL)
		munmap(backend_base, backend_bytes);
	backend_base = NULL;
	backend_bytes = 0;
	backend_generation = 0;
	backend_queue = Queue();
}

/*
 * At backend exit: a search still queued is withdrawn, one being served is
 * left to the GPU process to free, an answer not read is dropped, so that
 * the next backend given this slot finds it free. (An ERROR while waiting
 * does the same in GpuIvfpqQueueSearch; a FATAL exits without unwinding.)
 */
static void
ReleaseQueueSlotAtExit(int code, Datum arg)
{
	int			i = DatumGetInt32(arg);

	if (!backend_queue.ok() || i < 0 || (uint32) i >= backend_queue.slots())
		return;
	if (!backend_queue.abandon((uint32) i))
		backend_queue.release((uint32) i);
}

/* The segment of the current generation, mapped; NULL when there is none. */
static const Queue *
BackendQueue(void)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	char		name[64];
	Size		bytes;
	uint64		generation;
	int			fd;
	void	   *base;

	SpinLockAcquire(&s->mutex);
	strlcpy(name, s->queue_name, sizeof(name));
	bytes = s->queue_bytes;
	generation = s->queue_generation;
	SpinLockRelease(&s->mutex);
	if (name[0] == '\0')
		return NULL;
	if (generation == backend_generation && backend_queue.ok())
		return &backend_queue;
	UnmapBackendQueue();
	fd = shm_open(name, O_RDWR, 0);
	if (fd < 0)
		return NULL;
	/* A segment not yet sized (the service restarting) would fault on touch. */
	{
		struct stat st;

		/* Ours alone: one another user made under a name just freed is not mapped. */
		if (fstat(fd, &st) != 0 || (Size) st.st_size < bytes || st.st_uid != geteuid())
		{
			close(fd);
			return NULL;
		}
	}
	base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (base == MAP_FAILED)
		return NULL;
	backend_base = base;
	backend_bytes = bytes;
	backend_queue = Queue::attach(base, bytes);
	if (!backend_queue.ok() || backend_queue.header().generation != generation ||
		backend_queue.slots() != (uint32) s->nslots)
	{
		UnmapBackendQueue();
		return NULL;
	}
	backend_generation = generation;
	{
		static bool exit_hook = false;
		int			i = GpuIvfpqMySlotIndex();

		/* Before the main shared memory's slot is released (on_shmem_exit runs in reverse). */
		if (!exit_hook && i >= 0)
		{
			on_shmem_exit(ReleaseQueueSlotAtExit, Int32GetDatum(i));
			exit_hook = true;
		}
	}
	return &backend_queue;
}

static RequestResult
ResultOf(int32 r)
{
	switch ((queue::Result) r)
	{
		case queue::Result::Ok:
			return RES_OK;
		case queue::Result::NotLoaded:
			return RES_NOT_LOADED;
		case queue::Result::Loading:
			return RES_LOADING;
		case queue::Result::NoMemory:
			return RES_NO_MEMORY;
		case queue::Result::Gone:
			return RES_SERVICE_GONE;
		case queue::Result::Error:
			break;
	}
	return RES_ERROR;
}

/*
 * Why this backend cannot queue a search now, or NULL: no segment (the
 * service is starting or gone), or its slot is still held by a search it
 * gave up (the GPU process frees it when done).
 */
const char *
GpuIvfpqQueueUnavailable(void)
{
	const Queue *q = BackendQueue();
	int			i;

	if (q == NULL)
		return "The GPU service's queue is not available";
	i = GpuIvfpqMySlotIndex();
	if (i < 0 || (uint32) i >= q->slots() ||
		q->state((uint32) i).load(std::memory_order_acquire) != queue::Free)
		return "No request slot is free";
	return NULL;
}

/*
 * Gives up the mirror load this backend was told to do (a NotLoaded
 * answer), so that the GPU process and the service let the next search
 * claim it at once instead of sending every search to the CPU until the
 * claim lapses. on_error: called in the load's error path, where only a
 * cancel gives it up; any other error keeps the claim (others use the CPU
 * meanwhile, not a load that fails again). Else the backend does not load
 * at all (its request slot is busy). Safe in an error path (an atomic add
 * to its slot).
 */
void
GpuIvfpqQueueGiveUpLoad(bool on_error)
{
	int			i = GpuIvfpqMySlotIndex();

	if ((!on_error || geterrcode() == ERRCODE_QUERY_CANCELED) &&
		backend_queue.ok() && i >= 0 && (uint32) i < backend_queue.slots())
		backend_queue.give_up_load((uint32) i);
}

/*
 * Whether this backend is loading a mirror it was told to load: a backend
 * that exits meanwhile (terminated: no error path runs) gives the load up
 * as it goes (GpuIvfpqQueueExitGiveUp, from the slot's exit callback).
 */
static bool loading_claimed = false;

void
GpuIvfpqQueueLoading(bool loading)
{
	loading_claimed = loading;
}

void
GpuIvfpqQueueExitGiveUp(void)
{
	if (loading_claimed)
		GpuIvfpqQueueGiveUpLoad(false);
	loading_claimed = false;
}

/* The loads slot gave up so far (GpuIvfpqQueueGiveUpLoad), for the service's claims; 0 without the segment. */
uint32
GpuIvfpqQueueLoadsGivenUp(int slot)
{
	if (!service_queue.ok() || slot < 0 || (uint32) slot >= service_queue.slots())
		return 0;
	return service_queue.loads_given_up((uint32) slot);
}

/*
 * This backend's slot when it may queue a search now, else NULL with the
 * reason in error and *result set.
 */
static const Queue *
FreeQueueSlot(int *slot, RequestResult *result, char *error, Size errlen)
{
	const Queue *q = BackendQueue();
	int			i = GpuIvfpqMySlotIndex();

	error[0] = '\0';
	if (q == NULL)
	{
		strlcpy(error, "the direct path's segment is not available", errlen);
		*result = RES_SERVICE_GONE;
		return NULL;
	}
	if (i >= 0 && (uint32) i < q->slots())
	{
		/*
		 * Nobody waits on this slot now: a Done answer never released or a
		 * state word that is none of the queue's (written by a misbehaving
		 * GPU process) is freed, so that the slot serves again.
		 */
		uint32		s = q->state((uint32) i).load(std::memory_order_acquire);

		if (s == queue::Done || s > queue::Abandoned)
			(void) q->state((uint32) i).compare_exchange_strong(s, queue::Free, std::memory_order_acq_rel);
	}
	if (i < 0 || (uint32) i >= q->slots() ||
		q->state((uint32) i).load(std::memory_order_acquire) != queue::Free)
	{
		strlcpy(error, "No request slot is free", errlen);
		*result = RES_ERROR;
		return NULL;
	}
	*slot = i;
	return q;
}

/*
 * Submits slot i (filled) and sleeps until the GPU process answers. A cancel
 * while waiting gives the request up and raises the error; the GPU process
 * frees the slot when it is done with it. Returns false when no answer will
 * come: no GPU process is left to answer, or none came within gpu_timeout
 * and a second (the service kills a GPU process that owes progress that
 * long, but a search it holds past its batch is not always visible to it),
 * or a GPU process wrote a state into the slot that no search of this
 * backend's can be in (error says which; the caller uses the CPU engine).
 * Else the slot is Done: copy the answer out, then release it.
 */
static bool
SubmitAndWait(const Queue *q, uint32 i, char *error, Size errlen)
{
	volatile bool gone = false;
	uint64		deadline = 0;

	if (gpu_ivfpq_gpu_timeout_s > 0)
		deadline = queue::now_ns() + ((uint64) gpu_ivfpq_gpu_timeout_s + 1) * UINT64CONST(1000000000);
	q->slot(i).req.owner_pid = (uint32) MyProcPid;
	q->submit(i);
	pgstat_report_wait_start(PG_WAIT_EXTENSION);
	PG_TRY();
	{
		while (!q->wait_done(i, QUEUE_POLL_MS))
		{
			uint32		s;

			if (!PostmasterIsAlive())
				proc_exit(1);	/* everything goes with the postmaster */
			CHECK_FOR_INTERRUPTS();
			s = q->state(i).load(std::memory_order_acquire);
			if (s == queue::Done)
				break;			/* answered since wait_done looked */
			if (s != queue::Pending && s != queue::Running)
			{
				/* Not ours to wait on any more: FreeQueueSlot frees it next time. */
				strlcpy(error, "the GPU process wrote an unknown state into a request slot", errlen);
				gone = true;
				break;
			}
			/* No GPU process to answer (it died as this was queued): the CPU engine. */
			if (!GpuIvfpqServiceServing() && q->abandon(i))
			{
				strlcpy(error, "the GPU process is restarting", errlen);
				gone = true;
				break;
			}
			if (deadline != 0 && queue::now_ns() > deadline && q->abandon(i))
			{
				snprintf(error, errlen, "the GPU process did not answer within gpu_ivfpq.gpu_timeout (%d s)",
						 gpu_ivfpq_gpu_timeout_s);
				gone = true;
				break;
			}
		}
	}
	PG_CATCH();
	{
		if (!q->abandon(i))
		{
			/* Answered meanwhile: a load this backend was told to do is given up (it will not). */
			if (q->state(i).load(std::memory_order_acquire) == queue::Done &&
				q->slot(i).ans.result == int32_t(queue::Result::NotLoaded))
				q->give_up_load(i);
			q->release(i);
		}
		pgstat_report_wait_end();
		PG_RE_THROW();
	}
	PG_END_TRY();
	pgstat_report_wait_end();
	return !gone;
}

static gpuivfpq::MirrorKey
QueueKey(const GpuIvfpqKey *key, uint64 change)
{
	gpuivfpq::MirrorKey k;

	k.db = key->db;
	k.index = key->index;
	k.relnode = key->relnode;
	k.build = key->build;
	k.change = change;
	return k;
}

/*
 * One scan round through the direct path: k candidates of query over nprobe
 * lists of the mirror of key. On RES_OK, labels (and, with *dists, their
 * exact distances or lower bounds) hold *nlabels rows. Every answer is copied out of the
 * segment and checked before use: the GPU process is outside the fault
 * boundary.
 */
RequestResult
GpuIvfpqQueueSearch(const GpuIvfpqKey *key, int d, const float *query, int k, int nprobe,
					const GpuIvfpqKeyRange *range, int64 *labels, double *exact, int *nlabels,
					GpuIvfpqAnswerDists *dists, int *batch, int64 *matched, char *error, Size errlen)
{
	RequestResult result = RES_ERROR;
	int			i = -1;
	const Queue *q = FreeQueueSlot(&i, &result, error, errlen);
	queue::SearchAnswer ans;
	queue::SearchRequest req;
	/* answer_sound's room for the labels (k of them fit the payload twice). */
	int64		scratch[queue::kPayload / (2 * sizeof(int64))];

	if (q == NULL)
		return result;
	if ((Size) d * sizeof(float) > queue::kPayload || (Size) k * 2 * sizeof(int64) > queue::kPayload)
	{
		strlcpy(error, "the search does not fit a slot", errlen);
		return RES_ERROR;
	}

	queue::Slot &slot = q->slot((uint32) i);

	req.kind = (uint32) queue::Kind::Knn;
	req.d = (uint32) d;
	req.k = (uint32) k;
	req.nprobe = (uint32) nprobe;
	req.filtered = range != NULL;
	req.key = QueueKey(key, 0);
	req.key_lo = range != NULL ? range->lo : 0;
	req.key_hi = range != NULL ? range->hi : 0;
	req.log_pos = GpuIvfpqSearchLogPos();
	slot.req = req;
	memcpy(slot.payload, query, sizeof(float) * d);
	if (!SubmitAndWait(q, (uint32) i, error, errlen))
		return RES_SERVICE_GONE;

	/* Copied out, then checked: the segment may change under a reader. */
	ans = slot.ans;
	if (ans.result == (int32) queue::Result::Ok && ans.n <= (uint32) k)
	{
		memcpy(labels, slot.payload, sizeof(int64) * ans.n);
		if (ans.exact == GPU_IVFPQ_DISTS_EXACT || ans.exact == GPU_IVFPQ_DISTS_LOWER)
			memcpy(exact, slot.payload + sizeof(int64) * k, sizeof(double) * ans.n);
	}
	q->release((uint32) i);
	if (!queue::answer_sound(req, ans, ans.n <= (uint32) k ? labels : NULL,
							 ans.exact != GPU_IVFPQ_DISTS_NONE ? exact : NULL, scratch, q->slots()) ||
		(ans.result == (int32) queue::Result::Ok && ans.n > (uint32) k))
	{
		strlcpy(error, "the GPU process answered a malformed search result", errlen);
		return RES_ERROR;
	}
	ans.error[sizeof(ans.error) - 1] = '\0';	/* answer_sound saw it terminated: a backstop */
	if (ans.result != (int32) queue::Result::Ok)
	{
		strlcpy(error, ans.error, errlen);
		return ResultOf(ans.result);
	}
	*nlabels = (int) ans.n;
	*dists = (GpuIvfpqAnswerDists) ans.exact;
	*batch = (int) ans.batch;
	*matched = ans.matched;
	return RES_OK;
}

/*
 * gpu_metric queries through the direct path, on the mirror of key at
 * change count change: buf (GPU_IVFPQ_QUEUE_PAYLOAD bytes) holds the
 * request as GpuMetricSearchLayoutFor(nq, ncps, nradii) lays it out (k > 0:
 * k-NN, 0: range). On RES_OK with *needed 0 the answer's hit offsets and
 * hits are copied back into buf after the request, unchecked (the caller
 * checks them against the index); *needed > 0 says the hits need a request
 * of that many bytes (the service's path).
 */
RequestResult
GpuIvfpqQueueMetricSearch(const GpuIvfpqKey *key, uint64 change, int64 nq, int64 ncps, int nradii, int k,
						  char *buf, uint64 *needed, uint64 *live, uint64 *evaluations, char *error,
						  Size errlen)
{
	RequestResult result = RES_ERROR;
	int			i = -1;
	const Queue *q = FreeQueueSlot(&i, &result, error, errlen);
	GpuMetricSearchLayout l;
	queue::SearchAnswer ans;
	queue::SearchRequest req;

	if (q == NULL)
		return result;
	if (nq < 1 || !gpuivfpq::metric_request_sound(nq, ncps, nradii, k, buf, queue::kPayload, &l))
	{
		strlcpy(error, "the gpu_metric search does not fit a slot", errlen);
		return RES_ERROR;
	}

	queue::Slot &slot = q->slot((uint32) i);

	req.kind = (uint32) queue::Kind::Metric;
	req.k = (uint32) k;
	req.key = QueueKey(key, change);
	req.nq = (uint32) nq;
	req.ncps = (uint64) ncps;
	req.nradii = (uint32) nradii;
	/* No change log: the mirror's key carries the index's change count. */
	req.log_pos = 0;
	slot.req = req;
	memcpy(slot.payload, buf, l.hit_offsets);
	if (!SubmitAndWait(q, (uint32) i, error, errlen))
		return RES_SERVICE_GONE;

	/* Copied out, then checked: the segment may change under a reader. */
	ans = slot.ans;
	if (ans.result == (int32) queue::Result::Ok && ans.needed == 0)
		memcpy(buf + l.hit_offsets, slot.payload + l.hit_offsets, queue::kPayload - l.hit_offsets);
	q->release((uint32) i);
	if (!queue::metric_answer_sound(ans, q->slots()))
	{
		strlcpy(error, "the GPU process answered a malformed search result", errlen);
		return RES_ERROR;
	}
	ans.error[sizeof(ans.error) - 1] = '\0';
	if (ans.result != (int32) queue::Result::Ok)
	{
		strlcpy(error, ans.error, errlen);
		return ResultOf(ans.result);
	}
	*needed = ans.needed;
	*live = ans.live;
	*evaluations = ans.evaluations;
	return RES_OK;
}

/* Adds the counters of a segment's stats to out. */
static void
AddStats(GpuIvfpqQueueStats *out, const queue::Stats &st)
{
	out->batches += st.batches.load();
	out->queries += st.queries.load();
	for (int i = 0; i < GPU_IVFPQ_BATCH_BUCKETS && i < queue::kHistBuckets; i++)
		out->hist[i] += st.hist[i].load();
	out->wait_ns += st.wait_ns.load();
	out->catchup_ns += st.catchup_ns.load();
	out->catchup_searches += st.catchup_searches.load();
	out->gpu_ns += st.gpu_ns.load();
	out->deliver_ns += st.deliver_ns.load();
	out->failed += st.failed.load();
	out->not_found += st.not_found.load();
}

/*
 * The direct path's counters since the server started: those of the
 * segments of earlier services (a restart makes a new one) and this
 * backend's mapping of the current one; false without a current one.
 */
bool
GpuIvfpqQueueReadStats(GpuIvfpqQueueStats *out)
{
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	const Queue *q = BackendQueue();

	SpinLockAcquire(&s->mutex);
	*out = s->queue_past;
	SpinLockRelease(&s->mutex);
	if (q == NULL)
		return false;
	AddStats(out, q->header().stats);
	return true;
}
