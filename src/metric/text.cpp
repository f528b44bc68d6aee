// Text as gpu_metric measures it: UTF-8 (converted from the database's
// encoding), decoded into Unicode code points by the engine; the edit_range
// argument; and the limits on words and radii every entry point shares.
#include "metric/am.h"
#include "common/guard.h"

extern "C" {
#include "mb/pg_wchar.h"
#include "optimizer/cost.h"
#include "utils/typcache.h"
}

/*
 * The UTF-8 bytes of a text value, without a terminating zero. In a UTF8
 * database they are the value's own bytes; other encodings are converted
 * (every character of theirs has a code point), and a SQL_ASCII database's
 * bytes are taken as UTF-8, an error naming the byte when they are not.
 */
char *
GpuMetricUtf8(text *t, int *len)
{
	char	   *s = VARDATA_ANY(t);
	int			n = VARSIZE_ANY_EXHDR(t);
	char	   *u = pg_server_to_any(s, n, PG_UTF8);

	/* A conversion returns a new, zero-terminated string; else the bytes as they were. */
	*len = u == s ? n : (int) strlen(u);
	return u;
}

/* GpuMetricUtf8 of a text Datum (detoasted in the current memory context). */
char *
GpuMetricDatumUtf8(Datum value, int *len)
{
	return GpuMetricUtf8(DatumGetTextPP(value), len);
}

/* Every word an index stores is a word an edit distance takes. */
static_assert(GPU_METRIC_MAX_WORD_BYTES <= gpuivfpq::kMaxWordCodePoints,
			  "gpu_metric stores words that edit distances refuse");

/*
 * Errors unless the UTF-8 text utf8[0, len) fits an edit distance: at most
 * gpuivfpq::kMaxWordCodePoints code points (characters), the bound on the
 * memory of a query's pattern and the time of one distance whatever the
 * text's alphabet. Every text gpu_metric measures is checked here: both
 * sides of the operators, edit_range's word, scan and batch queries.
 */
void
GpuMetricCheckLength(const char *utf8, int len)
{
	int64		ncp = 0;

	/* A code point takes at least one byte. */
	if ((Size) len <= gpuivfpq::kMaxWordCodePoints)
		return;
	for (int i = 0; i < len; i++)
		ncp += ((unsigned char) utf8[i] & 0xC0) != 0x80;
	if (ncp > (int64) gpuivfpq::kMaxWordCodePoints)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a text of %lld characters is too long for an edit distance", (long long) ncp),
				 errdetail("Edit distances (<~>, <%%, edit_range and the gpu_metric search functions) take texts of at most %zu characters.",
						   gpuivfpq::kMaxWordCodePoints),
				 errhint("Compare a part of the text, for example left(t, %zu), or leave longer texts out.",
						 gpuivfpq::kMaxWordCodePoints)));
}

/* The code points of UTF-8 text, palloc'd (the engine decodes and checks them). */
uint32 *
GpuMetricCodePoints(const char *utf8, int len, int *ncp)
{
	uint32	   *cps;
	size_t		n = 0;

	GpuMetricCheckLength(utf8, len);
	cps = (uint32 *) palloc(sizeof(uint32) * Max(len, 1));
	GpuIvfpqGuard("decoding", [&] { n = GpuMetricDecode(utf8, (size_t) len, cps); });
	*ncp = (int) n;
	return cps;
}

/* Errors unless a word of len UTF-8 bytes fits a gpu_metric index. */
void
GpuMetricCheckWordBytes(Relation index, int len)
{
	if (len > GPU_METRIC_MAX_WORD_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("a word of %d bytes is too long for gpu_metric index \"%s\"",
						len, RelationGetRelationName(index)),
				 errdetail("A gpu_metric index stores words of at most %d bytes of UTF-8.",
						   GPU_METRIC_MAX_WORD_BYTES),
				 GetDatabaseEncoding() == PG_UTF8 || GetDatabaseEncoding() == PG_SQL_ASCII
				 ? errhint("Leave longer values out with a partial index, for example WHERE octet_length(word) <= %d.",
						   GPU_METRIC_MAX_WORD_BYTES)
				 : errhint("Leave longer values out with a partial index, for example WHERE char_length(word) <= %d (a character takes at most 4 bytes of UTF-8).",
						   GPU_METRIC_MAX_WORD_BYTES / 4)));
}

/* Errors for a negative radius: a range holds words within radius edits. */
void
GpuMetricCheckRadius(int32 radius)
{
	if (radius < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("edit distance radius must be at least 0, not %d", radius),
				 errhint("A range such as edit_range('word', 2) holds the words within 2 edits.")));
}

/*
 * The word and radius of an edit_range value. false when either is NULL
 * (no word is within such a range); a negative radius is an error. The
 * record must be (text, int4): what edit_range is.
 */
bool
GpuMetricRangeArg(Datum range, Datum *word, int32 *radius)
{
	HeapTupleHeader tuple = DatumGetHeapTupleHeader(range);
	TupleDesc	desc = lookup_rowtype_tupdesc(HeapTupleHeaderGetTypeId(tuple),
											  HeapTupleHeaderGetTypMod(tuple));
	bool		shape = desc->natts == 2 && TupleDescAttr(desc, 0)->atttypid == TEXTOID &&
		TupleDescAttr(desc, 1)->atttypid == INT4OID;
	bool		word_null;
	bool		radius_null;
	Datum		r;

	ReleaseTupleDesc(desc);
	if (!shape)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("an edit distance range must be a (word text, radius int4) record"),
				 errhint("Use edit_range('word', 2).")));
	*word = GetAttributeByNum(tuple, 1, &word_null);
	r = GetAttributeByNum(tuple, 2, &radius_null);
	if (word_null || radius_null)
		return false;
	*radius = DatumGetInt32(r);
	GpuMetricCheckRadius(*radius);
	return true;
}

/*
 * Threads of the engine for a batch of queries: as many as a parallel query
 * would use (max_parallel_workers_per_gather, plus the backend itself).
 */
int
GpuMetricSearchThreads(void)
{
	return Max(1, Min(max_parallel_workers_per_gather + 1, 64));
}
