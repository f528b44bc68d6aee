// The batch functions' re-rank from the heap (RaBitQ codes' candidates by
// lower bound, or candidates without exact distances) over parallel
// workers, as a parallel query would use them.
#pragma once

#include "functions/batch_search.h"
#include "gpu_process/answer_dists.h"

/*
 * A participant takes at least this many queries on average: a worker's
 * start costs about what 300-500 queries' re-rank does (measured: 1000
 * queries, 11.8 rows fetched each, 21 ms alone and 24 with two workers;
 * 10,000 queries 0.18 s alone, 0.09-0.11 s with one worker, two cores).
 * Fewer than twice this many queries are re-ranked by the leader alone.
 */
#define GPU_IVFPQ_RERANK_PER_PARTICIPANT 512

/*
 * Queries whose candidates by lower bound one bounded re-rank takes at once
 * (GpuIvfpqRerankBoundedBatch), serially or in a parallel participant: the
 * more queries, the more of their rows are shared and fetched once (in
 * tools/gen_synthetic's 200k x 768 set, the 13 nearest rows of 1024
 * clustered queries are 75% distinct, of 4096 64%), within about 16 MB of
 * state. It depends on want alone, so a serial and a parallel run fetch
 * the same rows.
 */
static inline int64
GpuIvfpqRerankGroup(int want)
{
	/* GpuIvfpqRerankBoundedBatch's state: about 48 bytes per candidate (k <= want). */
	return Max((int64) 1, Min((int64) 1024, (int64) (16 * 1024 * 1024) / ((int64) Max(want, 1) * 48)));
}

/*
 * Re-ranks the nq queries of bs's current chunk (their candidates in
 * bs->labels, bs->exact and bs->counts; dists LOWER or NONE) over up to
 * max_parallel_workers_per_gather workers (and the table's parallel_workers,
 * where set) and the leader, each query's k best into out (nq x k) and
 * their number into nhits (nq). Returns false, having done nothing, where
 * no worker can be had or is worth its start or may run the re-rank (from
 * a parallel worker, a temporary table, an expression index, fewer than
 * 1024 queries, no worker free, no dynamic shared memory): the caller then
 * re-ranks serially. A worker's error is raised here.
 */
extern bool GpuIvfpqRerankParallel(GpuIvfpqBatchSearch *bs, const float *queries, int64 nq,
								   GpuIvfpqAnswerDists dists, GpuIvfpqHit *out, int64 *nhits);
