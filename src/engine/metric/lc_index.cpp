// List of Clusters: the build by sum of distances, exact range and k-NN
// queries with the early stop, and the insert rule that keeps them exact.
#include "lc_index.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "engine/error.h"
#include "engine/interrupt.h"
#include "engine/parallel.h"

namespace gpuivfpq {

namespace {

// Below this many remaining objects a step runs on the calling thread alone:
// waking the workers costs more than it saves.
constexpr size_t kParallelMin = 2048;

// The bucket size, refused when 0 (a list of clusters needs buckets).
size_t checked_bucket(size_t bucket)
{
    require(bucket >= 1, "list of clusters: bucket size must be at least 1");
    return bucket;
}

// A remaining object seen by a step: its position in the compact arrays, its
// id and a key (its distance to the new centre, or its updated sum).
struct Seen {
    uint64_t key;
    uint32_t id;
    uint32_t pos;
};

// (distance, id) ascending: the bucket takes the smallest.
inline bool nearer(const Seen& a, const Seen& b)
{
    return a.key < b.key || (a.key == b.key && a.id < b.id);
}

// (sum descending, id ascending): the next centre is the first.
inline bool better(const Seen& a, const Seen& b)
{
    return a.key > b.key || (a.key == b.key && a.id < b.id);
}

// Offers s to a heap keeping the `keep` first elements under `first`
// (the heap's top is the last of them, the one a newcomer must beat).
template <typename First>
inline void offer(std::vector<Seen>& heap, size_t keep, const Seen& s, First first)
{
    if (heap.size() < keep) {
        heap.push_back(s);
        std::push_heap(heap.begin(), heap.end(), first);
    } else if (first(s, heap.front())) {
        std::pop_heap(heap.begin(), heap.end(), first);
        heap.back() = s;
        std::push_heap(heap.begin(), heap.end(), first);
    }
}

// Workers kept for a whole build: each step wakes them once (a thread per
// step per worker costs more than a small step's distances). Threads start
// with every signal blocked, as parallel_for's, so a host process's signal
// handlers (PostgreSQL's) only run on the caller's thread. run(job) calls
// job(t) for t in [0, threads()) (0 on the caller's thread) and returns when
// all are done, rethrowing the first exception. A worker that cannot start
// only lowers threads(); the result never depends on it.
class StepPool {
public:
    explicit StepPool(int threads)
    {
        const size_t want = size_t(std::max(threads, 1)) - 1;
        sigset_t all, saved;
        sigfillset(&all);
        const bool blocked = pthread_sigmask(SIG_SETMASK, &all, &saved) == 0;
        try {
            for (size_t w = 0; w < want; w++)
                workers_.emplace_back([this, w] { loop(w + 1); });
        } catch (...) {
            // Resource limits: fewer workers.
        }
        if (blocked)
            pthread_sigmask(SIG_SETMASK, &saved, nullptr);
    }
    ~StepPool()
    {
        {
            std::lock_guard<std::mutex> lock(mu_);
            stop_ = true;
        }
        wake_.notify_all();
        for (auto& w : workers_)
            w.join();
    }
    StepPool(const StepPool&) = delete;
    StepPool& operator=(const StepPool&) = delete;

    size_t threads() const { return workers_.size() + 1; }

    void run(const std::function<void(size_t)>& job)
    {
        if (workers_.empty()) {
            job(0);
            return;
        }
        {
            std::lock_guard<std::mutex> lock(mu_);
            job_ = &job;
            pending_ = workers_.size();
            generation_++;
        }
        wake_.notify_all();
        std::exception_ptr mine;
        try {
            job(0);
        } catch (...) {
            mine = std::current_exception();
        }
        std::unique_lock<std::mutex> lock(mu_);
        done_.wait(lock, [this] { return pending_ == 0; });
        job_ = nullptr;
        if (!mine)
            mine = first_;
        first_ = nullptr;
        if (mine)
            std::rethrow_exception(mine);
    }

private:
    void loop(size_t t)
    {
        uint64_t seen = 0;
        for (;;) {
            const std::function<void(size_t)>* job;
            {
                std::unique_lock<std::mutex> lock(mu_);
                wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
                if (stop_)
                    return;
                seen = generation_;
                job = job_;
            }
            std::exception_ptr err;
            try {
                (*job)(t);
            } catch (...) {
                err = std::current_exception();
            }
            bool last;
            {
                std::lock_guard<std::mutex> lock(mu_);
                if (err && !first_)
                    first_ = err;
                last = --pending_ == 0;
            }
            if (last)
                done_.notify_one();
        }
    }

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable wake_, done_;
    const std::function<void(size_t)>* job_ = nullptr;
    uint64_t generation_ = 0;
    size_t pending_ = 0;
    bool stop_ = false;
    std::exception_ptr first_;
};

}  // namespace

// Each step: the remaining objects sit in compact arrays (ids, sums) in
// ascending id order (for the memory access only: every choice is by a total
// order with the id as the tie-break, so neither the order nor the thread
// count shows in the result).
// One pass over them, split among the threads, computes each distance to
// the new centre, adds it to the object's sum, and keeps per thread the
// `bucket` nearest (distance, id) and the bucket + 1 best (sum, id). The
// bucket is the `bucket` nearest of the threads' candidates; the next centre
// is the best of the threads' sum candidates not taken (a thread's best
// untaken object is among its bucket + 1 best, since at most `bucket` of its
// objects are taken). The bucket and the next centre are then marked taken;
// passes skip them, and a stable compaction drops them once they are a
// quarter of the arrays (compacting at every step was a serial pass over
// all remaining objects per cluster: most of a 1M-word build on 16 threads).
ListOfClusters::ListOfClusters(WordList words, size_t bucket, int threads)
    : MetricIndex(std::move(words)), bucket_(checked_bucket(bucket))
{
    const size_t n = size();
    if (n == 0)
        return;
    // Object 0, the first centre, is not among them.
    std::vector<uint32_t> rem_id(n - 1);
    std::iota(rem_id.begin(), rem_id.end(), 1u);
    std::vector<uint64_t> rem_sum(n - 1, 0);
    const size_t k = bucket_;

    // Workers only when the first step is large enough to use them.
    const int nthreads = n > kParallelMin ? std::max(threads, 1) : 1;
    StepPool pool(nthreads);
    const size_t nt = pool.threads();
    std::vector<std::vector<Seen>> near(nt), best(nt);
    for (size_t t = 0; t < nt; t++) {
        near[t].reserve(std::min(k, n));
        best[t].reserve(std::min(k + 1, n));
    }
    std::vector<Seen> cand_near, cand_best;
    cand_near.reserve(nt * std::min(k, n));
    cand_best.reserve(nt * std::min(k + 1, n));
    std::vector<uint8_t> taken(n, 0);    // by position, until the next compaction
    size_t dead = 0;                     // positions taken since the last compaction

    // The first centre is object 0 (all sums are 0: the smallest id).
    uint32_t c = 0;
    size_t nr = n - 1;
    const EditPattern* pattern = nullptr;
    std::function<void(size_t)> pass = [&](size_t t) {
        const size_t parts = nr >= kParallelMin ? nt : 1;
        if (t >= parts)
            return;
        const size_t begin = nr * t / parts, end = nr * (t + 1) / parts;
        std::vector<Seen>& nh = near[t];
        std::vector<Seen>& bh = best[t];
        nh.clear();
        bh.clear();
        const uint32_t* ids = rem_id.data();
        uint64_t* sums = rem_sum.data();
        const uint8_t* gone = taken.data();
        for (size_t j = begin; j < end; j++) {
            check_interrupt_every(j - begin);
            if (gone[j])
                continue;
            const uint32_t id = ids[j];
            const uint32_t d = pattern->distance(words_[id]);
            const uint64_t s = sums[j] + d;
            sums[j] = s;
            offer(nh, k, Seen{d, id, uint32_t(j)}, nearer);
            offer(bh, k + 1, Seen{s, id, uint32_t(j)}, better);
        }
    };

    for (;;) {
        const EditPattern pat(words_[c]);
        pattern = &pat;
        if (nr >= kParallelMin)
            pool.run(pass);
        else
            pass(0);
        build_evaluations_ += nr - dead;

        // The bucket: the k nearest of the threads' candidates.
        const size_t parts = nr >= kParallelMin ? nt : 1;
        cand_near.clear();
        for (size_t t = 0; t < parts; t++)
            cand_near.insert(cand_near.end(), near[t].begin(), near[t].end());
        const size_t take = std::min(k, cand_near.size());
        if (take < cand_near.size())
            std::nth_element(cand_near.begin(), cand_near.begin() + long(take), cand_near.end(),
                             nearer);
        Cluster cluster{c, 0, {}};
        cluster.bucket.reserve(take);
        for (size_t i = 0; i < take; i++) {
            cluster.bucket.push_back(cand_near[i].id);
            cluster.radius = std::max(cluster.radius, uint32_t(cand_near[i].key));
            taken[cand_near[i].pos] = 1;
        }
        dead += take;
        std::sort(cluster.bucket.begin(), cluster.bucket.end());
        clusters_.push_back(std::move(cluster));

        // The next centre: the best untaken sum candidate.
        const Seen* next = nullptr;
        for (size_t t = 0; t < parts; t++)
            for (const Seen& s : best[t])
                if (!taken[s.pos] && (next == nullptr || better(s, *next)))
                    next = &s;
        if (next == nullptr)
            break;    // nothing remains (and nothing was taken)
        c = next->id;
        taken[next->pos] = 1;
        dead++;
        if (dead * 4 < nr)
            continue;

        // The taken leave by a stable compaction: the rest keep ascending
        // ids, so the words are read in storage order.
        size_t kept = 0;
        for (size_t j = 0; j < nr; j++) {
            if (taken[j]) {
                taken[j] = 0;
                continue;
            }
            rem_id[kept] = rem_id[j];
            rem_sum[kept] = rem_sum[j];
            kept++;
        }
        nr = kept;
        dead = 0;
    }
}

ListOfClusters::ListOfClusters(WordList words, std::vector<uint8_t> removed, size_t bucket)
    : MetricIndex(std::move(words), std::move(removed)), bucket_(checked_bucket(bucket))
{
}

std::vector<uint32_t> ListOfClusters::cluster_assignment() const
{
    std::vector<uint32_t> cluster_of(size(), 0);
    for (size_t c = 0; c < clusters_.size(); c++) {
        cluster_of[clusters_[c].centre] = uint32_t(c);
        for (uint32_t x : clusters_[c].bucket)
            cluster_of[x] = uint32_t(c);
    }
    return cluster_of;
}

std::unique_ptr<ListOfClusters> ListOfClusters::restore(WordList words,
                                                        std::vector<uint8_t> removed,
                                                        size_t bucket,
                                                        const std::vector<uint32_t>& centres,
                                                        const std::vector<uint32_t>& radii,
                                                        const std::vector<uint32_t>& cluster_of)
{
    std::unique_ptr<ListOfClusters> lc(
        new ListOfClusters(std::move(words), std::move(removed), bucket));
    const size_t n = lc->size();
    const size_t nc = centres.size();
    char msg[200];
    if (radii.size() != nc || cluster_of.size() != n || (n == 0) != (nc == 0) || nc > n) {
        std::snprintf(msg, sizeof msg,
                      "list of clusters: cannot restore %zu centres, %zu radii and %zu cluster "
                      "numbers over %zu objects",
                      nc, radii.size(), cluster_of.size(), n);
        throw Error(ErrorKind::InvalidArgument, msg);
    }
    lc->clusters_.resize(nc);
    for (size_t c = 0; c < nc; c++) {
        const uint32_t x = centres[c];
        if (x >= n || cluster_of[x] != c) {
            std::snprintf(msg, sizeof msg,
                          "list of clusters: centre %u of cluster %zu is %s", x, c,
                          x >= n ? "not an object of the index" : "assigned to another cluster");
            throw Error(ErrorKind::InvalidArgument, msg);
        }
        lc->clusters_[c].centre = x;
        lc->clusters_[c].radius = radii[c];
    }
    // Ascending ids: the order the build sorts buckets in and inserts append in.
    for (uint32_t x = 0; x < n; x++) {
        const uint32_t c = cluster_of[x];
        if (c >= nc) {
            std::snprintf(msg, sizeof msg,
                          "list of clusters: object %u is in cluster %u of %zu", x, c, nc);
            throw Error(ErrorKind::InvalidArgument, msg);
        }
        if (lc->clusters_[c].centre != x)
            lc->clusters_[c].bucket.push_back(x);
    }
    return lc;
}

LcPlacement ListOfClusters::placement(WordView w) const
{
    const EditPattern pattern(w);
    // Invariant (2) holds for every cluster passed over: the object is
    // farther than its radius from each such centre.
    for (size_t c = 0; c < clusters_.size(); c++) {
        check_interrupt_every(c);
        const Cluster& cluster = clusters_[c];
        if (pattern.within(words_[cluster.centre], cluster.radius) <= cluster.radius)
            return LcPlacement{uint32_t(c), cluster.radius};
    }
    // No later cluster exists to break (2) when the last radius grows.
    if (!clusters_.empty() && clusters_.back().bucket.size() < bucket_) {
        const Cluster& last = clusters_.back();
        return LcPlacement{uint32_t(clusters_.size() - 1),
                           std::max(last.radius, pattern.distance(words_[last.centre]))};
    }
    return LcPlacement{uint32_t(clusters_.size()), 0};
}

void ListOfClusters::place(uint32_t id) { place_at(id, placement(words_[id])); }

void ListOfClusters::place_at(uint32_t id, LcPlacement p)
{
    if (p.cluster == clusters_.size()) {
        clusters_.push_back(Cluster{id, 0, {}});
        return;
    }
    Cluster& cluster = clusters_[p.cluster];
    cluster.bucket.push_back(id);
    cluster.radius = p.radius;
}

void check_lc_placement(size_t clusters, LcPlacement p, uint32_t radius)
{
    const char* why = nullptr;
    if (p.cluster > clusters)
        why = "there is no such cluster";
    else if (p.cluster == clusters && p.radius != 0)
        why = "a new cluster starts with radius 0";
    else if (p.cluster < clusters && p.radius < radius)
        why = "a radius never shrinks (its bucket must stay covered)";
    else if (size_t(p.cluster) + 1 < clusters && p.radius != radius)
        why = "only the last cluster's radius grows (invariant 2 of the later clusters)";
    if (why == nullptr)
        return;
    char msg[240];
    std::snprintf(msg, sizeof msg,
                  "list of clusters: cannot insert into cluster %u with radius %u (%zu clusters): "
                  "%s",
                  p.cluster, p.radius, clusters, why);
    throw Error(ErrorKind::InvalidArgument, msg);
}

uint32_t ListOfClusters::insert_at(WordView w, LcPlacement p)
{
    const size_t nc = clusters_.size();
    check_lc_placement(nc, p, p.cluster < nc ? clusters_[p.cluster].radius : 0);
    return insert_with(w, [this, p](uint32_t id) { place_at(id, p); });
}

std::vector<MetricHit> ListOfClusters::range(WordView q, uint32_t r, MetricStats* stats) const
{
    const EditPattern pattern(q);
    std::vector<MetricHit> hits;
    uint64_t evaluations = 0;
    for (const Cluster& cluster : clusters_) {
        // Exact up to radius + r, all the rules below need.
        const uint32_t reach = detail::saturating_add(cluster.radius, r);
        const uint32_t d = pattern.within(words_[cluster.centre], reach);
        check_interrupt_every(++evaluations);
        if (d <= r && !removed_[cluster.centre])
            hits.push_back({cluster.centre, d});
        if (d <= reach) {
            for (uint32_t x : cluster.bucket) {
                if (removed_[x])
                    continue;
                const uint32_t dx = pattern.within(words_[x], r);
                check_interrupt_every(++evaluations);
                if (dx <= r)
                    hits.push_back({x, dx});
            }
        }
        // d < radius - r: the query ball lies inside this cluster's ball,
        // and every later object is at >= radius from the centre.
        if (uint64_t(d) + r < cluster.radius)
            break;
    }
    if (stats)
        *stats = MetricStats{evaluations, live_};
    detail::sort_hits(hits);
    return hits;
}

std::vector<MetricHit> ListOfClusters::knn(WordView q, size_t k, MetricStats* stats) const
{
    if (k == 0) {
        if (stats)
            *stats = MetricStats{0, live_};
        return {};
    }
    const EditPattern pattern(q);
    TopK top(k);
    uint64_t evaluations = 0;
    for (const Cluster& cluster : clusters_) {
        // The pruning radius is the current k-th distance: an object at
        // exactly that distance may still win on its smaller id, so only
        // objects known to be farther are skipped.
        uint32_t r = detail::knn_radius(top);
        const uint32_t d =
            pattern.within(words_[cluster.centre], detail::saturating_add(cluster.radius, r));
        check_interrupt_every(++evaluations);
        if (d <= r && !removed_[cluster.centre])
            detail::knn_offer(top, cluster.centre, d);
        r = detail::knn_radius(top);
        if (d <= detail::saturating_add(cluster.radius, r)) {
            for (uint32_t x : cluster.bucket) {
                if (removed_[x])
                    continue;
                const uint32_t dx = pattern.within(words_[x], r);
                check_interrupt_every(++evaluations);
                if (dx <= r) {
                    detail::knn_offer(top, x, dx);
                    r = detail::knn_radius(top);
                }
            }
        }
        if (uint64_t(d) + r < cluster.radius)
            break;
    }
    if (stats)
        *stats = MetricStats{evaluations, live_};
    return detail::knn_hits(top);
}

}  // namespace gpuivfpq
