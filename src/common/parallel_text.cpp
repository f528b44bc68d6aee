// The statement's text and the buffer and WAL usage of parallel workers
// (parallel_text.h).
#include "common/parallel_text.h"

extern "C" {
#include "executor/instrument.h"
#include "pgstat.h"
#include "storage/shm_toc.h"
#include "tcop/tcopprot.h"
}

void
GpuIvfpqParallelTextEstimate(ParallelContext *pcxt)
{
	if (debug_query_string == NULL)
		return;
	shm_toc_estimate_chunk(&pcxt->estimator, strlen(debug_query_string) + 1);
	shm_toc_estimate_keys(&pcxt->estimator, 1);
}

void
GpuIvfpqParallelTextStore(ParallelContext *pcxt, uint64 key)
{
	Size		bytes;
	char	   *text;

	if (debug_query_string == NULL)
		return;
	bytes = strlen(debug_query_string) + 1;
	text = (char *) shm_toc_allocate(pcxt->toc, bytes);
	memcpy(text, debug_query_string, bytes);
	shm_toc_insert(pcxt->toc, key, text);
}

void
GpuIvfpqParallelTextRestore(shm_toc *toc, uint64 key)
{
	char	   *text = (char *) shm_toc_lookup(toc, key, true);

	if (text == NULL)
		return;
	debug_query_string = text;
	pgstat_report_activity(STATE_RUNNING, debug_query_string);
}

/* A worker's slot: its buffer usage, then its WAL usage. */
typedef struct ParallelUsage
{
	BufferUsage buffers;
	WalUsage	wal;
} ParallelUsage;

void
GpuIvfpqParallelUsageEstimate(ParallelContext *pcxt)
{
	shm_toc_estimate_chunk(&pcxt->estimator, mul_size(sizeof(ParallelUsage), pcxt->nworkers));
	shm_toc_estimate_keys(&pcxt->estimator, 1);
}

void
GpuIvfpqParallelUsageStore(ParallelContext *pcxt, uint64 key)
{
	Size		bytes = mul_size(sizeof(ParallelUsage), pcxt->nworkers);
	void	   *slots = shm_toc_allocate(pcxt->toc, bytes);

	memset(slots, 0, bytes);
	shm_toc_insert(pcxt->toc, key, slots);
}

void
GpuIvfpqParallelUsageStart(void)
{
	InstrStartParallelQuery();
}

void
GpuIvfpqParallelUsageEnd(shm_toc *toc, uint64 key)
{
	ParallelUsage *slots = (ParallelUsage *) shm_toc_lookup(toc, key, false);

	InstrEndParallelQuery(&slots[ParallelWorkerNumber].buffers, &slots[ParallelWorkerNumber].wal);
}

void
GpuIvfpqParallelUsageAccum(ParallelContext *pcxt, uint64 key)
{
	ParallelUsage *slots = (ParallelUsage *) shm_toc_lookup(pcxt->toc, key, false);

	for (int i = 0; i < pcxt->nworkers_launched; i++)
		InstrAccumParallelQuery(&slots[i].buffers, &slots[i].wal);
}
