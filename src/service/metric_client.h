// gpu_metric searches on the GPU service (service/metric_client.cpp), for
// the access method's one search call (am/metric_search.cpp).
#pragma once

#include "metric/am.h"

extern bool GpuMetricServiceAnswer(Relation index, GpuMetricCached *entry, const GpuMetricMetaPageData *meta,
								   bool knn, const uint32 *cps, const uint64 *offsets, int64 nq, uint32 param,
								   const uint32 *radii, GpuMetricHits *out);
