// The C++ side of the gpu_metric access method: the engine's List of
// Clusters and SSS indexes built or restored from plain arrays, inserts that
// say what they changed, searches into flat results, and query patterns.
// No PostgreSQL types: every object here is created by GpuIvfpqMakeOwned
// (owned by a memory context) and every call that may throw is made inside
// GpuIvfpqGuard (common/guard.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "engine/metric/edit_distance.h"
#include "engine/metric/metric_index.h"

namespace gpuivfpq {
class ListOfClusters;
class SparseSpatialSelection;
}

/* The search methods (the index option `method`, and the metapage's). */
#define GPU_METRIC_METHOD_LC	1
#define GPU_METRIC_METHOD_SSS	2

/*
 * An index's state as its pages hold it (pages.cpp reads it): the
 * words with their removed flags, and the List of Clusters' or the SSS's
 * structure. Object ids are positions in these arrays.
 */
struct GpuMetricStoredState
{
	int			method;
	size_t		n;
	const char *bytes;			/* the words' UTF-8, back to back */
	const uint64_t *offsets;	/* n + 1: word i is bytes[offsets[i], offsets[i + 1]) */
	const uint8_t *removed;		/* n flags, nonzero: removed */
	/* List of Clusters */
	uint32_t	bucket;
	size_t		clusters;
	const uint32_t *centres;	/* clusters, in creation order */
	const uint32_t *radii;		/* clusters */
	const uint32_t *cluster_of; /* n: the cluster each object centres or is in */
	/* SSS */
	double		alpha;
	uint32_t	max_distance;
	size_t		pivots;
	const uint32_t *pivot_ids;	/* pivots, ascending */
	const uint8_t *table;		/* n x pivots, object-major */
};

/* What one insert changed, for the pages to record. */
struct GpuMetricPlacement
{
	uint32_t	id;				/* the new object's id */
	uint32_t	cluster;		/* LC: the cluster it centres or joined */
	bool		new_cluster;	/* LC: it centres a new last cluster */
	bool		radius_grew;	/* LC: the last cluster's radius grew to radius */
	uint32_t	radius;
	const uint8_t *row;			/* SSS: its pivot distances (valid until the next insert) */
};

/* A List of Clusters or an SSS index over UTF-8 words. */
class GpuMetricEngine
{
public:
	/* Builds over n words (ids in the order given); SSS: at most max_pivots pivots. */
	GpuMetricEngine(int method, const char *bytes, const uint64_t *offsets, size_t n,
					uint32_t bucket, double alpha, size_t max_pivots, int threads);
	/* Restores a stored index (an inconsistent state throws InvalidArgument). */
	explicit GpuMetricEngine(const GpuMetricStoredState &state);
	~GpuMetricEngine();

	int			method() const { return method_; }
	const gpuivfpq::MetricIndex &index() const { return *index_; }
	const gpuivfpq::ListOfClusters *lc() const { return lc_; }
	const gpuivfpq::SparseSpatialSelection *sss() const { return sss_; }

	/* After a build: each object's cluster (List of Clusters only). */
	const uint32_t *cluster_of() const { return cluster_of_.data(); }

	/* Inserts a word by the engine's rule and says where it went. */
	void		insert(const uint32_t *cps, size_t n, GpuMetricPlacement *placement);
	/*
	 * Inserts a word as an object record of the pages says another insert
	 * placed it (LC: its cluster; SSS: its pivot distances), on a copy in
	 * the state that insert found: the copy becomes the index's state after
	 * it, without the insert rule's distances (one at most). A placement no
	 * insert makes throws InvalidArgument. Returns the id.
	 */
	uint32_t	insert_stored(const uint32_t *cps, size_t n, uint32_t cluster, const uint8_t *row);
	/* Marks an object removed. */
	void		remove(uint32_t id) { index_->remove(id); }

private:
	int			method_;
	std::unique_ptr<gpuivfpq::MetricIndex> index_;
	gpuivfpq::ListOfClusters *lc_ = nullptr;
	gpuivfpq::SparseSpatialSelection *sss_ = nullptr;
	std::vector<uint32_t> cluster_of_;
};

/*
 * The answers of nq queries (code points back to back, query i being
 * cps[offsets[i], offsets[i + 1])) searched as one batch on `threads`
 * threads: the param nearest objects (knn), or every object within radius
 * radii[i] (param for all when radii is null). Query i's hits are
 * hits()[offsets()[i], offsets()[i + 1]), sorted by (distance, id).
 */
class GpuMetricResult
{
public:
	GpuMetricResult(const gpuivfpq::MetricIndex &index, bool knn, const uint32_t *cps,
					const uint64_t *offsets, size_t nq, uint32_t param, const uint32_t *radii,
					int threads);

	const uint64_t *offsets() const { return result_.offsets.data(); }
	const gpuivfpq::MetricHit *hits() const { return result_.hits.data(); }
	/* Distances computed for all the queries. */
	uint64_t	evaluations() const { return evaluations_; }

private:
	gpuivfpq::MetricBatchResult result_;
	uint64_t	evaluations_ = 0;
};

/* A query preprocessed once for many distances. */
class GpuMetricPattern
{
public:
	GpuMetricPattern(const uint32_t *cps, size_t n);

	/* Exact distance to a UTF-8 text (invalid UTF-8 throws InvalidArgument). */
	uint32_t	distance_utf8(const char *utf8, size_t len) const;
	/* min(distance, k + 1) to a UTF-8 text. */
	uint32_t	within_utf8(const char *utf8, size_t len, uint32_t k) const;
	/* d(query, object) of n objects of index, or min(d, bound + 1). */
	void		objects(const gpuivfpq::MetricIndex &index, const uint32_t *ids, size_t n,
						uint32_t bound, uint32_t *out) const;

private:
	std::vector<uint32_t> cps_;
	gpuivfpq::EditPattern pattern_;
};

/*
 * Decodes UTF-8 into code points: out has room for len of them; returns
 * how many. Invalid UTF-8, or a word past the engine's longest, throws
 * InvalidArgument.
 */
extern size_t GpuMetricDecode(const char *utf8, size_t len, uint32_t *out);
