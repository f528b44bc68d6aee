// What gpu_ivfpq knows of Citus: whether a table is the shell of a Citus
// table, found through Citus's catalog by name, so that the extension
// neither links nor requires Citus; and the search functions' refusal of
// such shells.
#include "common/gpu_ivfpq.h"

extern "C" {
#include "access/table.h"
#include "catalog/pg_namespace.h"
#include "utils/fmgroids.h"
}

/*
 * True when relid is listed in Citus's pg_dist_partition: a distributed,
 * reference or Citus local table. Its relation on the coordinator (and on
 * workers that hold Citus's metadata) is a shell: the rows live in the
 * shards, separate tables with their own copies of each index, which Citus
 * creates beside the shell's. Shards themselves are never listed, so an
 * index build on a shard sees false.
 *
 * pg_dist_partition exists only where the citus extension is installed, and
 * it is looked up by name on each call (builds are rare): without Citus the
 * answer is false, and so it is if the catalog's layout is not the one
 * expected (a logicalrelid column holding an oid), rather than an error.
 * The catalog is small (one row per Citus table): a heap scan with a key.
 */
bool
GpuIvfpqIsCitusShell(Oid relid)
{
	Oid			catalog = get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE);
	Relation	rel;
	AttrNumber	attnum;
	Oid			atttype;
	ScanKeyData key;
	SysScanDesc scan;
	bool		found;

	if (!OidIsValid(catalog))
		return false;
	attnum = get_attnum(catalog, "logicalrelid");
	if (attnum == InvalidAttrNumber)
		return false;
	atttype = get_atttype(catalog, attnum);
	if (atttype != REGCLASSOID && atttype != OIDOID)
		return false;

	rel = table_open(catalog, AccessShareLock);
	ScanKeyInit(&key, attnum, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, InvalidOid, false, NULL, 1, &key);
	found = HeapTupleIsValid(systable_getnext(scan));
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * Errors when heap is a Citus table's shell: the search functions read the
 * table or index they are given outside the executor, which Citus does not
 * distribute, and a shell holds no rows (at most stale ones from before the
 * table was distributed), so they would return nothing, or wrong rows,
 * without a word.
 */
void
GpuIvfpqCheckNotCitusShell(Relation heap, const char *function)
{
	if (GpuIvfpqIsCitusShell(RelationGetRelid(heap)))
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("%s cannot search table \"%s\": it is a Citus table, whose rows are in its shards",
						function, RelationGetRelationName(heap)),
				 errdetail("The table here is an empty shell; each shard is a table of its own with its own copy of the index."),
				 errhint("Query the table with ORDER BY ... LIMIT, which Citus runs on every shard, or call the function on each shard (run_command_on_shards).")));
}
