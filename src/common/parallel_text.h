// The statement's text for the parallel workers of a build or a batch
// function, so that pg_stat_activity and their error reports show it.
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
