// Who may read what: the SQL functions read tables outside the executor, so
// they check the caller's privileges themselves, as pg_prewarm does, and
// refuse tables whose row-level security applies to the caller (they cannot
// apply policies row by row; index scans go through the executor and do).
#include "common/gpu_ivfpq.h"

extern "C" {
#include "access/relation.h"
#include "access/table.h"
#include "catalog/pg_class.h"
#include "commands/defrem.h"
#include "miscadmin.h"
#include "storage/predicate.h"
#include "storage/procarray.h"
#include "utils/acl.h"
#include "utils/guc.h"
#include "utils/rls.h"
#include "utils/snapmgr.h"
}

/*
 * Errors unless the current user may SELECT from the relation relid, read
 * from the catalogs by OID: callable before the relation is locked.
 */
static void
CheckSelectByOid(Oid relid)
{
	AclResult	result = pg_class_aclcheck(relid, GetUserId(), ACL_SELECT);

	if (result != ACLCHECK_OK)
		aclcheck_error(result, get_relkind_objtype(get_rel_relkind(relid)), get_rel_name(relid));
}

/*
 * Errors unless the current user may SELECT from heap. Table-level: the
 * functions return heap TIDs (which column privileges never expose) and,
 * through a partial index, which rows match its predicate.
 */
void
GpuIvfpqCheckSelect(Relation heap)
{
	CheckSelectByOid(RelationGetRelid(heap));
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
	/* As a query of it would say (its indexes are empty too). */
	if (!RelationIsPopulated(heap))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("materialized view \"%s\" has not been populated", RelationGetRelationName(heap)),
				 errhint("Use the REFRESH MATERIALIZED VIEW command.")));
	if (check_enable_rls(RelationGetRelid(heap), InvalidOid, true) == RLS_ENABLED)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("%s cannot read table \"%s\": row-level security applies to it",
						function, RelationGetRelationName(heap)),
				 errdetail("The gpu_ivfpq functions read rows outside the executor and cannot apply the table's policies."),
				 errhint("Query the table with ORDER BY ... LIMIT (the index scan applies the policies), or run the function as a role that bypasses row-level security.")));
}

[[noreturn]] static void ReportMissing(Oid relid);

/* Errors for an OID that names no relation (a dropped one, or a number): a user error. */
static void
ReportMissing(Oid relid)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_TABLE),
			 errmsg("relation with OID %u does not exist", relid)));
}

/* Errors for a relation that is not an index of access method amname (named, with relkind and relam). */
static void
CheckIndexOfAm(const char *relname, char relkind, Oid relam, const char *amname)
{
	/* A partitioned index holds no entries: its partitions' indexes do. */
	if (relkind == RELKIND_PARTITIONED_INDEX && relam == get_index_am_oid(amname, false))
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is a partitioned index", relname),
				 errdetail("A partitioned index holds no entries of its own."),
				 errhint("Pass the index of one partition, and combine the partitions' answers.")));
	if (relkind != RELKIND_INDEX || relam != get_index_am_oid(amname, false))
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a %s index", relname, amname),
				 errhint("Pass an index created with USING %s.", amname)));
}

/*
 * Errors for an unlogged (or temporary) table on a standby or during crash
 * recovery: its files are reset and not readable there, as the planner
 * says for a query (get_relation_info), rather than "could not open file".
 */
static void
CheckReadableInRecovery(Relation heap)
{
	if (!RelationIsPermanent(heap) && RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot access temporary or unlogged relations during recovery"),
				 errdetail("\"%s\" is unlogged: a standby holds none of its rows.",
						   RelationGetRelationName(heap)),
				 errhint("Call the function on the primary.")));
}

/*
 * Opens the index indexoid, which must be an index of access method amname,
 * and its table, both AccessShareLock, for the SQL function function (an
 * index regclass argument). In core's order (as amcheck and index_open's
 * callers do): what the catalogs say is checked before any lock (the kind
 * of relation, and the caller's SELECT privilege on the table, so that a
 * caller who may not read it never queues for a lock, let alone holds one
 * on the index while it waits), then the table is locked before the index,
 * as DDL locks them (the index first would deadlock with a DROP INDEX by a
 * session holding the table), and the index is checked again once locked:
 * it could have been dropped, and its OID reused, in between. rows: the
 * function returns the table's rows or distances (GpuIvfpqCheckReadable);
 * else it only loads the index, which takes SELECT as pg_prewarm does.
 */
void
GpuIvfpqOpenIndexChecked(Oid indexoid, const char *amname, const char *function, bool rows,
						 Relation *index, Relation *heap)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(indexoid));
	Form_pg_class form;
	Oid			heapoid;

	if (!HeapTupleIsValid(tuple))
		ReportMissing(indexoid);
	form = (Form_pg_class) GETSTRUCT(tuple);
	CheckIndexOfAm(NameStr(form->relname), form->relkind, form->relam, amname);
	ReleaseSysCache(tuple);
	heapoid = IndexGetRelation(indexoid, true);
	if (!OidIsValid(heapoid))
		ReportMissing(indexoid);
	CheckSelectByOid(heapoid);

	LockRelationOid(heapoid, AccessShareLock);
	*index = try_relation_open(indexoid, AccessShareLock);
	if (*index == NULL)
		ReportMissing(indexoid);
	CheckIndexOfAm(RelationGetRelationName(*index), (*index)->rd_rel->relkind, (*index)->rd_rel->relam,
				   amname);
	if ((*index)->rd_index->indrelid != heapoid)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("the table of index \"%s\" changed while %s opened it",
						RelationGetRelationName(*index), function),
				 errhint("Call %s again.", function)));
	/*
	 * An index a concurrent build has not finished (or left behind when it
	 * failed) lacks rows, and one whose HOT chains a snapshot older than it
	 * may see wrongly (indcheckxmin) is not for this transaction: the
	 * planner uses neither, nor does this function.
	 */
	if (!(*index)->rd_index->indisvalid || !(*index)->rd_index->indisready)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("index \"%s\" is not valid", RelationGetRelationName(*index)),
				 errdetail("A failed CREATE INDEX CONCURRENTLY or REINDEX CONCURRENTLY leaves an invalid index."),
				 errhint("Drop the index or REINDEX it.")));
	if ((*index)->rd_index->indcheckxmin &&
		!TransactionIdPrecedes(HeapTupleHeaderGetXmin((*index)->rd_indextuple->t_data), TransactionXmin))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("index \"%s\" is too new for this transaction's snapshot",
						RelationGetRelationName(*index)),
				 errhint("Call %s in a transaction that started after the index was built.", function)));
	*heap = table_open(heapoid, NoLock);
	CheckReadableInRecovery(*heap);
	if (rows)
	{
		GpuIvfpqCheckReadable(*heap, function);
		/*
		 * As index_beginscan does for an access method without predicate
		 * locks of its own: the whole index is read, so under SERIALIZABLE
		 * any insert into it conflicts (else a search that found nothing
		 * would hold no lock, and a write skew would commit).
		 */
		PredicateLockRelation(*index, GetActiveSnapshot());
	}
}

/* Errors unless a relation of relkind (named relname) has rows to scan: a table or a materialized view. */
static void
CheckScannable(const char *relname, char relkind)
{
	/* Views, partitioned and foreign tables have no table AM to scan. */
	if (relkind != RELKIND_RELATION && relkind != RELKIND_MATVIEW)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table or materialized view", relname),
				 errhint("Pass a table or a materialized view; for a partitioned table, search its partitions.")));
}

/*
 * Opens the table relid for function (a table regclass argument),
 * AccessShareLock, with GpuIvfpqOpenIndexChecked's order: its kind (a table
 * or a materialized view) and the caller's SELECT privilege checked before
 * the lock, the kind again once locked, then GpuIvfpqCheckReadable.
 */
Relation
GpuIvfpqOpenTableChecked(Oid relid, const char *function)
{
	char		relkind = get_rel_relkind(relid);
	char	   *relname = get_rel_name(relid);
	Relation	heap;

	if (relkind == '\0' || relname == NULL)
		ReportMissing(relid);
	CheckScannable(relname, relkind);
	CheckSelectByOid(relid);
	heap = try_relation_open(relid, AccessShareLock);
	if (heap == NULL)
		ReportMissing(relid);
	CheckScannable(RelationGetRelationName(heap), heap->rd_rel->relkind);
	CheckReadableInRecovery(heap);
	GpuIvfpqCheckReadable(heap, function);
	return heap;
}

void
GpuIvfpqBecomeOwner(Relation heap, GpuIvfpqSavedUser *saved)
{
	GetUserIdAndSecContext(&saved->userid, &saved->sec_context);
	SetUserIdAndSecContext(heap->rd_rel->relowner, saved->sec_context | SECURITY_RESTRICTED_OPERATION);
	saved->nest = NewGUCNestLevel();
	/* The caller's search_path would let the caller's objects stand in for the owner's. */
	GpuIvfpqRestrictSearchPath();
}

void
GpuIvfpqRestoreUser(const GpuIvfpqSavedUser *saved)
{
	AtEOXact_GUC(false, saved->nest);
	SetUserIdAndSecContext(saved->userid, saved->sec_context);
}
