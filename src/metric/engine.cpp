// The gpu_metric access method's C++ side (engine.h): engine indexes
// built and restored from plain arrays, inserts, batches and patterns.
#include "metric/engine.h"

#include <algorithm>
#include <string>

#include "engine/error.h"
#include "engine/interrupt.h"
#include "engine/metric/lc_index.h"
#include "engine/metric/sss_index.h"

using gpuivfpq::Error;
using gpuivfpq::ErrorKind;
using gpuivfpq::ListOfClusters;
using gpuivfpq::MetricHit;
using gpuivfpq::SparseSpatialSelection;
using gpuivfpq::WordList;
using gpuivfpq::WordView;

GpuMetricEngine::GpuMetricEngine(int method, const char *bytes, const uint64_t *offsets, size_t n,
								 uint32_t bucket, double alpha, size_t max_pivots, int threads)
	: method_(method)
{
	WordList	words = WordList::from_utf8(bytes, offsets, n);

	if (method == GPU_METRIC_METHOD_LC)
	{
		auto		lc = std::make_unique<ListOfClusters>(std::move(words), bucket, threads);

		cluster_of_ = lc->cluster_assignment();
		lc_ = lc.get();
		index_ = std::move(lc);
	}
	else if (method == GPU_METRIC_METHOD_SSS)
	{
		auto		sss = std::make_unique<SparseSpatialSelection>(std::move(words), alpha, threads, 0,
																   max_pivots);

		sss_ = sss.get();
		index_ = std::move(sss);
	}
	else
		throw Error(ErrorKind::InvalidArgument, "unknown metric index method " + std::to_string(method));
}

GpuMetricEngine::GpuMetricEngine(const GpuMetricStoredState &s)
	: method_(s.method)
{
	WordList	words = WordList::from_utf8(s.bytes, s.offsets, s.n);
	std::vector<uint8_t> removed(s.removed, s.removed + s.n);

	if (s.method == GPU_METRIC_METHOD_LC)
	{
		auto		lc = ListOfClusters::restore(std::move(words), std::move(removed), s.bucket,
												 std::vector<uint32_t>(s.centres, s.centres + s.clusters),
												 std::vector<uint32_t>(s.radii, s.radii + s.clusters),
												 std::vector<uint32_t>(s.cluster_of, s.cluster_of + s.n));

		lc_ = lc.get();
		index_ = std::move(lc);
	}
	else if (s.method == GPU_METRIC_METHOD_SSS)
	{
		auto		sss = SparseSpatialSelection::restore(std::move(words), std::move(removed), s.alpha,
														  s.max_distance,
														  std::vector<uint32_t>(s.pivot_ids, s.pivot_ids + s.pivots),
														  std::vector<uint8_t>(s.table, s.table + s.n * s.pivots));

		sss_ = sss.get();
		index_ = std::move(sss);
	}
	else
		throw Error(ErrorKind::InvalidArgument, "unknown metric index method " + std::to_string(s.method));
}

GpuMetricEngine::~GpuMetricEngine() = default;

void
GpuMetricEngine::insert(const uint32_t *cps, size_t n, GpuMetricPlacement *placement)
{
	const WordView word{cps, n};

	*placement = GpuMetricPlacement{};
	if (lc_)
	{
		/*
		 * The engine's rule decides where the word goes: the first cluster
		 * that covers it, the last one (its radius maybe grown) or a new
		 * last cluster it centres. The pages record that placement, which
		 * is also what a mirror of the index takes.
		 */
		const size_t clusters = lc_->clusters();
		const uint32_t last_radius = clusters > 0 ? lc_->radius(clusters - 1) : 0;
		const gpuivfpq::LcPlacement p = lc_->placement(word);

		placement->id = lc_->insert_at(word, p);
		placement->cluster = p.cluster;
		placement->new_cluster = p.cluster == clusters;
		placement->radius = lc_->radius(p.cluster);
		placement->radius_grew = !placement->new_cluster && p.cluster + 1 == clusters &&
			placement->radius != last_radius;
	}
	else
	{
		placement->id = index_->insert(word);
		placement->row = sss_->table() + size_t(placement->id) * sss_->pivots();
	}
}

uint32_t
GpuMetricEngine::insert_stored(const uint32_t *cps, size_t n, uint32_t cluster, const uint8_t *row)
{
	const WordView word{cps, n};

	if (lc_)
	{
		gpuivfpq::LcPlacement p;

		p.cluster = cluster;
		p.radius = 0;
		if (cluster < lc_->clusters())
		{
			/* Only the last cluster's radius grows (to the word, if farther). */
			p.radius = lc_->radius(cluster);
			if (size_t(cluster) + 1 == lc_->clusters())
				p.radius = std::max(p.radius, gpuivfpq::edit_distance(lc_->word(lc_->centre(cluster)), word));
		}
		return lc_->insert_at(word, p);
	}
	return sss_->insert_at(word, row);
}

GpuMetricResult::GpuMetricResult(const gpuivfpq::MetricIndex &index, bool knn, const uint32_t *cps,
								 const uint64_t *offsets, size_t nq, uint32_t param, const uint32_t *radii,
								 int threads)
{
	WordList	queries;

	for (size_t i = 0; i < nq; i++)
		queries.push_back(WordView{cps + offsets[i], size_t(offsets[i + 1] - offsets[i])});
	if (knn)
		result_ = gpuivfpq::knn_search_batch(index, queries, param, threads);
	else if (radii != nullptr)
		result_ = gpuivfpq::range_search_batch(index, queries, std::vector<uint32_t>(radii, radii + nq),
											   threads);
	else
		result_ = gpuivfpq::range_search_batch(index, queries, std::vector<uint32_t>{param}, threads);
	for (const auto &s : result_.stats)
		evaluations_ += s.distance_evaluations;
	/* An empty batch: offsets() still points at one 0. */
	if (result_.offsets.empty())
		result_.offsets.push_back(0);
}

GpuMetricPattern::GpuMetricPattern(const uint32_t *cps, size_t n)
	: cps_(cps, cps + n), pattern_(cps_.data(), cps_.size())
{
}

/* The code points of a UTF-8 text, in a buffer reused from call to call. */
static const std::vector<uint32_t> &
DecodeScratch(const char *utf8, size_t len)
{
	static std::vector<uint32_t> scratch;

	scratch.clear();
	gpuivfpq::utf8_decode(utf8, len, scratch);
	gpuivfpq::check_word_length(scratch.size());
	return scratch;
}

uint32_t
GpuMetricPattern::distance_utf8(const char *utf8, size_t len) const
{
	const auto &cps = DecodeScratch(utf8, len);

	return pattern_.distance(cps.data(), cps.size());
}

uint32_t
GpuMetricPattern::within_utf8(const char *utf8, size_t len, uint32_t k) const
{
	const auto &cps = DecodeScratch(utf8, len);

	return pattern_.within(cps.data(), cps.size(), k);
}

void
GpuMetricPattern::objects(const gpuivfpq::MetricIndex &index, const uint32_t *ids, size_t n,
						  uint32_t bound, uint32_t *out) const
{
	for (size_t i = 0; i < n; i++)
	{
		gpuivfpq::check_interrupt_every(i);
		out[i] = bound == UINT32_MAX ? pattern_.distance(index.word(ids[i]))
			: pattern_.within(index.word(ids[i]), bound);
	}
}

size_t
GpuMetricDecode(const char *utf8, size_t len, uint32_t *out)
{
	const auto &cps = DecodeScratch(utf8, len);

	std::copy(cps.begin(), cps.end(), out);
	return cps.size();
}
