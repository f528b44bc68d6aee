// The access method handler: index options, cost estimate, operator class
// validation and properties.
#include <cfloat>

#include "am/am.h"

extern "C" {
#include "optimizer/plancat.h"
#include "utils/spccache.h"
}

extern "C" {
PG_FUNCTION_INFO_V1(gpu_ivfpq_handler);
}

static relopt_kind gpu_ivfpq_relopt_kind;

static relopt_enum_elt_def placement_values[] = {
	{"auto", GPU_IVFPQ_PLACEMENT_AUTO},
	{"replicate", GPU_IVFPQ_PLACEMENT_REPLICATE},
	{"shard", GPU_IVFPQ_PLACEMENT_SHARD},
	{(const char *) NULL}
};

/* Registers the index options (lists, m, nbits, store_vectors, placement); called once from _PG_init. */
void
GpuIvfpqRegisterOptions(void)
{
	gpu_ivfpq_relopt_kind = add_reloption_kind();
	add_int_reloption(gpu_ivfpq_relopt_kind, "lists", "Number of inverted lists (coarse centroids)",
					  GPU_IVFPQ_DEFAULT_LISTS, 1, GPU_IVFPQ_MAX_LISTS, AccessExclusiveLock);
	add_int_reloption(gpu_ivfpq_relopt_kind, "m",
					  "Number of PQ sub-quantizers, a divisor of the dimension (0 = chosen from it)",
					  0, 0, GPU_IVFPQ_MAX_M, AccessExclusiveLock);
	add_int_reloption(gpu_ivfpq_relopt_kind, "nbits", "Bits per PQ sub-quantizer code (8 only)",
					  GPU_IVFPQ_NBITS, GPU_IVFPQ_NBITS, GPU_IVFPQ_NBITS, AccessExclusiveLock);
	add_bool_reloption(gpu_ivfpq_relopt_kind, "store_vectors",
					   "Keep each row's exact vector in the index, for re-ranking on the GPU and without heap reads",
					   true, AccessExclusiveLock);
	/* Read when a mirror loads: changing it takes effect at the next load, no rebuild. */
	add_enum_reloption(gpu_ivfpq_relopt_kind, "placement",
					   "How the GPU service places the index over several GPUs: auto, replicate or shard",
					   placement_values, GPU_IVFPQ_PLACEMENT_AUTO,
					   "Valid values are \"auto\", \"replicate\" and \"shard\".", ShareUpdateExclusiveLock);
}

/* amoptions: parses WITH (lists, m, nbits, store_vectors, placement). */
bytea *
gpuivfpqoptions(Datum reloptions, bool validate)
{
	static const relopt_parse_elt tab[] = {
		{"lists", RELOPT_TYPE_INT, offsetof(GpuIvfpqOptions, lists)},
		{"m", RELOPT_TYPE_INT, offsetof(GpuIvfpqOptions, m)},
		{"nbits", RELOPT_TYPE_INT, offsetof(GpuIvfpqOptions, nbits)},
		{"store_vectors", RELOPT_TYPE_BOOL, offsetof(GpuIvfpqOptions, store_vectors)},
		{"placement", RELOPT_TYPE_ENUM, offsetof(GpuIvfpqOptions, placement)},
	};

	return (bytea *) build_reloptions(reloptions, validate, gpu_ivfpq_relopt_kind,
									  sizeof(GpuIvfpqOptions), tab, lengthof(tab));
}

/*
 * The built index as the cost estimate needs it: its lists, and whether its
 * entries hold codes and vector copies. The metapage says, not the options:
 * an index built on an empty table (as Citus builds a shard's index when
 * the index existed before the table was distributed, or when the table was
 * empty) is untrained whatever its options say, and store_vectors is
 * ignored where a vector does not fit a page. False when block 0 is not a
 * readable metapage of this format: planning then goes by the options, and
 * a damaged page is reported by the scan that reads it, not by the planner.
 */
static bool
PeekMeta(Relation index, GpuIvfpqMetaPageData *meta)
{
	Buffer		buf;
	Page		page;
	bool		ok;
	uint8		trained;

	if (RelationGetNumberOfBlocks(index) == 0)
		return false;
	buf = ReadBuffer(index, GPU_IVFPQ_METAPAGE_BLKNO);
	LockBuffer(buf, BUFFER_LOCK_SHARE);
	page = BufferGetPage(buf);
	ok = GpuIvfpqPageIsKind(page, GPU_IVFPQ_PAGE_META);
	if (ok)
		memcpy(meta, GpuIvfpqPageGetMeta(page), sizeof(GpuIvfpqMetaPageData));
	UnlockReleaseBuffer(buf);
	if (!ok)
		return false;
	/* A bool holding neither 0 nor 1 must not be read as a bool. */
	memcpy(&trained, &meta->trained, 1);
	return meta->magic == GPU_IVFPQ_MAGIC && meta->version == GPU_IVFPQ_VERSION &&
		meta->lists >= 1 && trained <= 1;
}

/*
 * What one exact distance costs, as a sequential scan is charged for it:
 * the operator's function cost (cpu_operator_cost for an expression that is
 * not an operator call).
 */
double
GpuIvfpqOperatorCost(PlannerInfo *root, Expr *expr)
{
	QualCost	cost;

	if (!IsA(expr, OpExpr))
		return cpu_operator_cost;
	cost.startup = 0;
	cost.per_tuple = 0;
	add_function_cost(root, get_opcode(((OpExpr *) expr)->opno), (Node *) expr, &cost);
	return Max(cost.per_tuple, cpu_operator_cost);
}

/*
 * amcostestimate: the index only serves ORDER BY <op> LIMIT; without an
 * ORDER BY it must never be chosen. All work happens before the first row,
 * so startup cost equals total cost.
 */
void
gpuivfpqcostestimate(PlannerInfo *root, IndexPath *path, double loop_count,
					 Cost *indexStartupCost, Cost *indexTotalCost,
					 Selectivity *indexSelectivity, double *indexCorrelation,
					 double *indexPages)
{
	GenericCosts costs;
	int			lists = GPU_IVFPQ_DEFAULT_LISTS;
	bool		copies = true;	/* store_vectors: the re-rank reads no heap row */
	bool		trained = true;
	double		ratio;
	double		rerank;
	Relation	index;
	GpuIvfpqMetaPageData meta;

	if (path->indexorderbys == NIL)
	{
		*indexStartupCost = DBL_MAX;
		*indexTotalCost = DBL_MAX;
		*indexSelectivity = 0;
		*indexCorrelation = 0;
		*indexPages = 0;
		return;
	}

	index = index_open(path->indexinfo->indexoid, NoLock);
	if (PeekMeta(index, &meta))
	{
		lists = (int) meta.lists;
		trained = meta.trained;
		copies = trained && (meta.features & GPU_IVFPQ_FEATURE_VECTORS) != 0;
	}
	else if (index->rd_options)
	{
		lists = ((GpuIvfpqOptions *) index->rd_options)->lists;
		copies = ((GpuIvfpqOptions *) index->rd_options)->store_vectors;
	}
	index_close(index, NoLock);

	ratio = Min(1.0, (double) gpu_ivfpq_probes / Max(lists, 1));
	MemSet(&costs, 0, sizeof(costs));
	costs.numIndexTuples = path->indexinfo->tuples * ratio;
	genericcostestimate(root, path, loop_count, &costs);

	/*
	 * genericcostestimate charges each index page a random read; a list's
	 * pages are read in chain order and lie mostly together (a build writes
	 * each list at once), so they cost sequential reads. Random reads made
	 * the probed share of an index with vector copies (14 times the pages
	 * of one without) look dearer than a parallel sequential scan that is
	 * a hundred times slower.
	 */
	{
		double		spc_random;
		double		spc_seq;

		get_tablespace_page_costs(path->indexinfo->reltablespace, &spc_random, &spc_seq);
		costs.indexTotalCost -= costs.numIndexPages * Max(spc_random - spc_seq, 0.0);
	}

	/*
	 * Each re-ranked candidate costs an exact distance from the vector copy
	 * in its entry or, in an index without copies, a heap fetch as well
	 * (the executor's fetch of the rows returned is the planner's own). An
	 * untrained index re-ranks every row from the heap: a sequential scan
	 * does the same work without the fetches by TID, and should win.
	 */
	rerank = trained ? Min((double) gpu_ivfpq_rerank, path->indexinfo->rel->tuples)
		: path->indexinfo->rel->tuples;
	costs.indexTotalCost += rerank * (copies ? cpu_operator_cost + cpu_index_tuple_cost
									  : random_page_cost / 4 + cpu_tuple_cost);
	*indexStartupCost = costs.indexTotalCost;
	*indexTotalCost = costs.indexTotalCost;
	*indexSelectivity = costs.indexSelectivity;
	*indexCorrelation = 0;
	*indexPages = costs.numIndexPages;
}

/*
 * amvalidate of a filter column's operator class (an integer type): search
 * operators 1-5 (B-tree's <, <=, =, >=, >) and no support functions.
 */
static bool
ValidateFilterClass(Form_pg_opclass classform)
{
	bool		result = true;
	CatCList   *oprlist = SearchSysCacheList1(AMOPSTRATEGY, ObjectIdGetDatum(classform->opcfamily));
	CatCList   *proclist = SearchSysCacheList1(AMPROCNUM, ObjectIdGetDatum(classform->opcfamily));

	for (int i = 0; i < oprlist->n_members; i++)
	{
		Form_pg_amop op = (Form_pg_amop) GETSTRUCT(&oprlist->members[i]->tuple);

		if (op->amopstrategy < BTLessStrategyNumber || op->amopstrategy > BTGreaterStrategyNumber ||
			op->amoppurpose != AMOP_SEARCH)
		{
			ereport(INFO,
					(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
					 errmsg("gpu_ivfpq filter operator family contains operator %u with strategy %d; only search operators 1 to 5 are supported",
							op->amopopr, op->amopstrategy)));
			result = false;
		}
	}
	if (proclist->n_members > 0)
	{
		ereport(INFO,
				(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
				 errmsg("gpu_ivfpq filter operator family has support functions; it takes none")));
		result = false;
	}
	ReleaseCatCacheList(proclist);
	ReleaseCatCacheList(oprlist);
	return result;
}

/*
 * amvalidate: a vector operator class has ORDER BY operator 1 and support
 * functions 1 and 2; a filter column's (integer) class, search operators.
 */
bool
gpuivfpqvalidate(Oid opclassoid)
{
	bool		result = true;
	HeapTuple	classtup = SearchSysCache1(CLAOID, ObjectIdGetDatum(opclassoid));
	Form_pg_opclass classform;
	CatCList   *oprlist;
	CatCList   *proclist;
	bool		have_proc[3] = {false, false, false};
	bool		have_op = false;

	if (!HeapTupleIsValid(classtup))
		elog(ERROR, "cache lookup failed for operator class %u", opclassoid);
	classform = (Form_pg_opclass) GETSTRUCT(classtup);
	if (classform->opcintype == INT2OID || classform->opcintype == INT4OID ||
		classform->opcintype == INT8OID)
	{
		result = ValidateFilterClass(classform);
		ReleaseSysCache(classtup);
		return result;
	}

	oprlist = SearchSysCacheList1(AMOPSTRATEGY, ObjectIdGetDatum(classform->opcfamily));
	for (int i = 0; i < oprlist->n_members; i++)
	{
		Form_pg_amop op = (Form_pg_amop) GETSTRUCT(&oprlist->members[i]->tuple);

		if (op->amopstrategy != 1 || op->amoppurpose != AMOP_ORDER)
		{
			ereport(INFO,
					(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
					 errmsg("gpu_ivfpq operator family contains operator %u with strategy %d; only ORDER BY operator 1 is supported",
							op->amopopr, op->amopstrategy)));
			result = false;
		}
		else
			have_op = true;
	}
	proclist = SearchSysCacheList1(AMPROCNUM, ObjectIdGetDatum(classform->opcfamily));
	for (int i = 0; i < proclist->n_members; i++)
	{
		Form_pg_amproc proc = (Form_pg_amproc) GETSTRUCT(&proclist->members[i]->tuple);

		if (proc->amprocnum < 1 || proc->amprocnum > 2)
		{
			ereport(INFO,
					(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
					 errmsg("gpu_ivfpq operator family contains invalid support function number %d",
							proc->amprocnum)));
			result = false;
		}
		else
			have_proc[proc->amprocnum] = true;
	}
	if (!have_op || !have_proc[1] || !have_proc[2])
	{
		ereport(INFO,
				(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
				 errmsg("gpu_ivfpq operator class needs ORDER BY operator 1 and support functions 1 and 2")));
		result = false;
	}
	ReleaseCatCacheList(proclist);
	ReleaseCatCacheList(oprlist);
	ReleaseSysCache(classtup);
	return result;
}

/*
 * amproperty of both access methods: the indexed (first) column can be
 * ordered by distance (core leaves this property to the AM, as only
 * ordering-by-operator AMs know it).
 */
bool
GpuIvfpqDistanceOrderableProperty(Oid index_oid, int attno, IndexAMProperty prop, const char *propname,
								  bool *res, bool *isnull)
{
	if (attno == 1 && prop == AMPROP_DISTANCE_ORDERABLE)
	{
		*res = true;
		*isnull = false;
		return true;
	}
	return false;
}

/* The access method handler: every IndexAmRoutine field is set. */
Datum
gpu_ivfpq_handler(PG_FUNCTION_ARGS)
{
	IndexAmRoutine *am = makeNode(IndexAmRoutine);

	am->amstrategies = 0;
	am->amsupport = 2;
	am->amoptsprocnum = 0;
	am->amcanorder = false;
	am->amcanorderbyop = true;
	am->amcanbackward = false;
	am->amcanunique = false;
	am->amcanmulticol = true;	/* the vector, then one integer filter column */
	am->amoptionalkey = true;
	am->amsearcharray = false;
	am->amsearchnulls = false;
	am->amstorage = false;
	am->amclusterable = false;
	am->ampredlocks = false;
	am->amcanparallel = false;
	am->amcaninclude = false;
	am->amusemaintenanceworkmem = false;
	am->amparallelvacuumoptions = VACUUM_OPTION_PARALLEL_BULKDEL;
	am->amkeytype = InvalidOid;

	am->ambuild = gpuivfpqbuild;
	am->ambuildempty = gpuivfpqbuildempty;
	am->aminsert = gpuivfpqinsert;
	am->ambulkdelete = gpuivfpqbulkdelete;
	am->amvacuumcleanup = gpuivfpqvacuumcleanup;
	am->amcanreturn = NULL;
	am->amcostestimate = gpuivfpqcostestimate;
	am->amoptions = gpuivfpqoptions;
	am->amproperty = GpuIvfpqDistanceOrderableProperty;
	am->ambuildphasename = gpuivfpqbuildphasename;
	am->amvalidate = gpuivfpqvalidate;
	am->amadjustmembers = NULL;
	am->ambeginscan = gpuivfpqbeginscan;
	am->amrescan = gpuivfpqrescan;
	am->amgettuple = gpuivfpqgettuple;
	am->amgetbitmap = NULL;
	am->amendscan = gpuivfpqendscan;
	am->ammarkpos = NULL;
	am->amrestrpos = NULL;
	am->amestimateparallelscan = NULL;
	am->aminitparallelscan = NULL;
	am->amparallelrescan = NULL;

	PG_RETURN_POINTER(am);
}
