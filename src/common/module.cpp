// The module's entry point: _PG_init defines the settings (GUCs), the
// index options, and, when preloaded, the GPU service.
#include "am/am.h"
#include "metric/am.h"
#include "common/guard.h"
#include "service/service.h"
#include "service/wal_announce.h"

extern "C" {
PG_MODULE_MAGIC;
void		_PG_init(void);
}

int			gpu_ivfpq_probes = 10;
int			gpu_ivfpq_rerank = 100;
int			gpu_ivfpq_max_scan_tuples = 20000;
bool		gpu_ivfpq_strict_order = true;
int			gpu_ivfpq_table_memory_mb = 32;
int			gpu_ivfpq_model_cache_memory_mb = 256;
int			gpu_ivfpq_device = GPU_IVFPQ_DEVICE_AUTO;
int			gpu_ivfpq_gpu_memory_budget_kb = 0;
int			gpu_ivfpq_batch_size = 256;
int			gpu_ivfpq_batch_wait_us = 0;
int			gpu_ivfpq_gpu_poll_us = 0;
int			gpu_ivfpq_gpu_timeout_s = 60;
bool		gpu_ivfpq_service_emulate_gpu = false;
int			gpu_ivfpq_service_emulate_devices = 1;
char	   *gpu_ivfpq_device_list = NULL;
int			gpu_ivfpq_placement = GPU_IVFPQ_PLACEMENT_AUTO;
int			gpu_ivfpq_batches_in_flight = 0;

/* gpu_ivfpq.devices: comma-separated device numbers, or empty. */
static bool
CheckDevicesList(char **newval, void **extra, GucSource source)
{
	const char *p = *newval;
	int			count = 0;
	int			seen[16];

	if (p == NULL || *p == '\0')
		return true;
	while (*p != '\0')
	{
		int			digits = 0;
		int			device = 0;

		while (*p == ' ')
			p++;
		while (*p >= '0' && *p <= '9' && digits <= 4)
			device = device * 10 + (*p++ - '0'), digits++;
		while (*p == ' ')
			p++;
		/* A comma must be followed by a number ("0," is not a list). */
		if (digits == 0 || digits > 4 || count >= 16 || (*p != ',' && *p != '\0') ||
			(*p == ',' && p[1] == '\0'))
		{
			GUC_check_errdetail("\"%s\" is not a list of up to 16 device numbers such as \"0,1\".", *newval);
			return false;
		}
		/* As the GPU process takes them (CUDA numbers devices from 0, far below this). */
		if (device > 1023)
		{
			GUC_check_errdetail("Device numbers go up to 1023, \"%s\" names %d.", *newval, device);
			return false;
		}
		for (int i = 0; i < count; i++)
			if (seen[i] == device)
			{
				GUC_check_errdetail("\"%s\" names device %d twice.", *newval, device);
				return false;
			}
		seen[count++] = device;
		if (*p == ',')
			p++;
	}
	return true;
}

static const struct config_enum_entry placement_options[] = {
	{"auto", GPU_IVFPQ_PLACEMENT_AUTO, false},
	{"replicate", GPU_IVFPQ_PLACEMENT_REPLICATE, false},
	{"shard", GPU_IVFPQ_PLACEMENT_SHARD, false},
	{NULL, 0, false}
};

static const struct config_enum_entry device_options[] = {
	{"auto", GPU_IVFPQ_DEVICE_AUTO, false},
	{"gpu", GPU_IVFPQ_DEVICE_GPU, false},
	{"cpu", GPU_IVFPQ_DEVICE_CPU, false},
	{NULL, 0, false}
};

/* Registers the settings, the index options and (when preloaded) the GPU service. */
void
_PG_init(void)
{
	GpuIvfpqRegisterOptions();
	GpuMetricRegisterOptions();
	GpuIvfpqInstallInterruptPoll();

	DefineCustomIntVariable("gpu_ivfpq.probes", "Number of inverted lists probed by a scan.",
							"More probes: higher recall, slower queries.",
							&gpu_ivfpq_probes, 10, 1, GPU_IVFPQ_MAX_LISTS, PGC_USERSET, 0,
							NULL, NULL, NULL);
	DefineCustomIntVariable("gpu_ivfpq.rerank", "Number of ADC candidates re-ranked with exact distances.",
							"Rows come back in exact distance order among the re-ranked candidates.",
							&gpu_ivfpq_rerank, 100, 1, 1000000, PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("gpu_ivfpq.max_scan_tuples",
							"Most rows one scan re-ranks when it continues past the first batch.",
							"Bounds the work of a filtered query that needs more rows.",
							&gpu_ivfpq_max_scan_tuples, 20000, 1, INT_MAX, PGC_USERSET, 0,
							NULL, NULL, NULL);
	DefineCustomBoolVariable("gpu_ivfpq.strict_order",
							 "Whether a scan that continues past its first candidates keeps exact distance order.",
							 "on: a row found only by a wider round that sorts before a row already returned is skipped; off: it is returned late, out of order.",
							 &gpu_ivfpq_strict_order, true, PGC_USERSET, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("gpu_ivfpq.table_memory", "Memory per index for precomputed lookup-table terms.",
							"Term 1 of the IVFADC decomposition takes lists * m * 256 floats; above this budget tables are computed per list at query time.",
							&gpu_ivfpq_table_memory_mb, 32, 0, 65536, PGC_USERSET, GUC_UNIT_MB,
							NULL, NULL, NULL);
	DefineCustomIntVariable("gpu_ivfpq.model_cache_memory", "Memory per backend for the trained quantizers of the indexes it uses.",
							"Centroids, codebooks and lookup-table terms of up to 64 indexes; past this budget the least recently used are dropped (read again from the index when needed).",
							&gpu_ivfpq_model_cache_memory_mb, 256, 1, 65536, PGC_USERSET, GUC_UNIT_MB,
							NULL, NULL, NULL);
	DefineCustomEnumVariable("gpu_ivfpq.device", "Where index scans and builds run: auto, gpu or cpu.",
							 "auto: the GPU service when it can serve, else the CPU engine; gpu: the GPU or an error; cpu: never the GPU.",
							 &gpu_ivfpq_device, GPU_IVFPQ_DEVICE_AUTO, device_options, PGC_USERSET, 0,
							 NULL, NULL, NULL);
	DefineCustomStringVariable("gpu_ivfpq.devices",
							   "The GPUs the service uses, as CUDA device numbers (\"0,1\"); empty: every visible GPU.",
							   "CUDA_VISIBLE_DEVICES of the server decides which GPUs are visible and their numbers. A change restarts the GPU process; mirrors reload on the GPUs listed.",
							   &gpu_ivfpq_device_list, "", PGC_SIGHUP, 0, CheckDevicesList, NULL, NULL);
	DefineCustomEnumVariable("gpu_ivfpq.placement",
							 "How a mirror loaded by this session is placed over several GPUs: auto, replicate or shard.",
							 "auto: the index's placement option, else a copy per GPU when one fits a GPU's budget, else the lists spread over the GPUs.",
							 &gpu_ivfpq_placement, GPU_IVFPQ_PLACEMENT_AUTO, placement_options, PGC_SUSET, 0,
							 NULL, NULL, NULL);
	DefineCustomIntVariable("gpu_ivfpq.gpu_memory_budget",
							"GPU memory the service may use for index mirrors on each GPU (0 = three quarters of each GPU).",
							"Least recently used mirrors are evicted to stay within it.",
							&gpu_ivfpq_gpu_memory_budget_kb, 0, 0, INT_MAX, PGC_SIGHUP, GUC_UNIT_KB,
							NULL, NULL, NULL);
	DefineCustomIntVariable("gpu_ivfpq.batch_size", "Most searches the GPU service merges into one batch.",
							NULL, &gpu_ivfpq_batch_size, 256, 1, 4096, PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("gpu_ivfpq.batch_wait",
							"How long (microseconds) the GPU service waits for more searches to join a batch.",
							"0: a batch holds what arrived while the previous one ran.",
							&gpu_ivfpq_batch_wait_us, 0, 0, 100000, PGC_SIGHUP, 0,
							NULL, NULL, NULL);
	DefineCustomIntVariable("gpu_ivfpq.gpu_poll",
							"How long (microseconds) the GPU process keeps polling for searches after a batch before it sleeps.",
							"Polling takes the next search at once and spares backends a wake-up call; it keeps a CPU core busy while searches keep coming. 0: sleep at once.",
							&gpu_ivfpq_gpu_poll_us, 0, 0, 100000, PGC_SIGHUP, 0,
							NULL, NULL, NULL);
	DefineCustomIntVariable("gpu_ivfpq.batches_in_flight",
							"How many scan batches the GPU process runs at once (0 = one per GPU).",
							"Each batch has a serving thread of the GPU process: on several GPUs they run side by side, each on the least busy replica; on one GPU a batch is queued behind the one running, taken when that one is about to end.",
							&gpu_ivfpq_batches_in_flight, 0, 0, 8, PGC_SIGHUP, 0, NULL, NULL, NULL);
	DefineCustomIntVariable("gpu_ivfpq.gpu_timeout",
							"How long the GPU service waits for one GPU call before it restarts the GPU process (0 = no limit).",
							"A hung GPU or driver costs at most this long; scans use the CPU until the process is back.",
							&gpu_ivfpq_gpu_timeout_s, 60, 0, 86400, PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);
	GpuIvfpqServiceInstallHooks();
	if (process_shared_preload_libraries_in_progress)
	{
		/* A server-start setting: defined only while preloading, as PGC_POSTMASTER requires. */
		DefineCustomBoolVariable("gpu_ivfpq.service_emulate_gpu",
								 "Testing only: the service serves requests with a CPU emulation of the GPU.",
								 "Exercises the request path, batching and mirror coherence on machines without a GPU.",
								 &gpu_ivfpq_service_emulate_gpu, false, PGC_POSTMASTER, 0, NULL, NULL, NULL);
		DefineCustomIntVariable("gpu_ivfpq.service_emulate_devices",
								"Testing only: how many emulated GPUs the service serves with (with service_emulate_gpu).",
								"Exercises replicas, shards and the failure of one GPU on machines without a GPU.",
								&gpu_ivfpq_service_emulate_devices, 1, 1, 16, PGC_POSTMASTER, 0, NULL, NULL, NULL);
		GpuIvfpqServiceRegister();
		/* Also only now: WAL records that keep standbys' GPU mirrors coherent. */
		GpuIvfpqWalRegister();
	}
	/* Last: reserves the gpu_ivfpq. prefix once every setting is defined. */
	MarkGUCPrefixReserved("gpu_ivfpq");
}
