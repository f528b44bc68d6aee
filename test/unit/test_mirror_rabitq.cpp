// Mirrors of indexes with RaBitQ codes on the CPU emulation device, in
// process, through the GPU process's channel and placed over several
// devices.
//
// Why: the service serves such an index from a mirror whose entries are the
// pages' m-byte codes (bit planes, then RabitqFactors) and whose model is the
// pages' blob (the rotation, then P c); its answers must be the CPU engine's
// (RabitqModel::search over the same lists) bit for bit, with filter keys,
// after appends and removals, however it is placed, and bad shapes must be
// refused rather than read past.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/kmeans.h"
#include "engine/rabitq.h"
#include "engine/topk.h"
#include "gpu_process/compute_device.h"
#include "gpu_process/device_set.h"
#include "gpu_process/gpu_process_protocol.h"
#include "gpu_process/mirror_store.h"
#include "gpu_process_channel.h"
#include "test_util.h"

namespace gpuivfpq {
namespace {

using gpuproc::Channel;
using gpuproc::emulated_server;

// An index with RaBitQ codes as its pages hold it: rows' lists, m-byte
// entry codes (planes, then factors), labels and filter keys, the model
// blob, and the engine model that made them.
struct RabitqSet {
    size_t d = 40, lists = 8, n = 1500;
    int bits = 4;
    Metric metric;
    std::vector<float> x, centroids;
    RabitqModel model;
    std::vector<int32_t> list_ids;
    std::vector<uint8_t> rows;  // n x m
    std::vector<int64_t> labels, keys;
    std::vector<uint8_t> blob;

    RabitqSet(Metric metric_, int bits_, size_t d_ = 40, size_t n_ = 1500)
        : d(d_), n(n_), bits(bits_), metric(metric_),
          model(d_, lists, bits_, metric_, RabitqRotation::generate(d_, 5))
    {
        x = testutil::gaussian_vectors(n, d, 3);
        std::vector<float> train = x;
        if (metric == Metric::Cosine)
            normalize_rows(train.data(), n, d);
        centroids.resize(lists * d);
        KMeansParams kp;
        kp.seed = 7;
        kmeans_train(train.data(), n, d, lists, kp, centroids.data());
        model.set_centroids(centroids.data());
        list_ids.resize(n);
        model.assign(x.data(), n, list_ids.data());
        std::vector<uint8_t> planes(n * model.code_bytes());
        std::vector<RabitqFactors> factors(n);
        model.encode(x.data(), n, list_ids.data(), planes.data(), factors.data());
        rows.resize(n * m());
        for (size_t i = 0; i < n; i++) {
            std::memcpy(&rows[i * m()], &planes[i * model.code_bytes()], model.code_bytes());
            std::memcpy(&rows[i * m() + model.code_bytes()], &factors[i], sizeof(RabitqFactors));
            labels.push_back(int64_t(i) * 7 + 1);
            keys.push_back(int64_t(i % 5));
        }
        blob.assign(rabitq_model_bytes(d, lists), 0);
        std::memcpy(blob.data(), model.rotation().matrix().data(), d * d * sizeof(float));
        std::memcpy(blob.data() + rabitq_rotated_offset(d), model.rotated_centroids().data(),
                    lists * d * sizeof(double));
    }

    size_t m() const { return rabitq_row_bytes(d, bits); }

    MirrorSpec spec(bool with_keys = false) const
    {
        MirrorSpec s;
        s.d = d;
        s.lists = lists;
        s.m = m();
        s.metric = metric;
        s.centroids = centroids.data();
        s.rabitq_bits = bits;
        s.rabitq_model = blob.data();
        s.filter_keys = with_keys;
        return s;
    }

    // RabitqModel::search over the rows i with keep(i), per query (nq x k,
    // padded with (+inf, -1)).
    template <typename Keep>
    void reference(const float* queries, size_t nq, size_t k, size_t nprobe, Keep keep,
                   std::vector<float>& dist, std::vector<int64_t>& out) const
    {
        std::vector<std::vector<int64_t>> lab(lists);
        std::vector<std::vector<uint8_t>> codes(lists);
        std::vector<std::vector<RabitqFactors>> fac(lists);
        for (size_t i = 0; i < n; i++) {
            if (!keep(i))
                continue;
            const size_t l = size_t(list_ids[i]);
            lab[l].push_back(labels[i]);
            codes[l].insert(codes[l].end(), &rows[i * m()], &rows[i * m()] + model.code_bytes());
            RabitqFactors f;
            std::memcpy(&f, &rows[i * m() + model.code_bytes()], sizeof f);
            fac[l].push_back(f);
        }
        std::vector<RabitqList> ls;
        for (size_t l = 0; l < lists; l++)
            ls.push_back({lab[l].data(), codes[l].data(), fac[l].data(), lab[l].size()});
        dist.assign(nq * k, std::numeric_limits<float>::infinity());
        out.assign(nq * k, -1);
        for (size_t q = 0; q < nq; q++) {
            // Ranked by lower bounds, as every mirror of RaBitQ codes ranks them.
            std::vector<Neighbor> best = model.search(ls.data(), queries + q * d, nprobe, k, kRabitqLowerEps0);
            for (size_t j = 0; j < best.size(); j++) {
                dist[q * k + j] = best[j].dist;
                out[q * k + j] = best[j].label;
            }
        }
    }
};

const char* name_of(Metric m)
{
    return m == Metric::L2 ? "l2" : m == Metric::InnerProduct ? "inner product" : "cosine";
}

TEST(RabitqMirror, SearchIsTheEnginesSearch)
{
    for (Metric metric : {Metric::L2, Metric::InnerProduct, Metric::Cosine})
        for (int bits : {1, 4, 8}) {
            SCOPED_TRACE(std::string(name_of(metric)) + ", " + std::to_string(bits) + " bits");
            RabitqSet s(metric, bits);
            auto dev = make_cpu_emulation_device();
            auto mirror = dev->create_mirror(s.spec());
            mirror->add(s.n, s.list_ids.data(), s.rows.data(), s.labels.data(), nullptr, nullptr);
            EXPECT_EQ(mirror->entries(), s.n);
            EXPECT_FALSE(mirror->has_vectors());
            EXPECT_GE(dev->mirror_bytes(s.spec(), s.n), s.n * s.m());

            const size_t nq = 20, k = 10;
            std::vector<float> queries = testutil::gaussian_vectors(nq, s.d, 11);
            for (size_t nprobe : {size_t(1), size_t(3), s.lists}) {
                std::vector<float> dist(nq * k), want_dist;
                std::vector<int64_t> got(nq * k), want;
                mirror->search(queries.data(), nq, k, nprobe, dist.data(), got.data(), nullptr);
                s.reference(queries.data(), nq, k, nprobe, [](size_t) { return true; }, want_dist, want);
                EXPECT_EQ(got, want) << "nprobe " << nprobe;
                EXPECT_EQ(dist, want_dist) << "nprobe " << nprobe;
            }
            // k past the entries: padded.
            std::vector<float> dist(s.n + 10);
            std::vector<int64_t> got(s.n + 10);
            mirror->search(queries.data(), 1, s.n + 10, s.lists, dist.data(), got.data(), nullptr);
            EXPECT_EQ(std::count(got.begin(), got.end(), -1), 10);
        }
}

TEST(RabitqMirror, KeysRangesAndRemovals)
{
    RabitqSet s(Metric::L2, 4);
    auto dev = make_cpu_emulation_device();
    auto mirror = dev->create_mirror(s.spec(true));
    // Keys are required exactly when the mirror keeps them.
    EXPECT_THROW(mirror->add(1, s.list_ids.data(), s.rows.data(), s.labels.data(), nullptr, nullptr), Error);
    mirror->add(s.n, s.list_ids.data(), s.rows.data(), s.labels.data(), nullptr, s.keys.data());

    const size_t nq = 12, k = 8, nprobe = 3;
    std::vector<float> queries = testutil::gaussian_vectors(nq, s.d, 17);
    std::vector<int64_t> lo(nq), hi(nq), matched(nq, -1);
    for (size_t q = 0; q < nq; q++) {
        lo[q] = int64_t(q % 3);
        hi[q] = lo[q] + 1;
    }
    KeyRanges r{lo.data(), hi.data(), matched.data()};
    std::vector<float> dist(nq * k);
    std::vector<int64_t> got(nq * k);
    mirror->search(queries.data(), nq, k, nprobe, dist.data(), got.data(), &r);
    for (size_t q = 0; q < nq; q++) {
        std::vector<float> wd;
        std::vector<int64_t> want;
        auto in_range = [&](size_t i) { return s.keys[i] >= lo[q] && s.keys[i] <= hi[q]; };
        s.reference(queries.data() + q * s.d, 1, k, nprobe, in_range, wd, want);
        EXPECT_EQ(std::vector<int64_t>(got.begin() + q * k, got.begin() + (q + 1) * k), want) << "query " << q;
        // matched: the in-range entries of the probed lists.
        RabitqQuery prepared;
        s.model.prepare_query(queries.data() + q * s.d, prepared);
        std::vector<int32_t> probed = s.model.probe_lists(prepared, nprobe);
        int64_t count = 0;
        for (size_t i = 0; i < s.n; i++)
            if (in_range(i) && std::find(probed.begin(), probed.end(), s.list_ids[i]) != probed.end())
                count++;
        EXPECT_EQ(matched[q], count) << "query " << q;
    }

    // Every third row goes (with an unknown label and a duplicate).
    std::vector<int64_t> gone{-5, s.labels[0]};
    for (size_t i = 0; i < s.n; i += 3)
        gone.push_back(s.labels[i]);
    EXPECT_EQ(mirror->remove(gone.size(), gone.data()), (s.n + 2) / 3);
    EXPECT_EQ(mirror->entries(), s.n - (s.n + 2) / 3);
    std::vector<float> wd;
    std::vector<int64_t> want;
    mirror->search(queries.data(), nq, k, nprobe, dist.data(), got.data(), nullptr);
    s.reference(queries.data(), nq, k, nprobe, [](size_t i) { return i % 3 != 0; }, wd, want);
    EXPECT_EQ(got, want);
    EXPECT_EQ(dist, wd);
}

TEST(RabitqMirror, RefusesWhatItCannotServe)
{
    RabitqSet s(Metric::L2, 4);
    auto dev = make_cpu_emulation_device();
    auto mirror = dev->create_mirror(s.spec());
    mirror->add(s.n, s.list_ids.data(), s.rows.data(), s.labels.data(), nullptr, nullptr);
    std::vector<double> exact(10);
    std::vector<int64_t> labels(10);
    std::vector<float> dist(10);
    auto kind_of = [](const std::function<void()>& f) {
        try {
            f();
        } catch (const Error& e) {
            return int(e.kind());
        }
        return -1;
    };
    EXPECT_EQ(kind_of([&] { mirror->search_exact(s.x.data(), 1, 10, 2, exact.data(), labels.data(), nullptr); }),
              int(ErrorKind::Unsupported));
    EXPECT_EQ(kind_of([&] { mirror->brute_force(s.x.data(), 1, 10, exact.data(), labels.data()); }),
              int(ErrorKind::Unsupported));
    EXPECT_EQ(kind_of([&] { mirror->search(s.x.data(), 1, 0, 2, dist.data(), labels.data(), nullptr); }),
              int(ErrorKind::InvalidArgument));
    int32_t bad_list = int32_t(s.lists);
    EXPECT_EQ(kind_of([&] { mirror->add(1, &bad_list, s.rows.data(), s.labels.data(), nullptr, nullptr); }),
              int(ErrorKind::InvalidArgument));

    MirrorSpec wrong_m = s.spec();
    wrong_m.m = s.m() - 4;
    MirrorSpec wrong_bits = s.spec();
    wrong_bits.rabitq_bits = 9;
    MirrorSpec with_vectors = s.spec();
    with_vectors.vectors = true;
    MirrorSpec too_wide = s.spec();
    too_wide.d = kRabitqMaxDims + 1;
    for (const MirrorSpec* bad : {&wrong_m, &wrong_bits, &with_vectors, &too_wide})
        EXPECT_EQ(kind_of([&] { dev->create_mirror(*bad); }), int(ErrorKind::InvalidArgument));
    // A build's encoding of RaBitQ codes on a device: the lists and the
    // rows (planes, then factors) the CPU engine writes.
    std::vector<int32_t> lists(s.n, -1);
    std::vector<uint8_t> codes(s.n * s.m(), 0xab);
    dev->encode(s.spec(), s.x.data(), s.n, lists.data(), codes.data());
    EXPECT_EQ(lists, s.list_ids);
    EXPECT_EQ(codes, s.rows);
    EXPECT_EQ(kind_of([&] { dev->encode(wrong_bits, s.x.data(), 1, lists.data(), codes.data()); }),
              int(ErrorKind::InvalidArgument));
}

// The same answers through the GPU process's channel (the model blob in the
// Load request) and over three devices, replicated or sharded.
TEST(RabitqMirror, ThroughTheProcessAndPlaced)
{
    RabitqSet s(Metric::InnerProduct, 4);
    const size_t nq = 30, k = 10, nprobe = 3;
    std::vector<float> queries = testutil::gaussian_vectors(nq, s.d, 23);
    std::vector<float> wd;
    std::vector<int64_t> want;
    s.reference(queries.data(), nq, k, nprobe, [](size_t) { return true; }, wd, want);

    Channel ch(emulated_server);
    auto gp = ch.connect();
    const MirrorKey key{1, 10, 100, 1};
    gp->load(key, s.spec(true), s.n, s.list_ids.data(), s.rows.data(), s.labels.data(), nullptr, s.keys.data());
    std::vector<int64_t> got(nq * k);
    std::vector<double> exact(nq * k);
    GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
    ASSERT_TRUE(gp->search(key, s.d, queries.data(), nq, k, nprobe, nullptr, nullptr, nullptr, got.data(),
                           exact.data(), &is_exact));
    // The lower bounds the rows are ranked by come with them.
    EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_LOWER);
    EXPECT_EQ(got, want);
    for (size_t i = 0; i < nq * k; i++)
        if (want[i] >= 0)
            EXPECT_EQ(exact[i], double(wd[i])) << "row " << i;
    // Exact k-NN over the stored vectors: a RaBitQ mirror has none, so nothing is served.
    ASSERT_TRUE(gp->search(key, s.d, queries.data(), nq, k, nprobe, nullptr, nullptr, nullptr, got.data(),
                           exact.data(), &is_exact, true));
    EXPECT_EQ(is_exact, GPU_IVFPQ_DISTS_NONE);
    // A build's encoding through the channel: the lists and the rows.
    std::vector<int32_t> lists(s.n, -1);
    std::vector<uint8_t> rows(s.n * s.m(), 0xab);
    gp->encode(s.spec(), s.x.data(), s.n, lists.data(), rows.data());
    EXPECT_EQ(lists, s.list_ids);
    EXPECT_EQ(rows, s.rows);
    // A bad shape is refused by the client before anything is sent.
    MirrorSpec wrong = s.spec();
    wrong.m = 16;
    EXPECT_THROW(gp->load(key, wrong, s.n, s.list_ids.data(), s.rows.data(), s.labels.data(), nullptr, nullptr),
                 Error);

    for (Placement p : {Placement::Replicate, Placement::Shard}) {
        SCOPED_TRACE(p == Placement::Shard ? "shards" : "replicas");
        std::vector<std::unique_ptr<ComputeDevice>> devs;
        for (int i = 0; i < 3; i++)
            devs.push_back(make_cpu_emulation_device());
        DeviceSet set(std::move(devs), std::vector<uint32_t>{});
        MirrorStore store(set);
        Mirror* m = store.load(key, s.spec(), s.n, s.list_ids.data(), s.rows.data(), s.labels.data(), nullptr,
                               nullptr, p);
        std::vector<float> dist(nq * k);
        m->search(queries.data(), nq, k, nprobe, dist.data(), got.data(), nullptr);
        EXPECT_EQ(got, want);
        EXPECT_EQ(dist, wd);
    }
}

// Rows wider than the GPU service's change-log entries hold in place (172
// and 1036 bytes): loaded through the channel, then the rest appended as the
// service appends logged entries (m bytes a row), then removals; the
// answers stay the engine's.
TEST(RabitqMirror, WideRowsLoadedAndAppended)
{
    for (auto [d, bits] : {std::pair<size_t, int>{300, 4}, std::pair<size_t, int>{1000, 8}}) {
        SCOPED_TRACE("d = " + std::to_string(d) + ", " + std::to_string(bits) + " bits");
        RabitqSet s(Metric::L2, bits, d, 400);
        ASSERT_GT(s.m(), size_t(128));
        const size_t nq = 10, k = 10, nprobe = 3, half = s.n / 2;
        std::vector<float> queries = testutil::gaussian_vectors(nq, s.d, 29);

        Channel ch(emulated_server);
        auto gp = ch.connect();
        const MirrorKey key{1, 11, 110, 1};
        gp->load(key, s.spec(), half, s.list_ids.data(), s.rows.data(), s.labels.data(), nullptr, nullptr);
        ASSERT_TRUE(gp->add(key, s.m(), s.n - half, s.list_ids.data() + half, s.rows.data() + half * s.m(),
                            s.labels.data() + half, nullptr, 0, s.keys.data() + half));
        std::vector<float> wd;
        std::vector<int64_t> want, got(nq * k);
        std::vector<double> exact(nq * k);
        GpuIvfpqAnswerDists is_exact = GPU_IVFPQ_DISTS_NONE;
        s.reference(queries.data(), nq, k, nprobe, [](size_t) { return true; }, wd, want);
        ASSERT_TRUE(gp->search(key, s.d, queries.data(), nq, k, nprobe, nullptr, nullptr, nullptr, got.data(),
                               exact.data(), &is_exact));
        EXPECT_EQ(got, want);

        std::vector<int64_t> gone;
        for (size_t i = 0; i < s.n; i += 4)
            gone.push_back(s.labels[i]);
        gp->remove(key, gone.size(), gone.data());
        s.reference(queries.data(), nq, k, nprobe, [](size_t i) { return i % 4 != 0; }, wd, want);
        ASSERT_TRUE(gp->search(key, s.d, queries.data(), nq, k, nprobe, nullptr, nullptr, nullptr, got.data(),
                               exact.data(), &is_exact));
        EXPECT_EQ(got, want);
    }
}

}  // namespace
}  // namespace gpuivfpq
