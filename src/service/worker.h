// The service's own declarations, shared by its three files: worker.cpp
// (the state, the supervision of the GPU process and the main loop),
// log_apply.cpp (the change log applied to the mirrors, and the mirrors of
// dropped databases) and serve.cpp (the requests that carry a DSM segment:
// loads, builds, batch functions, exact search, large gpu_metric calls).
// Everything lives in this one process.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpu_process/gpu_process_client.h"
#include "common/guard.h"
#include "service/shmem.h"

namespace svc {

using gpuivfpq::MirrorKey;
using gpuivfpq::gpuproc::GpuProcess;

/* ---- state (worker.cpp) ---- */
extern std::unique_ptr<GpuProcess> gpu;			/* null while none runs */
extern std::map<MirrorKey, uint64> mirror_from;	/* log entries from here apply */
extern uint64 mirrors_version;			/* bumped by every change of mirror_from */
/* A backend (of request slot slot) told to load a mirror at at; given_up: that slot's count then. */
struct LoadClaim
{
	TimestampTz at;
	int			slot;
	uint32		given_up;
};
extern std::map<MirrorKey, LoadClaim> load_claims;	/* a backend was told to load */
extern uint64 log_cursor;				/* the change log is applied up to here */
extern char *log_vectors;				/* CopyLog's copies of the vector ring's bytes (its size) */
/* The requests taken by the current round (a plain array: it outlives an ERROR). */
extern GpuIvfpqSlot **taken;
extern int	ntaken;

#define LOAD_CLAIM_MS 30000		/* how long others use the CPU while one loads */
/* Loads, builds and exact search move whole indexes: they get this many timeouts. */
#define GPU_BULK_TIMEOUT_FACTOR 10

/* ---- helpers (worker.cpp) ---- */
extern void PublishMirrored(const MirrorKey *loading);
extern uint64 LogHead(void);
extern uint64 NowNs(void);
extern bool GpuUp(void);
extern MirrorKey ToKey(const GpuIvfpqKey &k);
extern GpuProcess *GpuSync(void);
extern RequestResult Failed(bool oom);
extern void RecordError(const std::string &err);
extern void Answer(GpuIvfpqSlot *slot, RequestResult result, const char *error);
extern void PublishStatus(void);
extern size_t BudgetBytes(void);
extern void DropAfterFailure(const MirrorKey &key, const char *what, const std::string &err);

/*
 * Runs device code through the boundary's catch ladder (GpuIvfpqTry): an
 * exception becomes a message for the requester, never an ereport, because
 * the service must answer every request it took.
 */
template <typename F>
static inline bool
Engine(F &&f, std::string &err, bool *oom = nullptr)
{
	GpuIvfpqCaught caught;

	if (GpuIvfpqTry(std::forward<F>(f), &caught))
		return true;
	err = caught.message;
	if (oom != nullptr)
		*oom = caught.out_of_memory;
	return false;
}

/* ---- the change log (log_apply.cpp) ---- */
extern bool CopyLog(uint64 from, uint64 *head, const MirrorKey *only, std::vector<GpuIvfpqLogEntry> &entries,
					bool (*wanted)(const GpuIvfpqLogEntry &));
extern bool AddLogged(const MirrorKey &key, size_t m, const std::vector<const GpuIvfpqLogEntry *> &entries);
extern void DrainLog(void);
extern void CheckDroppedDatabases(void);

/* ---- requests (serve.cpp) ---- */
extern int	Collect(void);
extern void ServeRound(void);

}								/* namespace svc */
