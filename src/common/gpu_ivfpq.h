// What every PostgreSQL-side file of gpu_ivfpq shares: the settings (GUCs),
// the limits, and the real[] vector type (common/vector.cpp). The access
// method's format is in am/am.h, the GPU service's API in service/service.h.
#pragma once

#include "engine/search_limits.h"
#include "common/pg.h"

/* ---- limits ---- */
#define GPU_IVFPQ_MAX_DIM		16000
#define GPU_IVFPQ_MAX_LISTS		65536
#define GPU_IVFPQ_MAX_M			256

/* ---- settings (common/module.cpp) ---- */
extern int	gpu_ivfpq_probes;
extern int	gpu_ivfpq_rerank;
extern int	gpu_ivfpq_max_scan_tuples;
extern bool gpu_ivfpq_strict_order;
extern int	gpu_ivfpq_table_memory_mb;
extern int	gpu_ivfpq_device;
extern int	gpu_ivfpq_gpu_memory_budget_kb;
extern int	gpu_ivfpq_batch_size;
extern int	gpu_ivfpq_batch_wait_us;
extern int	gpu_ivfpq_gpu_timeout_s;
extern bool gpu_ivfpq_service_emulate_gpu;

/* gpu_ivfpq.device */
#define GPU_IVFPQ_DEVICE_AUTO	0
#define GPU_IVFPQ_DEVICE_GPU	1
#define GPU_IVFPQ_DEVICE_CPU	2

/* Most candidates one GPU round selects (WarpSelect / BlockSelect queues). */
#define GPU_IVFPQ_SERVICE_MAX_K ((int) gpuivfpq::kMaxSelectK)

/* ---- the real[] vector type (common/vector.cpp) ---- */
extern const float *GpuIvfpqArrayVector(ArrayType *arr, int *dim, const char *what);
extern void GpuIvfpqCheckIndexableDim(int dim);
extern const float *GpuIvfpqStoredVector(ArrayType *arr, int *dim);
extern double GpuIvfpqExactDistance(int metric, const float *a, const float *b, int dim);

/* ---- who may read what (common/access.cpp) ---- */
extern void GpuIvfpqCheckSelect(Relation heap);
extern void GpuIvfpqCheckReadable(Relation heap, const char *function);
