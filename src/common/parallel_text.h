// What the parallel workers of a build or a batch function share besides
// their work: the statement's text, so that pg_stat_activity and their
// error reports show it, and their buffer and WAL usage, which the leader
// adds to its own (EXPLAIN (BUFFERS), pg_stat_statements)
// as PostgreSQL's own parallel operations do.
#pragma once

extern "C" {
#include "postgres.h"

#include "access/parallel.h"
}

/* Before InitializeParallelDSM: room for the text under one key. */
extern void GpuIvfpqParallelTextEstimate(ParallelContext *pcxt);
/* After it: the text (if any) stored under key. */
extern void GpuIvfpqParallelTextStore(ParallelContext *pcxt, uint64 key);
/* In a worker: the text under key (if any) made the worker's own. */
extern void GpuIvfpqParallelTextRestore(shm_toc *toc, uint64 key);

/* Before InitializeParallelDSM: room for each worker's buffer and WAL usage under one key. */
extern void GpuIvfpqParallelUsageEstimate(ParallelContext *pcxt);
/* After it: the workers' slots stored under key. */
extern void GpuIvfpqParallelUsageStore(ParallelContext *pcxt, uint64 key);
/* In a worker, before its work: counting starts. */
extern void GpuIvfpqParallelUsageStart(void);
/* In a worker, after its work: what it used into its slot under key. */
extern void GpuIvfpqParallelUsageEnd(shm_toc *toc, uint64 key);
/* In the leader, after WaitForParallelWorkersToFinish: the workers' usage added to its own. */
extern void GpuIvfpqParallelUsageAccum(ParallelContext *pcxt, uint64 key);
