// The access method handler: index options, cost estimate, operator class
// validation and properties.
#include <cfloat>

#include "am/am.h"

extern "C" {
#include "access/detoast.h"
#include "access/genam.h"
#include "access/heaptoast.h"
#include "access/table.h"
#include "catalog/indexing.h"
#include "catalog/pg_class.h"
#include "commands/defrem.h"
#include "optimizer/plancat.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/spccache.h"
#include "utils/syscache.h"
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

static relopt_enum_elt_def codes_values[] = {
	{"pq", GPU_IVFPQ_CODES_PQ},
	{"rabitq", GPU_IVFPQ_CODES_RABITQ},
	{(const char *) NULL}
};

/* Registers the index options (lists, m, nbits, store_vectors, placement, codes, bits); called once from _PG_init. */
void
GpuIvfpqRegisterOptions(void)
{
	gpu_ivfpq_relopt_kind = add_reloption_kind();
	add_int_reloption(gpu_ivfpq_relopt_kind, "lists", "Number of inverted lists (coarse centroids)",
					  GPU_IVFPQ_DEFAULT_LISTS, 1, GPU_IVFPQ_MAX_LISTS, AccessExclusiveLock);
	/* Given: 1 .. 256, a divisor of the dimension; not given (0): chosen from the dimension. */
	add_int_reloption(gpu_ivfpq_relopt_kind, "m",
					  "Number of PQ sub-quantizers, a divisor of the dimension (chosen from it when not given)",
					  0, 1, GPU_IVFPQ_MAX_M, AccessExclusiveLock);
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
	add_enum_reloption(gpu_ivfpq_relopt_kind, "codes",
					   "What the index keeps of each row: pq (PQ codes and a vector copy) or rabitq (RaBitQ codes only)",
					   codes_values, GPU_IVFPQ_CODES_PQ,
					   "Valid values are \"pq\" and \"rabitq\".", AccessExclusiveLock);
	add_int_reloption(gpu_ivfpq_relopt_kind, "bits", "Bits per dimension of RaBitQ codes (codes = rabitq)",
					  GPU_IVFPQ_DEFAULT_RABITQ_BITS, 1, 8, AccessExclusiveLock);
}

/*
 * OAT_POST_ALTER of relation relid: if it is a gpu_ivfpq index whose
 * options the command changed (ALTER INDEX ... SET / RESET), checks the new
 * ones against the vectors it holds (GpuIvfpqCheckNewOptions). The catalog
 * row is updated but not yet visible to the command's catalog snapshot:
 * the syscache gives the options before, a scan with SnapshotSelf after.
 */
void
GpuIvfpqRelationAltered(Oid relid)
{
	HeapTuple	before = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Form_pg_class form;
	Datum		old_opts;
	bool		old_null;
	Datum		new_opts = (Datum) 0;
	bool		new_null = true;
	bool		changed = false;
	Relation	pgclass;
	ScanKeyData key;
	SysScanDesc sscan;
	HeapTuple	after;

	if (!HeapTupleIsValid(before))
		return;
	form = (Form_pg_class) GETSTRUCT(before);
	if (form->relkind != RELKIND_INDEX || form->relam != get_index_am_oid("gpu_ivfpq", true))
	{
		ReleaseSysCache(before);
		return;
	}
	old_opts = SysCacheGetAttr(RELOID, before, Anum_pg_class_reloptions, &old_null);

	pgclass = table_open(RelationRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_class_oid, BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
	sscan = systable_beginscan(pgclass, ClassOidIndexId, true, SnapshotSelf, 1, &key);
	after = systable_getnext(sscan);
	if (HeapTupleIsValid(after))
	{
		Datum		values[Natts_pg_class];
		bool		nulls[Natts_pg_class];
		Datum		d;

		heap_deform_tuple(after, RelationGetDescr(pgclass), values, nulls);
		d = values[Anum_pg_class_reloptions - 1];
		new_null = nulls[Anum_pg_class_reloptions - 1];

		changed = old_null != new_null ||
			(!new_null && !datumIsEqual(old_opts, d, false, -1));
		if (changed && !new_null)
			new_opts = datumCopy(d, false, -1);
	}
	systable_endscan(sscan);
	table_close(pgclass, AccessShareLock);
	ReleaseSysCache(before);

	if (changed)
	{
		/* The command holds its lock on the index. */
		Relation	index = index_open(relid, NoLock);
		GpuIvfpqMetaPageData meta;
		int			dim;

		/*
		 * An index a failed CREATE INDEX CONCURRENTLY left behind holds a
		 * metapage of no lists and no vectors: nothing to check against
		 * (its REINDEX checks the options as any build does).
		 */
		if (index->rd_index->indisvalid && index->rd_index->indisready)
		{
			GpuIvfpqReadMeta(index, &meta);
			dim = (int) meta.dimensions;
		}
		else
			dim = 0;
		/* A pgvector column declares its dimension: checked against it too (as CREATE INDEX does). */
		if (dim == 0)
		{
			GpuIvfpqVectorFormat format = GpuIvfpqIndexFormat(index);
			int32		typmod = TupleDescAttr(RelationGetDescr(index), 0)->atttypmod;

			if ((format == GPU_IVFPQ_FORMAT_VECTOR || format == GPU_IVFPQ_FORMAT_HALFVEC) && typmod > 0)
				dim = typmod;
		}
		GpuIvfpqCheckNewOptions(index, new_null ? (Datum) 0 : new_opts, dim);
		index_close(index, NoLock);
	}
}

/* amoptions: parses WITH (lists, m, nbits, store_vectors, placement, codes, bits). */
bytea *
gpuivfpqoptions(Datum reloptions, bool validate)
{
	static const relopt_parse_elt tab[] = {
		{"lists", RELOPT_TYPE_INT, offsetof(GpuIvfpqOptions, lists)},
		{"m", RELOPT_TYPE_INT, offsetof(GpuIvfpqOptions, m)},
		{"nbits", RELOPT_TYPE_INT, offsetof(GpuIvfpqOptions, nbits)},
		{"store_vectors", RELOPT_TYPE_BOOL, offsetof(GpuIvfpqOptions, store_vectors)},
		{"placement", RELOPT_TYPE_ENUM, offsetof(GpuIvfpqOptions, placement)},
		{"codes", RELOPT_TYPE_ENUM, offsetof(GpuIvfpqOptions, codes)},
		{"bits", RELOPT_TYPE_INT, offsetof(GpuIvfpqOptions, bits)},
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
	/*
	 * A bool holding neither 0 nor 1 must not be read as a bool; the sizes
	 * the cost estimate derives pages from (GpuIvfpqLayoutOf) must be in
	 * range (the scan reports what else is wrong: GpuIvfpqCheckMeta).
	 */
	memcpy(&trained, &meta->trained, 1);
	return meta->magic == GPU_IVFPQ_MAGIC && meta->version == GPU_IVFPQ_VERSION && meta->lists >= 1 &&
		meta->lists <= GPU_IVFPQ_MAX_LISTS && trained <= 1 && meta->dimensions <= GPU_IVFPQ_MAX_DIM &&
		(meta->features & ~(uint32) GPU_IVFPQ_FEATURES_KNOWN) == 0 &&
		(!trained || (GpuIvfpqIsRabitq(meta) ? meta->dimensions >= 1 && meta->dimensions <= GPU_IVFPQ_RABITQ_MAX_DIM &&
					  meta->nbits >= 1 && meta->nbits <= 8 &&
					  meta->m == GpuIvfpqRabitqRowBytes((int) meta->dimensions, meta->nbits)
					  : meta->m >= 1 && meta->m <= GPU_IVFPQ_MAX_M));
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
 * The bytes of a vector copy that count as read: no more than the indexed
 * column takes in the table's pages. The planner charges a sequential scan
 * for those pages alone, and a vector of more than about 500 dimensions is
 * TOASTed out of them: the scan detoasts every row's vector (most of its
 * time from 768 dimensions on) and is charged for a pointer. The copies
 * are the index's own out-of-line vectors (a list scan reads the entries,
 * and only its candidates' copies); charged page by page (one page per
 * entry at 1536 dimensions) they made the index look dearer than a
 * sequential scan ten times slower. The column's width is its average
 * stored width (ANALYZE counts a TOASTed value as its pointer); without
 * statistics, a pointer for a vector too large to stay in its row.
 */
static double
CountedCopyBytes(Oid heapoid, AttrNumber attnum, int dim)
{
	double		bytes = (double) dim * sizeof(float);
	int32		width = attnum > 0 ? get_attavgwidth(heapoid, attnum) : 0;

	if (width > 0)
		return Min(bytes, (double) width);
	return bytes > TOAST_TUPLE_THRESHOLD ? TOAST_POINTER_SIZE : bytes;
}

/*
 * Fetching n rows by TID with an exact distance each, as a re-rank from the
 * table does: GpuIvfpqRerank fetches them in heap order, so their pages are
 * charged as PostgreSQL charges a bitmap heap scan's (cost_bitmap_heap_scan:
 * the pages fetched out of the table's, from random towards sequential
 * reads as they cover more of it). Detoasting their vectors is not
 * charged, as it is not for a sequential scan (CountedCopyBytes).
 */
static Cost
HeapFetchCost(RelOptInfo *rel, double n, double per_distance)
{
	double		spc_random;
	double		spc_seq;
	double		table_pages = Max((double) rel->pages, 1.0);
	double		pages = 2.0 * table_pages * n / (2.0 * table_pages + n);
	double		per_page;

	get_tablespace_page_costs(rel->reltablespace, &spc_random, &spc_seq);
	pages = pages >= table_pages ? table_pages : ceil(pages);
	per_page = pages >= 2.0 ? spc_random - (spc_random - spc_seq) * sqrt(pages / table_pages) : spc_random;
	return pages * per_page + n * (cpu_tuple_cost + per_distance);
}

/* Sorting n rows by distance, at cost_sort's price of a comparison. */
static Cost
SortCost(double n)
{
	return n > 1 ? 2.0 * cpu_operator_cost * n * log2(n) : 0;
}

/* What a scan's rounds share: the index, the table and the prices of their parts. */
typedef struct GpuIvfpqScanShape
{
	RelOptInfo *rel;
	double		lists;
	double		entries;		/* of every list */
	double		list_pages;		/* of every list, as counted (see below) */
	double		other_pages;	/* the metapage and the list directory */
	double		spc_seq;
	double		per_key;		/* comparing an entry's filter key with the conditions */
	double		per_ranked;		/* ranking an entry that passes them: an ADC distance */
	double		selectivity;	/* of the conditions on the filter column (1 without) */
	double		per_distance;	/* an exact distance */
	bool		copies;			/* candidates are re-ranked from vector copies */
} GpuIvfpqScanShape;

/*
 * One round of a scan: the pages and entries of the probed lists (each
 * entry's filter key compared, the entries that pass ranked), and the
 * re-rank and sort of n candidates, of which fetched are fetched from the
 * table (an index without copies fetches only the rows no earlier round
 * did).
 */
static Cost
RoundCost(const GpuIvfpqScanShape *shape, double probes, double n, double fetched)
{
	double		share = Min(1.0, probes / shape->lists);
	Cost		cost;

	cost = (shape->other_pages + shape->list_pages * share) * shape->spc_seq +
		shape->entries * share * (shape->per_key + shape->selectivity * shape->per_ranked) + SortCost(n);
	if (shape->copies)
		return cost + n * (cpu_index_tuple_cost + shape->per_distance);
	return cost + HeapFetchCost(shape->rel, fetched, shape->per_distance);
}

/*
 * amcostestimate: the index only serves ORDER BY <op>; without an ORDER BY
 * it must never be chosen. The work is priced as the planner prices a
 * sequential scan's: the pages of the probed lists (below) and an ADC
 * distance per entry (genericcostestimate's tuple and operator costs; an
 * entry that fails a filter column's conditions costs their comparison
 * only); the query's distances to the centroids and its lookup tables (256 x
 * dimension products, as 256 distances); the re-rank of the candidates,
 * each an exact distance from its vector copy or from its row, which is
 * fetched (HeapFetchCost); their sort. The first round comes before the
 * first row (startup), run again wider for a filter column's conditions;
 * the rounds that follow (NextBatch: twice the lists and the candidates
 * each, until a round ranked every entry that passes the filter in every
 * list or gpu_ivfpq.max_scan_tuples rows were re-ranked) are what
 * returning every row costs, of which a LIMIT pays its share: without one,
 * a sequential scan and a sort are cheaper. An untrained index re-ranks
 * every row from the heap and sorts them all at once, which a sequential
 * scan with a top-k sort beats. Each rescan probes its lists again.
 */
void
gpuivfpqcostestimate(PlannerInfo *root, IndexPath *path, double loop_count,
					 Cost *indexStartupCost, Cost *indexTotalCost,
					 Selectivity *indexSelectivity, double *indexCorrelation,
					 double *indexPages)
{
	GenericCosts costs;
	GpuIvfpqScanShape shape;
	int			lists = GPU_IVFPQ_DEFAULT_LISTS;
	bool		copies = true;	/* store_vectors: the re-rank reads no heap row */
	bool		trained = true;
	bool		known = false;
	Oid			heapoid;
	double		probes;
	double		candidates;
	double		n;
	double		reranked;
	Cost		startup;
	Cost		total;
	int			nquals = 0;
	ListCell   *lc;
	Relation	index;
	GpuIvfpqMetaPageData meta;

	/*
	 * No ORDER BY, or more than one distance to order by: a scan returns
	 * rows in the order of the first alone (and tells the executor not to
	 * re-sort them), so it serves neither.
	 */
	if (path->indexorderbys == NIL || list_length(path->indexorderbys) > 1)
	{
		GpuIvfpqRefuseIndexPath(path);
		*indexStartupCost = DBL_MAX;
		*indexTotalCost = DBL_MAX;
		*indexSelectivity = 0;
		*indexCorrelation = 0;
		*indexPages = 0;
		return;
	}

	index = index_open(path->indexinfo->indexoid, NoLock);
	heapoid = index->rd_index->indrelid;
	if (PeekMeta(index, &meta))
	{
		known = true;
		lists = (int) meta.lists;
		trained = meta.trained;
		copies = trained && (meta.features & GPU_IVFPQ_FEATURE_VECTORS) != 0;
	}
	else if (index->rd_options)
	{
		lists = ((GpuIvfpqOptions *) index->rd_options)->lists;
		copies = ((GpuIvfpqOptions *) index->rd_options)->store_vectors &&
			((GpuIvfpqOptions *) index->rd_options)->codes == GPU_IVFPQ_CODES_PQ;
	}
	index_close(index, NoLock);

	/*
	 * genericcostestimate for every entry, for the selectivity and the
	 * price of an entry; its pages are replaced (below), and a rescan
	 * costs what the first scan does.
	 */
	MemSet(&costs, 0, sizeof(costs));
	costs.numIndexTuples = path->indexinfo->tuples;
	genericcostestimate(root, path, 1.0, &costs);

	shape.rel = path->indexinfo->rel;
	shape.lists = Max(lists, 1);
	shape.entries = costs.numIndexTuples;
	/* genericcostestimate's entry: a tuple, an operator per condition and ORDER BY */
	foreach(lc, path->indexclauses)
		nquals += list_length(lfirst_node(IndexClause, lc)->indexquals);
	shape.per_key = nquals * cpu_operator_cost;
	shape.per_ranked = (costs.indexTotalCost - costs.numIndexPages * costs.spc_random_page_cost -
						costs.indexStartupCost) / costs.numIndexTuples - shape.per_key;
	shape.selectivity = costs.indexSelectivity;
	shape.per_distance = GpuIvfpqOperatorCost(root, (Expr *) linitial(path->indexorderbys));
	shape.copies = copies;
	get_tablespace_page_costs(path->indexinfo->reltablespace, NULL, &shape.spc_seq);

	/*
	 * The pages a round reads: the metapage, the list directory and the
	 * probed share of the list pages, of which the vector copies count as
	 * CountedCopyBytes says. genericcostestimate charges a share of every
	 * page a random read; but a list's pages are read in chain order and
	 * lie mostly together (a build writes each list at once), so they cost
	 * sequential reads, and the quantizers are read once per backend (the
	 * model cache), not per scan: 200 pages at 1536 dimensions.
	 */
	shape.other_pages = 0;
	shape.list_pages = costs.numIndexPages;
	if (known)
	{
		GpuIvfpqEntryLayout el = GpuIvfpqLayoutOf(&meta);
		double		list_pages = (double) path->indexinfo->pages - 1 - meta.listdir_pages;
		double		counted = 1.0;

		if (trained)
			list_pages -= GpuIvfpqBlobPages(GpuIvfpqCentroidBytes(&meta)) +
				GpuIvfpqBlobPages(GpuIvfpqCodebookBytes(&meta));
		if (el.vdim > 0)
			counted = (el.size + CountedCopyBytes(heapoid, path->indexinfo->indexkeys[0], el.vdim)) /
				(el.size + (double) el.vdim * sizeof(float));
		shape.other_pages = 1 + meta.listdir_pages;
		shape.list_pages = Max(list_pages, 0.0) * counted;
	}

	startup = costs.indexStartupCost;
	if (!trained)
	{
		n = Max(shape.rel->tuples, 1.0);
		startup += RoundCost(&shape, shape.lists, n, n);
		total = startup;
	}
	else
	{
		double		matching = shape.entries * shape.selectivity;

		probes = Min(gpu_ivfpq_probes, lists);
		candidates = gpu_ivfpq_rerank;
		startup += (lists + 256.0) * shape.per_distance;
		if (shape.selectivity < 1.0 && probes < lists)
		{
			/*
			 * A filtered scan's first round finds the filter's selectivity s
			 * and is run again over 1 / s times the lists, rounded up to a
			 * power of two (FilteredProbes).
			 */
			startup += RoundCost(&shape, probes, 0, 0);
			probes = Min(probes * pow(2.0, ceil(log2(1.0 / shape.selectivity) - 1e-9)),
						 (double) lists);
		}
		n = Min(candidates, Max(matching * probes / shape.lists, 1.0));
		startup += RoundCost(&shape, probes, n, n);
		total = startup;
		reranked = n;
		for (int round = 1; round < 64 && reranked < gpu_ivfpq_max_scan_tuples &&
			 (probes < lists || n < matching); round++)
		{
			probes = Min(probes * 2, lists);
			candidates *= 2;
			n = Min(copies ? candidates : candidates + reranked, Max(matching * probes / shape.lists, 1.0));
			total += RoundCost(&shape, probes, n, Max(n - reranked, 0.0));
			reranked = Max(reranked, n);
		}
	}

	*indexStartupCost = startup;
	*indexTotalCost = total;
	*indexSelectivity = costs.indexSelectivity;
	*indexCorrelation = 0;
	*indexPages = shape.other_pages + shape.list_pages * Min(1.0, gpu_ivfpq_probes / shape.lists);
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
	GpuIvfpqSetNewerAmFields(am);

	PG_RETURN_POINTER(am);
}
