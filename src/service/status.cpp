// What the GPU service reports: gpu_ivfpq_status() (state, device,
// counters, memory) and gpu_ivfpq_mirrors() (the indexes in GPU memory).
#include "service/shmem.h"

extern "C" {
#include "funcapi.h"
#include "utils/array.h"
#include "catalog/pg_authid.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "catalog/pg_type.h"

PG_FUNCTION_INFO_V1(gpu_ivfpq_status);
PG_FUNCTION_INFO_V1(gpu_ivfpq_mirrors);
PG_FUNCTION_INFO_V1(gpu_ivfpq_devices);
}

/* Whether the user may see the service's state for every database (as pg_stat_activity's details). */
static bool
SeesAllDatabases(void)
{
	return has_privs_of_role(GetUserId(), ROLE_PG_READ_ALL_STATS);
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
		case SERVICE_RESTARTING:
			return "restarting the GPU process (scans use the CPU)";
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
	Datum		values[27];
	bool		nulls[27];
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "gpu_ivfpq_status must return a composite type");
	memset(nulls, 0, sizeof(nulls));
	if (s == NULL)
	{
		values[0] = CStringGetTextDatum("not loaded (add gpu_ivfpq to shared_preload_libraries)");
		for (int i = 1; i < 27; i++)
			nulls[i] = true;
	}
	else
	{
		GpuIvfpqServiceShared copy;
		GpuIvfpqQueueStats q;
		uint64		batches;
		uint64		gpu;
		Datum		hist[GPU_IVFPQ_BATCH_BUCKETS];

		/* Scans go through the direct path, batch calls and gpu_metric through the service. */
		(void) GpuIvfpqQueueReadStats(&q);
		batches = pg_atomic_read_u64(&s->batches) + q.batches;
		gpu = pg_atomic_read_u64(&s->queries_gpu) + q.queries;
		SpinLockAcquire(&s->mutex);
		memcpy(&copy, s, offsetof(GpuIvfpqServiceShared, queries_gpu));
		SpinLockRelease(&s->mutex);
		for (int i = 0; i < GPU_IVFPQ_BATCH_BUCKETS; i++)
			hist[i] = Int64GetDatum((int64) (pg_atomic_read_u64(&s->batch_hist[i]) + q.hist[i]));

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
		/* Errors can name objects of other databases: pg_read_all_stats (pg_monitor) only. */
		nulls[14] = copy.last_error[0] == '\0' || !SeesAllDatabases();
		/* The GPU process: how it last died names no object, so all may see it. */
		values[15] = Int32GetDatum(copy.gpu_pid);
		nulls[15] = copy.gpu_pid == 0;
		values[16] = Int32GetDatum(copy.gpu_restarts);
		values[17] = CStringGetTextDatum(copy.last_gpu_exit);
		nulls[17] = copy.last_gpu_exit[0] == '\0';
		values[18] = TimestampTzGetDatum(copy.last_gpu_exit_at);
		nulls[18] = copy.last_gpu_exit[0] == '\0';
		/*
		 * The direct path's stages, in microseconds: per queued search its
		 * wait from queueing to its batch's start, and of that the part it
		 * waited for the change log; per batch the GPU's work and writing
		 * the answers and waking their owners.
		 */
		{
			uint64		searches = q.queries + q.failed + q.not_found;

			values[19] = Int64GetDatum((int64) searches);
			values[20] = Float8GetDatum(searches > 0 ? q.wait_ns / 1000.0 / searches : 0.0);
			values[21] = Float8GetDatum(searches > 0 ? q.catchup_ns / 1000.0 / searches : 0.0);
			values[22] = Float8GetDatum(q.batches > 0 ? q.gpu_ns / 1000.0 / q.batches : 0.0);
			values[23] = Float8GetDatum(q.batches > 0 ? q.deliver_ns / 1000.0 / q.batches : 0.0);
			nulls[20] = nulls[21] = searches == 0;
			nulls[22] = nulls[23] = q.batches == 0;
		}
		/* Appends of logged entries: means over the append calls, in microseconds. */
		{
			uint64		calls = pg_atomic_read_u64(&s->append_calls);

			values[24] = Int64GetDatum((int64) calls);
			values[25] = Float8GetDatum(calls > 0 ? pg_atomic_read_u64(&s->time_append_ns) / 1000.0 / calls : 0.0);
			values[26] = Float8GetDatum(calls > 0 ? pg_atomic_read_u64(&s->time_append_device_ns) / 1000.0 / calls : 0.0);
			nulls[25] = nulls[26] = calls == 0;
		}
	}
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(tupdesc, values, nulls)));
}

/* gpu_ivfpq_mirrors(): the indexes mirrored in GPU memory, as last published. */
Datum
gpu_ivfpq_mirrors(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	GpuIvfpqMirrorStatus *mirrors = (GpuIvfpqMirrorStatus *) palloc(sizeof(GpuIvfpqMirrorStatus) * GPU_IVFPQ_STATUS_MIRRORS);
	int			ordinals[GPU_IVFPQ_STATUS_DEVICES];
	int			n = 0;
	int			ndevices = 0;

	InitMaterializedSRF(fcinfo, 0);
	if (s == NULL)
		PG_RETURN_VOID();
	SpinLockAcquire(&s->mutex);
	n = s->nmirrors;
	memcpy(mirrors, s->mirrors, sizeof(GpuIvfpqMirrorStatus) * n);
	ndevices = s->ndevices;
	for (int i = 0; i < ndevices; i++)
		ordinals[i] = s->devices[i].device;
	SpinLockRelease(&s->mutex);
	for (int i = 0; i < n; i++)
	{
		/* Other databases' mirrors: for pg_read_all_stats (pg_monitor) only. */
		if (mirrors[i].key.db != MyDatabaseId && !SeesAllDatabases())
			continue;
		Datum		values[12];
		bool		nulls[12];
		Datum		devs[GPU_IVFPQ_STATUS_DEVICES];
		int			ndevs = 0;

		memset(nulls, 0, sizeof(nulls));
		values[0] = ObjectIdGetDatum(mirrors[i].key.db);
		values[1] = ObjectIdGetDatum(mirrors[i].key.index);
		values[2] = ObjectIdGetDatum(mirrors[i].key.relnode);
		values[3] = Int64GetDatum((int64) mirrors[i].key.build);
		values[4] = Int64GetDatum(mirrors[i].entries);
		values[5] = Float8GetDatum((double) mirrors[i].bytes / (1024.0 * 1024.0));
		values[6] = Int64GetDatum(mirrors[i].queries);
		/* false: the vectors did not fit the budget; scans re-rank from the heap. */
		values[7] = BoolGetDatum(mirrors[i].vectors);
		/* The index has a filter column: the GPU applies its filters. */
		values[8] = BoolGetDatum(mirrors[i].filter_keys);
		/* Over several GPUs: a copy on each, or the lists spread over them. */
		values[9] = CStringGetTextDatum(mirrors[i].placement == GPU_IVFPQ_PLACEMENT_SHARD ? "shard" : "replicate");
		for (int j = 0; j < ndevices; j++)
			if (mirrors[i].device_mask & (1u << j))
				devs[ndevs++] = Int32GetDatum(ordinals[j]);
		values[10] = PointerGetDatum(construct_array(devs, ndevs, INT4OID, sizeof(int32), true, TYPALIGN_INT));
		/* A gpu_metric mirror is of one change count of its index: a new one loads after a change. */
		values[11] = CStringGetTextDatum(mirrors[i].metric ? "gpu_metric" : "gpu_ivfpq");
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	PG_RETURN_VOID();
}

/*
 * gpu_ivfpq_devices(): the GPUs of the GPU process (none while it is not
 * running), with the memory mirrors hold on each and the calls each ran.
 */
Datum
gpu_ivfpq_devices(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	GpuIvfpqServiceShared *s = gpu_ivfpq_service;
	GpuIvfpqDeviceStatus devices[GPU_IVFPQ_STATUS_DEVICES];
	GpuIvfpqMirrorStatus *mirrors = (GpuIvfpqMirrorStatus *) palloc(sizeof(GpuIvfpqMirrorStatus) * GPU_IVFPQ_STATUS_MIRRORS);
	int			n = 0;
	int			nmirrors = 0;

	InitMaterializedSRF(fcinfo, 0);
	if (s == NULL)
		PG_RETURN_VOID();
	SpinLockAcquire(&s->mutex);
	n = s->ndevices;
	memcpy(devices, s->devices, sizeof(GpuIvfpqDeviceStatus) * n);
	nmirrors = s->nmirrors;
	memcpy(mirrors, s->mirrors, sizeof(GpuIvfpqMirrorStatus) * nmirrors);
	SpinLockRelease(&s->mutex);
	for (int i = 0; i < n; i++)
	{
		Datum		values[9];
		bool		nulls[9];
		int			held = 0;

		for (int j = 0; j < nmirrors; j++)
			held += (mirrors[j].device_mask & (1u << i)) != 0;
		memset(nulls, 0, sizeof(nulls));
		values[0] = Int32GetDatum(devices[i].device);
		values[1] = CStringGetTextDatum(devices[i].description);
		values[2] = BoolGetDatum(devices[i].alive);
		values[3] = Float8GetDatum((double) devices[i].memory_budget / (1024.0 * 1024.0));
		values[4] = Float8GetDatum((double) devices[i].memory_used / (1024.0 * 1024.0));
		values[5] = Int32GetDatum(held);
		values[6] = Int64GetDatum(devices[i].queries);
		values[7] = Int64GetDatum(devices[i].batches);
		values[8] = Float8GetDatum((double) devices[i].busy_us / 1000.0);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	PG_RETURN_VOID();
}
