// What every PostgreSQL-side file of gpu_ivfpq shares: the settings (GUCs),
// the limits, and the vector formats (real[], pgvector's vector and
// halfvec). The access method's format is in am/am.h, the GPU service's API
// in service/service.h.
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
extern int	gpu_ivfpq_model_cache_memory_mb;
extern int	gpu_ivfpq_device;
extern int	gpu_ivfpq_gpu_memory_budget_kb;
extern int	gpu_ivfpq_batch_size;
extern int	gpu_ivfpq_batch_wait_us;
extern int	gpu_ivfpq_gpu_poll_us;
extern int	gpu_ivfpq_gpu_timeout_s;
extern bool gpu_ivfpq_service_emulate_gpu;
extern int	gpu_ivfpq_service_emulate_devices;
extern char *gpu_ivfpq_device_list;	/* gpu_ivfpq.devices */
extern int	gpu_ivfpq_placement;
extern int	gpu_ivfpq_batches_in_flight;

/* gpu_ivfpq.placement and the placement index option (values of gpuivfpq::Placement) */
#define GPU_IVFPQ_PLACEMENT_AUTO		0
#define GPU_IVFPQ_PLACEMENT_REPLICATE	1
#define GPU_IVFPQ_PLACEMENT_SHARD		2

/* gpu_ivfpq.device */
#define GPU_IVFPQ_DEVICE_AUTO	0
#define GPU_IVFPQ_DEVICE_GPU	1
#define GPU_IVFPQ_DEVICE_CPU	2

/* Most candidates one GPU round selects (WarpSelect / BlockSelect queues). */
#define GPU_IVFPQ_SERVICE_MAX_K ((int) gpuivfpq::kMaxSelectK)

/*
 * ---- vector types ----
 * How a column or an argument stores its vectors. The index, the GPU and
 * the engine work on float4 whatever the format: every value is read
 * through GpuIvfpqDatumVector (common/vector.cpp), which decodes pgvector's
 * types with common/pgvector.cpp.
 */
typedef enum GpuIvfpqVectorFormat
{
	GPU_IVFPQ_FORMAT_NONE = 0,	/* not a vector type gpu_ivfpq reads */
	GPU_IVFPQ_FORMAT_REAL_ARRAY,	/* real[] */
	GPU_IVFPQ_FORMAT_VECTOR,	/* pgvector's vector: float4 elements */
	GPU_IVFPQ_FORMAT_HALFVEC	/* pgvector's halfvec: IEEE half elements */
} GpuIvfpqVectorFormat;

/* ---- vectors and distances (common/vector.cpp) ---- */
extern const float *GpuIvfpqArrayVector(ArrayType *arr, int *dim, const char *what);
extern const float *GpuIvfpqDatumVector(Datum value, GpuIvfpqVectorFormat format, int *dim,
										const char *what);
extern void GpuIvfpqCheckIndexableDim(int dim);
/* Errors out (naming what) unless every one of the n values is finite. */
extern void GpuIvfpqCheckFinite(const float *v, int n, const char *what);
extern const float *GpuIvfpqStoredVector(Datum value, GpuIvfpqVectorFormat format, int *dim);
extern double GpuIvfpqExactDistance(int metric, const float *a, const float *b, int dim);

/* ---- pgvector's types (common/pgvector.cpp) ---- */
extern GpuIvfpqVectorFormat GpuIvfpqFormatOfType(Oid typid);
extern GpuIvfpqVectorFormat GpuIvfpqIndexFormat(Relation index);
extern GpuIvfpqVectorFormat GpuIvfpqArgFormat(FunctionCallInfo fcinfo, int argno, bool *is_array);
extern const char *GpuIvfpqFormatName(GpuIvfpqVectorFormat format);
extern const float *GpuIvfpqPgvectorElements(Datum value, GpuIvfpqVectorFormat format, int *dim,
											 const char *what);

/* ---- who may read what (common/access.cpp) ---- */
extern void GpuIvfpqCheckSelect(Relation heap);
extern void GpuIvfpqCheckReadable(Relation heap, const char *function);
extern void GpuIvfpqOpenIndexChecked(Oid indexoid, const char *amname, const char *function, bool rows,
									 Relation *index, Relation *heap);
extern Relation GpuIvfpqOpenTableChecked(Oid relid, const char *function);

/*
 * Running a table owner's code (an index's expressions and predicate): as
 * that owner under SECURITY_RESTRICTED_OPERATION, with search_path
 * "pg_catalog, pg_temp" and the settings it changes undone at the end, as
 * CREATE INDEX and ANALYZE run it from PostgreSQL 17 on. An error in
 * between unwinds both with the (sub)transaction.
 */
typedef struct GpuIvfpqSavedUser
{
	Oid			userid;
	int			sec_context;
	int			nest;
} GpuIvfpqSavedUser;
extern void GpuIvfpqBecomeOwner(Relation heap, GpuIvfpqSavedUser *saved);
extern void GpuIvfpqRestoreUser(const GpuIvfpqSavedUser *saved);

/* ---- Citus, found by name when installed (common/citus.cpp) ---- */
extern bool GpuIvfpqIsCitusShell(Oid relid);
extern void GpuIvfpqCheckNotCitusShell(Relation heap, const char *function);
