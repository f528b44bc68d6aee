// Who may read what: the SQL functions read tables outside the executor, so
// they check the caller's privileges themselves, as pg_prewarm does, and
// refuse tables whose row-level security applies to the caller (they cannot
// apply policies row by row; index scans go through the executor and do).
#include "common/gpu_ivfpq.h"

extern "C" {
#include "catalog/pg_class.h"
#include "utils/acl.h"
#include "utils/rls.h"
}

/*
 * Errors unless the current user may SELECT from heap. Table-level: the
 * functions return heap TIDs (which column privileges never expose) and,
 * through a partial index, which rows match its predicate.
 */
void
GpuIvfpqCheckSelect(Relation heap)
{
	AclResult	result = pg_class_aclcheck(RelationGetRelid(heap), GetUserId(), ACL_SELECT);

	if (result != ACLCHECK_OK)
		aclcheck_error(result, get_relkind_objtype(heap->rd_rel->relkind), RelationGetRelationName(heap));
}

/*
 * For functions that return rows or distances of heap: GpuIvfpqCheckSelect,
 * no row-level security policy may apply to the user on heap, and heap must
 * hold its rows (not be a Citus table's shell, GpuIvfpqCheckNotCitusShell).
 */
void
GpuIvfpqCheckReadable(Relation heap, const char *function)
{
	GpuIvfpqCheckSelect(heap);
	GpuIvfpqCheckNotCitusShell(heap, function);
	if (check_enable_rls(RelationGetRelid(heap), InvalidOid, true) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("%s cannot read table \"%s\": row-level security applies to it",
						function, RelationGetRelationName(heap)),
				 errdetail("The gpu_ivfpq functions read rows outside the executor and cannot apply the table's policies."),
				 errhint("Query the table with ORDER BY ... LIMIT (the index scan applies the policies), or run the function as a role that bypasses row-level security.")));
}
