// A small encoded set shared by the mirror tests (the mirror store and the
// GPU process's channel): 2000 x 16 Gaussian rows, an IVFPQ model with 8
// lists and m = 4 trained on them (L2 unless a metric is given), their list
// ids, codes and labels, and the MirrorSpec that borrows the model, with or
// without the exact vectors (x, row i under labels[i]).
#pragma once

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "engine/error.h"
#include "engine/ivfpq.h"
#include "gpu_process/compute_device.h"
#include "test_util.h"

namespace testutil {

using gpuivfpq::IvfPqModel;
using gpuivfpq::IvfPqTrainParams;
using gpuivfpq::Metric;
using gpuivfpq::MirrorSpec;

struct EncodedSet {
    size_t d = 16, lists = 8, m = 4, n = 2000;
    Metric metric = Metric::L2;
    std::vector<float> x;
    IvfPqModel model;
    std::vector<int32_t> list_ids;
    std::vector<uint8_t> codes;
    std::vector<int64_t> labels;

    explicit EncodedSet(Metric metric_ = Metric::L2) : metric(metric_), model(16, 8, 4, metric_)
    {
        x = gaussian_vectors(n, d, 3);
        model.train(x.data(), n, IvfPqTrainParams());
        list_ids.resize(n);
        codes.resize(n * m);
        model.encode(x.data(), n, list_ids.data(), codes.data());
        for (size_t i = 0; i < n; i++)
            labels.push_back(int64_t(i) * 7 + 1);
    }
    // with_vectors: the mirror keeps each entry's exact vector (then add
    // and load take x, or rows of it).
    MirrorSpec spec(bool with_vectors = false) const
    {
        MirrorSpec s;
        s.d = d;
        s.lists = lists;
        s.m = m;
        s.metric = metric;
        s.centroids = model.centroids().data();
        s.codebooks = model.pq().codebooks().data();
        s.vectors = with_vectors;
        return s;
    }
    // The row stored under label (labels[i] = 7 i + 1), or -1.
    int64_t row_of(int64_t label) const
    {
        if (label < 1 || (label - 1) % 7 != 0 || size_t((label - 1) / 7) >= n)
            return -1;
        return (label - 1) / 7;
    }
    const float* vector_of(int64_t label) const { return x.data() + size_t(row_of(label)) * d; }

    // na new vectors (seeded), encoded with the set's model, under labels
    // first, first + 1, ...: rows to add to a mirror after its load.
    struct NewRows {
        std::vector<float> x;
        std::vector<int32_t> list_ids;
        std::vector<uint8_t> codes;
        std::vector<int64_t> labels;
    };
    NewRows new_rows(size_t na, uint64_t seed, int64_t first) const
    {
        NewRows r;
        r.x = gaussian_vectors(na, d, seed);
        r.list_ids.resize(na);
        r.codes.resize(na * m);
        r.labels.resize(na);
        model.encode(r.x.data(), na, r.list_ids.data(), r.codes.data());
        for (size_t i = 0; i < na; i++)
            r.labels[i] = first + int64_t(i);
        return r;
    }
};

// The kind of the gpuivfpq::Error fn throws (a test failure if none).
template <typename Fn>
gpuivfpq::ErrorKind error_kind(Fn&& fn)
{
    try {
        fn();
    } catch (const gpuivfpq::Error& e) {
        return e.kind();
    }
    ADD_FAILURE() << "no gpuivfpq::Error thrown";
    return gpuivfpq::ErrorKind::Internal;
}

}  // namespace testutil
