// The GPU service as the access method and the SQL functions see it:
// searches, mirror coherence, builds and exact search on the service's
// device. Each returns "not served" (false or -1) when the GPU cannot help,
// and the caller runs the CPU engine (gpu_ivfpq.device = gpu: an error).
#pragma once

#include "am/am.h"
#include "gpu_process/answer_dists.h"

/* ---- setup (service/shmem.cpp, service/change_log.cpp) and searches (service/search_client.cpp) ---- */
extern void GpuIvfpqServiceRegister(void);
extern void GpuIvfpqServiceInstallHooks(void);
extern void GpuIvfpqCountCpuQuery(void);
extern bool GpuIvfpqServiceWanted(void);
/* The error of gpu_ivfpq.device = gpu when the GPU cannot serve what (reason says why). */
[[noreturn]] extern void GpuIvfpqGpuRequiredError(const char *what, const char *reason);
extern bool GpuIvfpqServiceCanServe(const GpuIvfpqMetaPageData *meta);
extern int	GpuIvfpqServiceSearch(Relation index, const GpuIvfpqMetaPageData *meta, const float *query,
								  int k, int nprobe, const GpuIvfpqKeyRange *range, int64 *matched,
								  int64 *labels, double *exact, GpuIvfpqAnswerDists *dists, int *batch);
extern bool GpuIvfpqServiceSearchBatch(Relation index, const GpuIvfpqMetaPageData *meta,
									   const float *queries, int64 nq, int k, int nprobe, bool brute,
									   int64 *labels, double *exact, GpuIvfpqAnswerDists *dists,
									   dsm_segment **keep);
extern void GpuIvfpqServiceLogAppend(Relation index, const GpuIvfpqMetaPageData *meta, int list,
									 int64 label, const uint8 *code, const float *vector,
									 const char *filter_key);
extern void GpuIvfpqServiceInvalidate(Relation index, bool wait);
extern uint64 GpuIvfpqServiceLogRemove(Relation index, const GpuIvfpqMetaPageData *meta,
									   const int64 *labels, int n);
extern uint64 GpuIvfpqServiceLogInvalidate(Relation index);
extern uint64 GpuIvfpqServiceLogPosition(void);
extern void GpuIvfpqServiceWaitApplied(uint64 pos);

/* Most labels a VACUUM removes from a mirror in place (more: the mirror is reloaded). */
#define GPU_IVFPQ_REMOVE_IN_PLACE_MAX 65536

/* Index builds on the service's device (service/build_client.cpp). */
typedef struct GpuIvfpqRemoteEncoder GpuIvfpqRemoteEncoder;
extern bool GpuIvfpqServiceTrain(const float *sample, int64 n, int d, int lists, int m, int metric,
								 int iterations, int max_points_per_centroid, uint64 seed,
								 float *centroids, float *codebooks);
extern GpuIvfpqRemoteEncoder *GpuIvfpqServiceEncoderBegin(const float *centroids, const void *model,
														  int d, int lists, int m, int metric,
														  int rabitq_bits, int *capacity);
extern float *GpuIvfpqServiceEncoderRows(GpuIvfpqRemoteEncoder *enc);
extern bool GpuIvfpqServiceEncode(GpuIvfpqRemoteEncoder *enc, int n, int32 *lists, uint8 *codes);
extern void GpuIvfpqServiceEncoderEnd(GpuIvfpqRemoteEncoder *enc);
extern bool GpuIvfpqServiceExact(const float *queries, int64 nq, const float *base, int64 n, int d,
								 int metric, int k, float *dist, int64 *labels);
