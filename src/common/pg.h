// The PostgreSQL headers the extension uses, with C linkage for C++.
#pragma once

#include <climits>

extern "C" {
#include "postgres.h"

#include "access/amapi.h"
#include "access/generic_xlog.h"
#include "access/genam.h"
#include "access/relscan.h"
#include "access/reloptions.h"
#include "access/tableam.h"
#include "catalog/index.h"
#include "catalog/pg_type.h"
#include "common/pg_prng.h"
#include "access/xlog.h"
#include "access/xloginsert.h"
#include "storage/smgr.h"
#include "utils/selfuncs.h"
#include "optimizer/optimizer.h"
#include "pgstat.h"
#include "utils/lsyscache.h"
#include "utils/syscache.h"
#include "utils/catcache.h"
#include "catalog/pg_opclass.h"
#include "catalog/pg_amop.h"
#include "catalog/pg_amproc.h"
#include "access/htup_details.h"
#include "executor/executor.h"
#include "utils/float.h"
#include "commands/progress.h"
#include "commands/vacuum.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "storage/buf_internals.h"
#include "storage/bufpage.h"
#include "storage/lmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/timestamp.h"
#include "portability/instr_time.h"
#include "postmaster/autovacuum.h"
}

/*
 * PostgreSQL 15 to 18 from one source: every difference between the major
 * versions that the extension meets is bridged here, and only here, so that
 * the rest of the code reads as one version. A new major version adds its
 * guards to this block.
 */
#if PG_VERSION_NUM < 150000
#error "gpu_ivfpq needs PostgreSQL 15 or later"
#endif

/*
 * The relation's physical file: RelFileNode (15) became RelFileLocator in 16,
 * its relNode the relNumber, and SMgrRelation's smgr_rnode the smgr_rlocator.
 */
#if PG_VERSION_NUM >= 160000
typedef RelFileLocator GpuIvfpqRelFile;
#define GpuIvfpqRelFileOf(rel) ((rel)->rd_locator)
#define GpuIvfpqRelFileNumberOf(rel) ((rel)->rd_locator.relNumber)
#define GpuIvfpqRelFileEquals(a, b) RelFileLocatorEquals(a, b)
#define GpuIvfpqSmgrRelFile(rel) (&RelationGetSmgr(rel)->smgr_rlocator.locator)
#define GpuIvfpqFirstRelFileSubid(rel) ((rel)->rd_firstRelfilelocatorSubid)
#else
typedef RelFileNode GpuIvfpqRelFile;
#define GpuIvfpqRelFileOf(rel) ((rel)->rd_node)
#define GpuIvfpqRelFileNumberOf(rel) ((rel)->rd_node.relNode)
#define GpuIvfpqRelFileEquals(a, b) RelFileNodeEquals(a, b)
#define GpuIvfpqSmgrRelFile(rel) (&RelationGetSmgr(rel)->smgr_rnode.node)
#define GpuIvfpqFirstRelFileSubid(rel) ((rel)->rd_firstRelfilenodeSubid)
#endif

/* VACUUM's cost-based delay: 18 asks whether ANALYZE is the caller. */
#if PG_VERSION_NUM >= 180000
#define GpuIvfpqVacuumDelayPoint() vacuum_delay_point(false)
#else
#define GpuIvfpqVacuumDelayPoint() vacuum_delay_point()
#endif

/*
 * search_path while another role's code runs (an index's expressions under
 * its table's owner): "pg_catalog, pg_temp", as 17's maintenance commands
 * set it with RestrictSearchPath(); spelled out before 17.
 */
#if PG_VERSION_NUM >= 170000
#define GpuIvfpqRestrictSearchPath() RestrictSearchPath()
#else
#define GpuIvfpqRestrictSearchPath() \
	((void) set_config_option("search_path", "pg_catalog, pg_temp", PGC_USERSET, PGC_S_SESSION, \
							  GUC_ACTION_SAVE, true, 0, false))
#endif

/* Whether this process is an autovacuum worker: 17 replaced the function by a macro. */
#if PG_VERSION_NUM >= 170000
#define GpuIvfpqInAutovacuumWorker() AmAutoVacuumWorkerProcess()
#else
#define GpuIvfpqInAutovacuumWorker() IsAutoVacuumWorkerProcess()
#endif

/*
 * An index path the cost estimate refuses (gpu_ivfpq without ORDER BY,
 * gpu_metric without a clause): through 17 its infinite cost loses to every
 * other path, disabled ones included (they cost disable_cost). From 18 the
 * planner compares the count of disabled nodes before costs, so with
 * enable_seqscan = off such a path would beat the disabled sequential scan
 * (SELECT count(*) through an index that returns only the lists it probes):
 * counting it as two disabled nodes makes it lose to that scan, whose count
 * is one.
 */
#if PG_VERSION_NUM >= 180000
#define GpuIvfpqRefuseIndexPath(path) ((path)->path.disabled_nodes = 2)
#else
#define GpuIvfpqRefuseIndexPath(path) ((void) (path))
#endif

/*
 * The IndexAmRoutine fields that the versions after 15 added, each set to
 * what the extension's access methods do: no summarizing (16), no parallel
 * build and no insert cleanup (17), no equality or ordering consistency
 * promise, no hashing, no strategy translation, no tree height (18).
 * Both handlers call it after setting the fields that every version has.
 */
static inline void
GpuIvfpqSetNewerAmFields(IndexAmRoutine *am)
{
#if PG_VERSION_NUM >= 160000
	am->amsummarizing = false;
#endif
#if PG_VERSION_NUM >= 170000
	am->amcanbuildparallel = false;
	am->aminsertcleanup = NULL;
#endif
#if PG_VERSION_NUM >= 180000
	am->amconsistentequality = false;
	am->amconsistentordering = false;
	am->amcanhash = false;
	am->amgettreeheight = NULL;
	am->amtranslatestrategy = NULL;
	am->amtranslatecmptype = NULL;
#endif
	(void) am;
}
