// What the distances after a search answer's labels are, in every format
// that carries one (the GPU process's Search reply, the service's request
// slot, the direct path's answer): a protocol value shared by the backends
// (C++ under PostgreSQL) and the GPU process, so it includes nothing.
#pragma once

typedef enum GpuIvfpqAnswerDists
{
	/* labels only, in the codes' order */
	GPU_IVFPQ_DISTS_NONE = 0,
	/* exact distances (double), rows in exact order: re-ranked on the device */
	GPU_IVFPQ_DISTS_EXACT = 1,
	/*
	 * lower bounds of the exact distances, in the metric's ranking units
	 * (squared for L2), ascending: a mirror with RaBitQ codes. The backend
	 * re-ranks from the heap in that order, and stops where a bound passes
	 * the k-th exact distance.
	 */
	GPU_IVFPQ_DISTS_LOWER = 2
} GpuIvfpqAnswerDists;
