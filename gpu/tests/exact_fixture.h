// Shared by the exact re-rank and filter-key tests: a trained model with its
// CPU encoding of clustered vectors (each with an int64 filter key), and
// check_exact, search_exact checked against search() and the host's own
// exact_distance (optionally within per-query key ranges).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/exact_distance.h"
#include "gpu_ivfpq/ivfpq_index.h"
#include "gpu_test_util.h"

namespace gputest {

// A trained model, its CPU encoding of n clustered vectors (ids unlike
// positions) and every stored vector by id, as the index was given it.
// Every row also has a filter key (used only by indexes with filter_keys):
// (r - 32) * 2^32 + s for r < 64, s < 3, so that keys equal in their low 32
// bits differ, both signs occur, and about n / 192 rows share a key; row 0
// holds INT64_MIN and row 1 INT64_MAX.
struct ExactFixture {
    size_t d, lists, m, n, nq;
    gpuivfpq::Metric metric;
    std::vector<float> x, q;
    std::vector<int64_t> ids, keys;
    std::unique_ptr<gpuivfpq::IvfPqModel> model;
    CpuIvf cpu;
    std::unordered_map<int64_t, std::vector<float>> stored;
    std::unordered_map<int64_t, int64_t> key_of;  // by id

    ExactFixture(size_t d_, size_t lists_, size_t m_, size_t n_, size_t nq_, gpuivfpq::Metric metric_,
                 uint64_t s)
        : d(d_), lists(lists_), m(m_), n(n_), nq(nq_), metric(metric_)
    {
        x = clustered(n, d, 40, 4.0f, s);
        q = clustered(nq, d, 40, 4.0f, s + 1);
        ids.resize(n);
        keys.resize(n);
        std::mt19937_64 g(s + 77);
        for (size_t i = 0; i < n; ++i) {
            ids[i] = int64_t(i) * 3 + 7;
            stored[ids[i]].assign(x.begin() + i * d, x.begin() + (i + 1) * d);
            keys[i] = (int64_t(g() % 64) - 32) * (int64_t(1) << 32) + int64_t(g() % 3);
        }
        if (n > 1) {
            keys[0] = std::numeric_limits<int64_t>::min();
            keys[1] = std::numeric_limits<int64_t>::max();
        }
        for (size_t i = 0; i < n; ++i)
            key_of[ids[i]] = keys[i];
        model = std::make_unique<gpuivfpq::IvfPqModel>(d, lists, m, metric);
        gpuivfpq::IvfPqTrainParams tp;
        tp.iterations = 6;
        tp.seed = s;
        model->train(x.data(), n, tp);
        cpu.build(*model, x.data(), n, ids.data());
    }

    std::unique_ptr<gpuivfpq::gpu::GpuIvfPqIndex> empty(gpuivfpq::gpu::GpuIvfPqOptions opt,
                                                        bool store = true) const
    {
        opt.store_vectors = store;
        return std::make_unique<gpuivfpq::gpu::GpuIvfPqIndex>(ctx(), d, lists, m, metric,
                                                              model->centroids().data(),
                                                              model->pq().codebooks().data(), opt);
    }

    // An index with filter keys (opt's other settings) holding every row
    // of the fixture with its vector and key.
    std::unique_ptr<gpuivfpq::gpu::GpuIvfPqIndex> keyed(gpuivfpq::gpu::GpuIvfPqOptions opt = {}) const
    {
        opt.filter_keys = true;
        auto idx = empty(opt);
        add_rows(*idx, 0, n, true, true);
        return idx;
    }

    // Rows [i0, i1) of the fixture, with their vectors when the index keeps
    // them and their keys when it keeps keys.
    void add_rows(gpuivfpq::gpu::GpuIvfPqIndex& idx, size_t i0, size_t i1, bool store = true,
                  bool keyed = false) const
    {
        idx.add_encoded(i1 - i0, cpu.all_lists.data() + i0, cpu.all_codes.data() + i0 * m, ids.data() + i0,
                        store ? x.data() + i0 * d : nullptr, keyed ? keys.data() + i0 : nullptr);
    }

    // The given rows of the fixture (any order, one batch), as add_rows.
    void add_picked(gpuivfpq::gpu::GpuIvfPqIndex& idx, const std::vector<size_t>& rows, bool store = true,
                    bool keyed = false) const
    {
        std::vector<int32_t> pl;
        std::vector<uint8_t> pc;
        std::vector<int64_t> pi, pk;
        std::vector<float> pv;
        for (size_t i : rows) {
            pl.push_back(cpu.all_lists[i]);
            pc.insert(pc.end(), cpu.all_codes.begin() + i * m, cpu.all_codes.begin() + (i + 1) * m);
            pi.push_back(ids[i]);
            pk.push_back(keys[i]);
            pv.insert(pv.end(), x.begin() + i * d, x.begin() + (i + 1) * d);
        }
        idx.add_encoded(rows.size(), pl.data(), pc.data(), pi.data(), store ? pv.data() : nullptr,
                        keyed ? pk.data() : nullptr);
    }

    // Extra vectors (host), CPU-encoded, appended in the order given.
    void add_extra(gpuivfpq::gpu::GpuIvfPqIndex& idx, const std::vector<float>& v, const std::vector<int64_t>& id)
    {
        const size_t k = id.size();
        std::vector<int32_t> l(k);
        std::vector<uint8_t> c(k * m);
        model->encode(v.data(), k, l.data(), c.data());
        idx.add_encoded(k, l.data(), c.data(), id.data(), v.data());
        for (size_t i = 0; i < k; ++i)
            stored[id[i]].assign(v.begin() + i * d, v.begin() + (i + 1) * d);
    }
};

struct ExactResult {
    std::vector<double> dist;
    std::vector<int64_t> labels;
    size_t padded_queries = 0;  // queries with fewer than k candidates
};

// search_exact against search and the host: per query the same candidate
// ids as search(); each distance bit for bit the host's exact_distance of
// (query as given, the vector stored under that id); exact_less order; the
// missing candidates as (+inf, -1) at the end. With ranges (host, one per
// query) both searches take them, and every id returned has its key in its
// query's range.
inline ExactResult check_exact(const ExactFixture& f, const gpuivfpq::gpu::GpuIvfPqIndex& idx,
                               const std::vector<float>& queries, size_t k, size_t nprobe,
                               const std::string& what, const gpuivfpq::gpu::KeyRange* ranges = nullptr)
{
    SCOPED_TRACE(what);
    const size_t nq = queries.size() / f.d;
    // search() with one candidate more where k allows: a tie between the
    // k-th and the next ADC distance may resolve either way (the staged and
    // the one-launch paths select differently), and then only the ids below
    // the tie must be among search_exact's.
    const size_t ka = std::min(k + 1, gpuivfpq::kMaxSelectK);
    std::vector<float> ad(nq * ka);
    std::vector<int64_t> al(nq * ka);
    idx.search(queries.data(), nq, ka, nprobe, ad.data(), al.data(), gpuivfpq::gpu::LabelKind::Ids, ranges);
    ExactResult r;
    r.dist.assign(nq * k, 0.0);
    r.labels.assign(nq * k, 0);
    idx.search_exact(queries.data(), nq, k, nprobe, r.dist.data(), r.labels.data(), ranges);
    int bad = 0;
    for (size_t i = 0; i < nq && bad < 5; ++i) {
        const double* ed = r.dist.data() + i * k;
        const int64_t* el = r.labels.data() + i * k;
        std::vector<int64_t> want, got, below;
        const bool tie = ka > k && al[i * ka + k] >= 0 && ad[i * ka + k - 1] == ad[i * ka + k];
        for (size_t j = 0; j < k; ++j) {
            if (al[i * ka + j] >= 0)
                want.push_back(al[i * ka + j]);
            if (al[i * ka + j] >= 0 && (!tie || ad[i * ka + j] < ad[i * ka + k]))
                below.push_back(al[i * ka + j]);
            if (el[j] >= 0)
                got.push_back(el[j]);
        }
        std::sort(want.begin(), want.end());
        std::sort(got.begin(), got.end());
        std::sort(below.begin(), below.end());
        if (tie ? got.size() != want.size() || !std::includes(got.begin(), got.end(), below.begin(), below.end())
                : want != got) {
            ADD_FAILURE() << "query " << i << ": " << got.size() << " exact candidates, " << want.size()
                          << " from search(), not the same ids";
            ++bad;
            continue;
        }
        const size_t cnt = got.size();
        r.padded_queries += cnt < k;
        const float* qv = queries.data() + i * f.d;
        for (size_t j = 0; j < k && bad < 5; ++j) {
            if (j >= cnt) {
                if (!(std::isinf(ed[j]) && ed[j] > 0 && el[j] == -1)) {
                    ADD_FAILURE() << "query " << i << " rank " << j << ": (" << ed[j] << ", " << el[j]
                                  << ") where (+inf, -1) padding belongs";
                    ++bad;
                }
                continue;
            }
            const auto it = f.stored.find(el[j]);
            if (it == f.stored.end()) {
                ADD_FAILURE() << "query " << i << " rank " << j << ": unknown id " << el[j];
                ++bad;
                continue;
            }
            if (ranges) {
                const auto kt = f.key_of.find(el[j]);
                if (kt == f.key_of.end() || kt->second < ranges->lo[i] || kt->second > ranges->hi[i]) {
                    ADD_FAILURE() << "query " << i << " rank " << j << ": id " << el[j]
                                  << " outside the key range [" << ranges->lo[i] << ", " << ranges->hi[i]
                                  << "]";
                    ++bad;
                }
            }
            const double host = gpuivfpq::exact_distance(f.metric, qv, it->second.data(), f.d);
            if (std::isnan(host) ? !std::isnan(ed[j]) : bits_of(host) != bits_of(ed[j])) {
                ADD_FAILURE() << std::setprecision(17) << "query " << i << " rank " << j << " id " << el[j]
                              << ": gpu " << ed[j] << " host " << host;
                ++bad;
            }
            if (j + 1 < cnt && !gpuivfpq::exact_less(ed[j], el[j], ed[j + 1], el[j + 1])) {
                ADD_FAILURE() << std::setprecision(17) << "query " << i << " ranks " << j << ", " << j + 1
                              << " out of exact_less order: (" << ed[j] << ", " << el[j] << ") then ("
                              << ed[j + 1] << ", " << el[j + 1] << ")";
                ++bad;
            }
        }
    }
    return r;
}

}  // namespace gputest
