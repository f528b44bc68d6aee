// The SQL operators of fuzzy string search, usable with or without an
// index: text <~> text (the edit distance on code points), text <% edit_range
// (within the range's radius) and edit_range(word, radius). Each call keeps
// the pattern of its constant side (the query) between rows.
#include "metric/am.h"
#include "common/guard.h"

extern "C" {
#include "funcapi.h"

PG_FUNCTION_INFO_V1(gpu_metric_edit_distance);
PG_FUNCTION_INFO_V1(gpu_metric_within);
PG_FUNCTION_INFO_V1(gpu_metric_edit_range);
}

/*
 * The query side of an operator, kept in fn_extra: the bytes it was made
 * from (the query's UTF-8, or the whole edit_range value), the pattern, and
 * the radius of a range.
 */
typedef struct QueryCache
{
	MemoryContext cxt;			/* reset when the query changes */
	char	   *key;
	int			keylen;
	bool		matches_none;	/* a range with a NULL word or radius */
	int32		radius;
	GpuMetricPattern *pattern;	/* owned by cxt */
} QueryCache;

/* The cache of this call site, made on first use. */
static QueryCache *
GetQueryCache(FunctionCallInfo fcinfo)
{
	QueryCache *cache = (QueryCache *) fcinfo->flinfo->fn_extra;

	if (cache == NULL)
	{
		cache = (QueryCache *) MemoryContextAllocZero(fcinfo->flinfo->fn_mcxt, sizeof(QueryCache));
		cache->cxt = AllocSetContextCreate(fcinfo->flinfo->fn_mcxt, "gpu_metric query", ALLOCSET_SMALL_SIZES);
		fcinfo->flinfo->fn_extra = cache;
	}
	return cache;
}

/* Whether the cache holds the query made from key[0, len). */
static bool
CacheHolds(const QueryCache *cache, const char *key, int len)
{
	return cache->key != NULL && cache->keylen == len && memcmp(cache->key, key, len) == 0;
}

/* Makes the cache hold the pattern of query word utf8, made from key[0, keylen). */
static void
CacheSet(QueryCache *cache, const char *key, int keylen, const char *utf8, int len)
{
	MemoryContext old;
	uint32	   *cps;
	int			ncp;

	MemoryContextReset(cache->cxt);
	cache->key = NULL;
	cache->pattern = NULL;
	old = MemoryContextSwitchTo(cache->cxt);
	cps = GpuMetricCodePoints(utf8, len, &ncp);
	cache->pattern = GpuIvfpqMakeOwned<GpuMetricPattern>(cache->cxt, "edit distance", (const uint32_t *) cps,
														 (size_t) ncp);
	cache->key = (char *) palloc(Max(keylen, 1));
	memcpy(cache->key, key, keylen);
	cache->keylen = keylen;
	MemoryContextSwitchTo(old);
}

/* text <~> text: the Levenshtein distance between two texts, on their code points. */
Datum
gpu_metric_edit_distance(PG_FUNCTION_ARGS)
{
	QueryCache *cache = GetQueryCache(fcinfo);
	int			alen;
	int			blen;
	char	   *a = GpuMetricUtf8(PG_GETARG_TEXT_PP(0), &alen);
	char	   *b = GpuMetricUtf8(PG_GETARG_TEXT_PP(1), &blen);
	uint32		d = 0;

	GpuMetricCheckLength(a, alen);
	/* The right side is the query of an ORDER BY or a comparison with a constant. */
	if (!CacheHolds(cache, b, blen))
		CacheSet(cache, b, blen, b, blen);
	GpuIvfpqGuard("edit distance", [&] { d = cache->pattern->distance_utf8(a, (size_t) alen); });
	PG_RETURN_INT32((int32) d);
}

/* text <% edit_range: whether the text is within the range's radius of its word. */
Datum
gpu_metric_within(PG_FUNCTION_ARGS)
{
	QueryCache *cache = GetQueryCache(fcinfo);
	int			len;
	char	   *a = GpuMetricUtf8(PG_GETARG_TEXT_PP(0), &len);
	struct varlena *range = PG_GETARG_VARLENA_P(1);
	uint32		d = 0;

	GpuMetricCheckLength(a, len);
	if (!CacheHolds(cache, (const char *) range, VARSIZE(range)))
	{
		Datum		word;
		int32		radius;

		if (GpuMetricRangeArg(PointerGetDatum(range), &word, &radius))
		{
			int			wlen;
			char	   *w = GpuMetricDatumUtf8(word, &wlen);

			CacheSet(cache, (const char *) range, VARSIZE(range), w, wlen);
			cache->matches_none = false;
			cache->radius = radius;
		}
		else
		{
			/* A range of a NULL word or radius holds no text: as SQL's NULL comparisons. */
			CacheSet(cache, (const char *) range, VARSIZE(range), "", 0);
			cache->matches_none = true;
		}
	}
	if (cache->matches_none)
		PG_RETURN_NULL();
	GpuIvfpqGuard("edit distance", [&] {
		d = cache->pattern->within_utf8(a, (size_t) len, (uint32_t) cache->radius);
	});
	PG_RETURN_BOOL(d <= (uint32) cache->radius);
}

/* edit_range(word, radius): the range of the words within radius edits of word. */
Datum
gpu_metric_edit_range(PG_FUNCTION_ARGS)
{
	int32		radius = PG_GETARG_INT32(1);
	TupleDesc	desc;
	Datum		values[2];
	bool		nulls[2] = {false, false};
	int			len;
	char	   *word = GpuMetricDatumUtf8(PG_GETARG_DATUM(0), &len);

	/* A range no search could take is refused where it is written. */
	GpuMetricCheckLength(word, len);
	GpuMetricCheckRadius(radius);
	if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "edit_range must return a composite type");
	desc = BlessTupleDesc(desc);
	values[0] = PG_GETARG_DATUM(0);
	values[1] = Int32GetDatum(radius);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(desc, values, nulls)));
}
