// A small encoded set shared by the mirror tests (the mirror store and the
// GPU process's channel): 2000 x 16 Gaussian rows, an IVFPQ model with 8
// lists and m = 4 trained on them, their list ids, codes and labels, and the
// MirrorSpec that borrows the model.
#pragma once

#include <cstdint>
#include <vector>

#include <gtest/gtest.h>

#include "engine/error.h"
#include "engine/ivfpq.h"
#include "service/device/compute_device.h"
#include "test_util.h"

namespace testutil {

using gpuivfpq::IvfPqModel;
using gpuivfpq::IvfPqTrainParams;
using gpuivfpq::Metric;
using gpuivfpq::MirrorSpec;

struct EncodedSet {
    size_t d = 16, lists = 8, m = 4, n = 2000;
    std::vector<float> x;
    IvfPqModel model{16, 8, 4, Metric::L2};
    std::vector<int32_t> list_ids;
    std::vector<uint8_t> codes;
    std::vector<int64_t> labels;

    EncodedSet()
    {
        x = gaussian_vectors(n, d, 3);
        model.train(x.data(), n, IvfPqTrainParams());
        list_ids.resize(n);
        codes.resize(n * m);
        model.encode(x.data(), n, list_ids.data(), codes.data());
        for (size_t i = 0; i < n; i++)
            labels.push_back(int64_t(i) * 7 + 1);
    }
    MirrorSpec spec() const
    {
        MirrorSpec s;
        s.d = d;
        s.lists = lists;
        s.m = m;
        s.metric = Metric::L2;
        s.centroids = model.centroids().data();
        s.codebooks = model.pq().codebooks().data();
        return s;
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
