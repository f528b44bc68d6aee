// The gpu_metric access method handler: index options (method, bucket,
// alpha), the cost estimate, operator class validation and properties.
#include <cfloat>

#include "metric/am.h"

extern "C" {
#include "nodes/nodeFuncs.h"
#include "utils/spccache.h"
#include "utils/typcache.h"

PG_FUNCTION_INFO_V1(gpu_metric_handler);
}

static relopt_kind gpu_metric_relopt_kind;

static relopt_enum_elt_def method_values[] = {
	{"lc", GPU_METRIC_METHOD_LC},
	{"sss", GPU_METRIC_METHOD_SSS},
	{(const char *) NULL}
};

/* Registers the index options (method, bucket, alpha); called once from _PG_init. */
void
GpuMetricRegisterOptions(void)
{
	gpu_metric_relopt_kind = add_reloption_kind();
	add_enum_reloption(gpu_metric_relopt_kind, "method",
					   "Search method of a gpu_metric index: lc (List of Clusters) or sss (Sparse Spatial Selection)",
					   method_values, GPU_METRIC_METHOD_LC,
					   "Valid values are \"lc\" and \"sss\".", AccessExclusiveLock);
	add_int_reloption(gpu_metric_relopt_kind, "bucket",
					  "List of Clusters: objects each centre takes into its bucket",
					  GPU_METRIC_DEFAULT_BUCKET, 1, GPU_METRIC_MAX_BUCKET, AccessExclusiveLock);
	add_real_reloption(gpu_metric_relopt_kind, "alpha",
					   "SSS: a new pivot is at least alpha times the largest distance from every other pivot",
					   GPU_METRIC_DEFAULT_ALPHA, 0.0, 1.0, AccessExclusiveLock);
}

/* Whether the option name was given in reloptions (not only defaulted). */
static bool
OptionGiven(List *given, const char *name)
{
	ListCell   *lc;

	foreach(lc, given)
	{
		DefElem    *def = (DefElem *) lfirst(lc);

		if (strcmp(def->defname, name) == 0)
			return true;
	}
	return false;
}

/*
 * amoptions: parses WITH (method, bucket, alpha). Each method's own option
 * is refused with the other method (it would be silently ignored), and
 * alpha must be above 0 (reloptions bound it by [0, 1]).
 */
static bytea *
gpumetricoptions(Datum reloptions, bool validate)
{
	static const relopt_parse_elt tab[] = {
		{"method", RELOPT_TYPE_ENUM, offsetof(GpuMetricOptions, method)},
		{"bucket", RELOPT_TYPE_INT, offsetof(GpuMetricOptions, bucket)},
		{"alpha", RELOPT_TYPE_REAL, offsetof(GpuMetricOptions, alpha)},
	};
	GpuMetricOptions *opts = (GpuMetricOptions *) build_reloptions(reloptions, validate,
																   gpu_metric_relopt_kind,
																   sizeof(GpuMetricOptions),
																   tab, lengthof(tab));

	if (validate && opts != NULL)
	{
		List	   *given = untransformRelOptions(reloptions);

		if (opts->method == GPU_METRIC_METHOD_SSS && OptionGiven(given, "bucket"))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("option \"bucket\" applies to method lc, not sss"),
					 errhint("An sss index takes alpha, for example WITH (method = sss, alpha = 0.5).")));
		if (opts->method == GPU_METRIC_METHOD_LC && OptionGiven(given, "alpha"))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("option \"alpha\" applies to method sss, not lc"),
					 errhint("Add method = sss, or give an lc index its bucket size, for example WITH (method = lc, bucket = 32).")));
		if (!(opts->alpha > 0.0))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("alpha must be greater than 0"),
					 errhint("Valid values are above 0 and at most 1; 0.35 to 0.5 usually work best.")));
	}
	return (bytea *) opts;
}

/*
 * The radius of an indexable range clause when the planner knows it (a
 * constant edit_range), else -1. Read without the checks of execution: the
 * planner only guesses, and a bad radius is reported when the query runs.
 */
static int32
ConstRadius(Expr *clause)
{
	Node	   *arg;
	HeapTupleHeader tuple;
	bool		isnull;
	Datum		r;
	TupleDesc	desc;
	bool		shape;

	if (!IsA(clause, OpExpr) || list_length(((OpExpr *) clause)->args) != 2)
		return -1;
	arg = (Node *) lsecond(((OpExpr *) clause)->args);
	if (!IsA(arg, Const) || ((Const *) arg)->constisnull)
		return -1;
	tuple = DatumGetHeapTupleHeader(((Const *) arg)->constvalue);
	desc = lookup_rowtype_tupdesc(HeapTupleHeaderGetTypeId(tuple), HeapTupleHeaderGetTypMod(tuple));
	shape = desc->natts == 2 && TupleDescAttr(desc, 1)->atttypid == INT4OID;
	ReleaseTupleDesc(desc);
	if (!shape)
		return -1;
	r = GetAttributeByNum(tuple, 2, &isnull);
	return isnull ? -1 : Max(DatumGetInt32(r), 0);
}

/*
 * The share of brute force's distances a range search of the given radius
 * computes, by method, as measured on the words of wspanish with 300
 * queries (dictionary words with 1 to 3 edits, English words; see
 * bench/metric): radii 0 to 5, all of them past that.
 */
static const double lc_fraction[] = {0.027, 0.051, 0.122, 0.286, 0.531, 0.758};
static const double sss_fraction[] = {0.001, 0.001, 0.010, 0.186, 0.549, 0.789};

/*
 * A k-NN search for the 10 or so rows of a LIMIT, completed by the range of
 * its farthest distance, computes about as many distances as brute force
 * on words: the 10th nearest word usually lies 3 to 5 edits away.
 */
#define KNN_FRACTION 1.0

/*
 * The engine's distances are bounded and read decoded words: one costs
 * about half of what the operator's function costs a sequential scan per
 * row (measured: 40 ns against 110 ns for <% on 86,016 words).
 */
#define ENGINE_DISTANCE_SHARE 0.5

/*
 * An SSS search also reads every live object's row of pivot distances: a
 * fraction of an operator per object.
 */
#define SSS_FILTER_COST_SHARE 0.5

/* The index's method, from its metapage (its options when the page cannot be read). */
static int
IndexMethod(Relation index)
{
	int			method = GPU_METRIC_METHOD_LC;
	int			bucket;
	double		alpha;

	GpuMetricIndexOptions(index, &method, &bucket, &alpha);
	if (RelationGetNumberOfBlocks(index) > 0)
	{
		Buffer		buf = ReadBuffer(index, GPU_METRIC_METAPAGE_BLKNO);
		Page		page;

		LockBuffer(buf, BUFFER_LOCK_SHARE);
		page = BufferGetPage(buf);
		/* A damaged page is reported by the scan that reads it, not by the planner. */
		if (!PageIsNew(page) && ((PageHeader) page)->pd_special == GPU_METRIC_SPECIAL_OFFSET &&
			GpuMetricPageGetOpaque(page)->page_id == GPU_METRIC_PAGE_ID &&
			GpuMetricPageGetMeta(page)->magic == GPU_METRIC_MAGIC &&
			(GpuMetricPageGetMeta(page)->method == GPU_METRIC_METHOD_LC ||
			 GpuMetricPageGetMeta(page)->method == GPU_METRIC_METHOD_SSS))
			method = (int) GpuMetricPageGetMeta(page)->method;
		UnlockReleaseBuffer(buf);
	}
	return method;
}

/* The share of brute force's distances a range search of radius computes (-1: unknown, 2 assumed). */
static double
SearchFraction(int method, int32 radius)
{
	const double *fraction = method == GPU_METRIC_METHOD_SSS ? sss_fraction : lc_fraction;

	if (radius < 0)
		radius = 2;
	return radius < (int32) lengthof(lc_fraction) ? fraction[radius] : 1.0;
}

/*
 * amcostestimate: an exact search computes a share of the distances a
 * sequential scan does (by method and radius, as measured), each cheaper
 * than the operator's call, all before its first row; rows then cost what
 * an index tuple does. An ORDER BY alone continues with wider k-NN rounds,
 * so returning every row costs several sequential scans' distances: the
 * index serves ORDER BY ... LIMIT and range predicates of small radii, and
 * never a query with neither.
 */
static void
gpumetriccostestimate(PlannerInfo *root, IndexPath *path, double loop_count,
					  Cost *indexStartupCost, Cost *indexTotalCost,
					  Selectivity *indexSelectivity, double *indexCorrelation,
					  double *indexPages)
{
	GenericCosts costs;
	double		n = Max(path->indexinfo->tuples, 1.0);
	double		fraction = 1.0;
	double		per_distance = cpu_operator_cost;
	double		spc_random;
	double		spc_seq;
	int			method;
	Relation	index;
	ListCell   *lc;

	/* Neither; or two distances to order by, of which a scan follows the first alone. */
	if ((path->indexclauses == NIL && path->indexorderbys == NIL) || list_length(path->indexorderbys) > 1)
	{
		GpuIvfpqRefuseIndexPath(path);
		*indexStartupCost = DBL_MAX;
		*indexTotalCost = DBL_MAX;
		*indexSelectivity = 0;
		*indexCorrelation = 0;
		*indexPages = 0;
		return;
	}

	MemSet(&costs, 0, sizeof(costs));
	genericcostestimate(root, path, loop_count, &costs);
	get_tablespace_page_costs(path->indexinfo->reltablespace, &spc_random, &spc_seq);
	index = index_open(path->indexinfo->indexoid, NoLock);
	method = IndexMethod(index);
	index_close(index, NoLock);

	/* The engine searches with the most selective range clause. */
	foreach(lc, path->indexclauses)
	{
		IndexClause *iclause = lfirst_node(IndexClause, lc);
		ListCell   *lc2;

		foreach(lc2, iclause->indexquals)
		{
			RestrictInfo *rinfo = lfirst_node(RestrictInfo, lc2);

			fraction = Min(fraction, SearchFraction(method, ConstRadius(rinfo->clause)));
			per_distance = GpuIvfpqOperatorCost(root, rinfo->clause);
		}
	}
	if (path->indexclauses == NIL)
	{
		fraction = KNN_FRACTION;
		per_distance = GpuIvfpqOperatorCost(root, (Expr *) linitial(path->indexorderbys));
	}
	per_distance *= ENGINE_DISTANCE_SHARE;

	*indexStartupCost = n * fraction * per_distance;
	if (method == GPU_METRIC_METHOD_SSS)
		*indexStartupCost += n * SSS_FILTER_COST_SHARE * cpu_operator_cost;
	*indexTotalCost = *indexStartupCost + costs.numIndexTuples * cpu_index_tuple_cost +
		costs.numIndexPages * spc_seq;
	/*
	 * Every row: k-NN rounds that grow k fourfold from 16, each about two
	 * sequential scans' worth of (cheaper) distances once k is large.
	 */
	if (path->indexclauses == NIL)
		*indexTotalCost += 2 * n * per_distance * Max(1.0, ceil(log(n / 16.0) / log(4.0)));
	*indexSelectivity = costs.indexSelectivity;
	*indexCorrelation = 0;
	*indexPages = costs.numIndexPages;
}

/*
 * amvalidate: text_edit_ops and its like have search operator 1 (a range)
 * and ORDER BY operator 2 (the distance), and no support functions.
 */
static bool
gpumetricvalidate(Oid opclassoid)
{
	bool		result = true;
	bool		have_range = false;
	bool		have_order = false;
	HeapTuple	classtup = SearchSysCache1(CLAOID, ObjectIdGetDatum(opclassoid));
	Form_pg_opclass classform;
	CatCList   *oprlist;
	CatCList   *proclist;

	if (!HeapTupleIsValid(classtup))
		elog(ERROR, "cache lookup failed for operator class %u", opclassoid);
	classform = (Form_pg_opclass) GETSTRUCT(classtup);
	oprlist = SearchSysCacheList1(AMOPSTRATEGY, ObjectIdGetDatum(classform->opcfamily));
	for (int i = 0; i < oprlist->n_members; i++)
	{
		Form_pg_amop op = (Form_pg_amop) GETSTRUCT(&oprlist->members[i]->tuple);

		if (op->amopstrategy == GPU_METRIC_RANGE_STRATEGY && op->amoppurpose == AMOP_SEARCH)
			have_range = true;
		else if (op->amopstrategy == GPU_METRIC_ORDER_STRATEGY && op->amoppurpose == AMOP_ORDER)
			have_order = true;
		else
		{
			ereport(INFO,
					(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
					 errmsg("gpu_metric operator family contains operator %u with strategy %d; only search operator 1 and ORDER BY operator 2 are supported",
							op->amopopr, op->amopstrategy)));
			result = false;
		}
	}
	proclist = SearchSysCacheList1(AMPROCNUM, ObjectIdGetDatum(classform->opcfamily));
	if (proclist->n_members > 0)
	{
		ereport(INFO,
				(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
				 errmsg("gpu_metric operator family has support functions; it takes none")));
		result = false;
	}
	if (!have_range || !have_order)
	{
		ereport(INFO,
				(errcode(ERRCODE_INVALID_OBJECT_DEFINITION),
				 errmsg("gpu_metric operator class needs search operator 1 and ORDER BY operator 2")));
		result = false;
	}
	ReleaseCatCacheList(proclist);
	ReleaseCatCacheList(oprlist);
	ReleaseSysCache(classtup);
	return result;
}

/* The access method handler: every IndexAmRoutine field is set. */
Datum
gpu_metric_handler(PG_FUNCTION_ARGS)
{
	IndexAmRoutine *am = makeNode(IndexAmRoutine);

	am->amstrategies = 2;
	am->amsupport = 0;
	am->amoptsprocnum = 0;
	am->amcanorder = false;
	am->amcanorderbyop = true;
	am->amcanbackward = false;
	am->amcanunique = false;
	am->amcanmulticol = false;
	am->amoptionalkey = true;	/* ORDER BY alone */
	am->amsearcharray = false;
	am->amsearchnulls = false;
	am->amstorage = false;
	am->amclusterable = false;
	am->ampredlocks = false;
	am->amcanparallel = false;
	am->amcaninclude = false;
	am->amusemaintenanceworkmem = true;
	am->amparallelvacuumoptions = VACUUM_OPTION_PARALLEL_BULKDEL;
	am->amkeytype = InvalidOid;

	am->ambuild = gpumetricbuild;
	am->ambuildempty = gpumetricbuildempty;
	am->aminsert = gpumetricinsert;
	am->ambulkdelete = gpumetricbulkdelete;
	am->amvacuumcleanup = gpumetricvacuumcleanup;
	am->amcanreturn = NULL;
	am->amcostestimate = gpumetriccostestimate;
	am->amoptions = gpumetricoptions;
	am->amproperty = GpuIvfpqDistanceOrderableProperty;
	am->ambuildphasename = gpumetricbuildphasename;
	am->amvalidate = gpumetricvalidate;
	am->amadjustmembers = NULL;
	am->ambeginscan = gpumetricbeginscan;
	am->amrescan = gpumetricrescan;
	am->amgettuple = gpumetricgettuple;
	am->amgetbitmap = gpumetricgetbitmap;
	am->amendscan = gpumetricendscan;
	am->ammarkpos = NULL;
	am->amrestrpos = NULL;
	am->amestimateparallelscan = NULL;
	am->aminitparallelscan = NULL;
	am->amparallelrescan = NULL;
	GpuIvfpqSetNewerAmFields(am);

	PG_RETURN_POINTER(am);
}
