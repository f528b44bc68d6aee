// The word store, the shared index bookkeeping (insert, remove), brute force
// and the parallel batches of metric-space search.
#include "metric_index.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "engine/error.h"
#include "engine/interrupt.h"
#include "engine/parallel.h"

namespace gpuivfpq {

namespace {

// Throws unless word `index` of len code points fits kMaxWordCodePoints.
void check_list_word(size_t index, size_t len)
{
    if (len <= kMaxWordCodePoints)
        return;
    const std::string what = "word " + std::to_string(index);
    check_word_length(len, what.c_str());
}

}  // namespace

WordList WordList::from_utf8(const char* bytes, const uint64_t* offsets, size_t n)
{
    WordList list;
    list.offsets_.reserve(n + 1);
    if (n > 0)
        list.cps_.reserve(size_t(offsets[n] >= offsets[0] ? offsets[n] - offsets[0] : 0));
    for (size_t i = 0; i < n; i++) {
        if (offsets[i + 1] < offsets[i]) {
            char msg[200];
            std::snprintf(msg, sizeof msg,
                          "word offsets decrease at word %zu (%llu, then %llu); offsets must be "
                          "nondecreasing",
                          i, (unsigned long long)offsets[i], (unsigned long long)offsets[i + 1]);
            throw Error(ErrorKind::InvalidArgument, msg);
        }
        try {
            utf8_decode(bytes + offsets[i], size_t(offsets[i + 1] - offsets[i]), list.cps_);
        } catch (const Error& e) {
            throw Error(e.kind(), "word " + std::to_string(i) + ": " + e.what());
        }
        check_list_word(i, list.cps_.size() - list.offsets_.back());
        list.offsets_.push_back(list.cps_.size());
    }
    return list;
}

void WordList::push_back(WordView w)
{
    check_list_word(size(), w.size);
    const bool aliases =
        !cps_.empty() && w.data >= cps_.data() && w.data < cps_.data() + cps_.size();
    if (aliases) {
        // Growing cps_ could move the very symbols being copied.
        const std::vector<uint32_t> copy(w.data, w.data + w.size);
        cps_.insert(cps_.end(), copy.begin(), copy.end());
    } else {
        cps_.insert(cps_.end(), w.data, w.data + w.size);
    }
    offsets_.push_back(cps_.size());
}

void WordList::push_back_utf8(std::string_view text)
{
    const size_t before = cps_.size();
    utf8_decode(text.data(), text.size(), cps_);
    try {
        check_list_word(size(), cps_.size() - before);
        offsets_.push_back(cps_.size());
    } catch (...) {
        cps_.resize(before);
        throw;
    }
}

void WordList::pop_back()
{
    if (size() == 0)
        return;
    offsets_.pop_back();
    cps_.resize(size_t(offsets_.back()));
}

MetricIndex::MetricIndex(WordList words)
    : words_(std::move(words)), removed_(words_.size(), 0), live_(words_.size())
{
    require(words_.size() < UINT32_MAX, "metric index: more than 2^32 - 2 words");
}

MetricIndex::MetricIndex(WordList words, std::vector<uint8_t> removed)
    : words_(std::move(words)), removed_(std::move(removed))
{
    require(words_.size() < UINT32_MAX, "metric index: more than 2^32 - 2 words");
    if (removed_.size() != words_.size()) {
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "metric index: %zu removed flags for %zu words; give one flag per word",
                      removed_.size(), words_.size());
        throw Error(ErrorKind::InvalidArgument, msg);
    }
    for (uint8_t& flag : removed_)
        flag = flag != 0;
    live_ = size_t(std::count(removed_.begin(), removed_.end(), uint8_t(0)));
}

uint32_t MetricIndex::insert(WordView w)
{
    return insert_with(w, [this](uint32_t id) { place(id); });
}

uint32_t MetricIndex::insert_with(WordView w, const std::function<void(uint32_t)>& place_fn)
{
    require(words_.size() + 1 < UINT32_MAX, "metric index: more than 2^32 - 2 words");
    words_.push_back(w);
    removed_.push_back(0);
    live_++;
    const uint32_t id = uint32_t(words_.size() - 1);
    try {
        place_fn(id);
    } catch (...) {
        words_.pop_back();
        removed_.pop_back();
        live_--;
        throw;
    }
    return id;
}

bool MetricIndex::remove(uint32_t id)
{
    if (id >= words_.size()) {
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "metric index: cannot remove object %u, the index holds objects 0..%zu", id,
                      words_.size() == 0 ? size_t(0) : words_.size() - 1);
        throw Error(ErrorKind::InvalidArgument, msg);
    }
    if (removed_[id])
        return false;
    removed_[id] = 1;
    live_--;
    return true;
}

std::vector<MetricHit> BruteForceIndex::range(WordView q, uint32_t r, MetricStats* stats) const
{
    const EditPattern pattern(q);
    std::vector<MetricHit> hits;
    for (uint32_t id = 0; id < size(); id++) {
        check_interrupt_every(id);
        if (removed_[id])
            continue;
        const uint32_t d = pattern.distance(words_[id]);
        if (d <= r)
            hits.push_back({id, d});
    }
    if (stats)
        *stats = MetricStats{live_, live_};
    detail::sort_hits(hits);
    return hits;
}

std::vector<MetricHit> BruteForceIndex::knn(WordView q, size_t k, MetricStats* stats) const
{
    if (stats)
        *stats = MetricStats{k == 0 ? 0 : live_, live_};
    if (k == 0)
        return {};
    const EditPattern pattern(q);
    TopK top(k);
    for (uint32_t id = 0; id < size(); id++) {
        check_interrupt_every(id);
        if (!removed_[id])
            detail::knn_offer(top, id, pattern.distance(words_[id]));
    }
    return detail::knn_hits(top);
}

namespace detail {

uint32_t knn_radius(const TopK& top)
{
    const float t = top.threshold();
    return std::isinf(t) ? UINT32_MAX : uint32_t(t);
}

std::vector<MetricHit> knn_hits(TopK& top)
{
    const auto held = top.take_sorted();
    std::vector<MetricHit> hits(held.size());
    for (size_t i = 0; i < held.size(); i++)
        hits[i] = MetricHit{uint32_t(held[i].label), uint32_t(held[i].dist)};
    return hits;
}

void sort_hits(std::vector<MetricHit>& hits)
{
    std::sort(hits.begin(), hits.end(), metric_hit_less);
}

}  // namespace detail

namespace {

// Runs query(i, stats) for every query on `threads` threads and lays the
// answers out flat, in query order.
template <class Query>
MetricBatchResult run_batch(size_t nq, int threads, const Query& query)
{
    std::vector<std::vector<MetricHit>> per(nq);
    MetricBatchResult out;
    out.stats.resize(nq);
    parallel_for(nq, threads, [&](size_t begin, size_t end) {
        for (size_t i = begin; i < end; i++)
            per[i] = query(i, &out.stats[i]);
    });
    out.offsets.resize(nq + 1);
    out.offsets[0] = 0;
    for (size_t i = 0; i < nq; i++)
        out.offsets[i + 1] = out.offsets[i] + per[i].size();
    out.hits.reserve(size_t(out.offsets[nq]));
    for (auto& hits : per)
        out.hits.insert(out.hits.end(), hits.begin(), hits.end());
    return out;
}

}  // namespace

MetricBatchResult range_search_batch(const MetricIndex& index, const WordList& queries,
                                     const std::vector<uint32_t>& radii, int threads)
{
    const size_t nq = queries.size();
    if (radii.size() != nq && radii.size() != 1) {
        char msg[160];
        std::snprintf(msg, sizeof msg,
                      "range batch: %zu radii for %zu queries; give one radius per query, or one "
                      "for all",
                      radii.size(), nq);
        throw Error(ErrorKind::InvalidArgument, msg);
    }
    return run_batch(nq, threads, [&](size_t i, MetricStats* stats) {
        return index.range(queries[i], radii.size() == 1 ? radii[0] : radii[i], stats);
    });
}

MetricBatchResult knn_search_batch(const MetricIndex& index, const WordList& queries, size_t k,
                                   int threads)
{
    return run_batch(queries.size(), threads,
                     [&](size_t i, MetricStats* stats) { return index.knn(queries[i], k, stats); });
}

}  // namespace gpuivfpq
