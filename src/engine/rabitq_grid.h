// The extended-RaBitQ grid search with working memory kept from one row to
// the next (engine-internal: rabitq_best_grid_point is its one-row form).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "rabitq.h"

namespace gpuivfpq::detail {

// One per thread: run gives rabitq_best_grid_point's result, bit for bit,
// reusing its buffers (RabitqModel::encode keeps one per tile of rows).
class RabitqGridSearch {
public:
    RabitqGridSearch();
    ~RabitqGridSearch();
    RabitqGridSearch(const RabitqGridSearch&) = delete;
    RabitqGridSearch& operator=(const RabitqGridSearch&) = delete;

    // rabitq_best_grid_point(o, d, bits, x), arguments unchecked (d <=
    // kRabitqMaxDims, bits in 1..8, o and x valid).
    RabitqGridPoint run(const double* o, size_t d, int bits, uint8_t* x);

    class Impl;

private:
    std::unique_ptr<Impl> impl_;
};

}  // namespace gpuivfpq::detail
