// pgvector's types, read without pgvector: which type OIDs are its vector
// and halfvec (looked up once per backend, forgotten when pg_type changes),
// and their documented binary layout (a varlena header, int16 dim, int16
// unused, then dim float4 or IEEE half elements), decoded to float4.
#include <cmath>

#include "common/gpu_ivfpq.h"

extern "C" {
#include "catalog/dependency.h"
#include "catalog/pg_proc.h"
#include "commands/extension.h"
#include "utils/inval.h"
}

/* pgvector's extension, and the names of its types gpu_ivfpq reads. */
#define PGVECTOR_EXTENSION	"vector"
#define PGVECTOR_VECTOR		"vector"
#define PGVECTOR_HALFVEC	"halfvec"

/* Bytes before the elements: the varlena header, dim and unused (int16 each). */
#define PGVECTOR_HEADER_BYTES	(VARHDRSZ + 2 * (int) sizeof(int16))

/* Types whose format was looked up: a few slots, most backends see one or two types. */
#define FORMAT_CACHE_SLOTS	8

typedef struct FormatCacheSlot
{
	Oid			typid;
	GpuIvfpqVectorFormat format;
} FormatCacheSlot;

static FormatCacheSlot format_cache[FORMAT_CACHE_SLOTS];
static int	format_cache_next = 0;
static bool format_cache_registered = false;

/*
 * Forgets every looked-up type when pg_type changes: DROP EXTENSION vector
 * (and a new CREATE EXTENSION) gives the names other OIDs.
 */
static void
FormatCacheReset(Datum arg, int cacheid, uint32 hashvalue)
{
	for (int i = 0; i < FORMAT_CACHE_SLOTS; i++)
		format_cache[i].typid = InvalidOid;
}

/* Whether the type typid belongs to pgvector's extension (pg_depend). */
static bool
IsPgvectorType(Oid typid)
{
	Oid			ext = getExtensionOfObject(TypeRelationId, typid);
	char	   *name;
	bool		result;

	if (!OidIsValid(ext))
		return false;
	name = get_extension_name(ext);
	result = name != NULL && strcmp(name, PGVECTOR_EXTENSION) == 0;
	if (name != NULL)
		pfree(name);
	return result;
}

/* The format of a (base) type, from the catalogs: uncached. */
static GpuIvfpqVectorFormat
LookUpFormat(Oid typid)
{
	HeapTuple	tup;
	Form_pg_type form;
	GpuIvfpqVectorFormat format = GPU_IVFPQ_FORMAT_NONE;

	if (typid == FLOAT4ARRAYOID)
		return GPU_IVFPQ_FORMAT_REAL_ARRAY;
	tup = SearchSysCache1(TYPEOID, ObjectIdGetDatum(typid));
	if (!HeapTupleIsValid(tup))
		return GPU_IVFPQ_FORMAT_NONE;
	form = (Form_pg_type) GETSTRUCT(tup);
	/* By name and extension: another "vector" type of the same name is not pgvector's. */
	if (form->typlen == -1 && strcmp(NameStr(form->typname), PGVECTOR_VECTOR) == 0)
		format = GPU_IVFPQ_FORMAT_VECTOR;
	else if (form->typlen == -1 && strcmp(NameStr(form->typname), PGVECTOR_HALFVEC) == 0)
		format = GPU_IVFPQ_FORMAT_HALFVEC;
	ReleaseSysCache(tup);
	if (format != GPU_IVFPQ_FORMAT_NONE && !IsPgvectorType(typid))
		format = GPU_IVFPQ_FORMAT_NONE;
	return format;
}

/*
 * How values of type typid (a domain counts as its base type) store
 * vectors: real[], pgvector's vector or halfvec, or NONE. Cached per
 * backend: index builds, inserts and scans ask for every value's type.
 */
GpuIvfpqVectorFormat
GpuIvfpqFormatOfType(Oid typid)
{
	GpuIvfpqVectorFormat format;
	FormatCacheSlot *slot;

	if (typid == FLOAT4ARRAYOID)
		return GPU_IVFPQ_FORMAT_REAL_ARRAY;
	if (!OidIsValid(typid))
		return GPU_IVFPQ_FORMAT_NONE;
	for (int i = 0; i < FORMAT_CACHE_SLOTS; i++)
		if (format_cache[i].typid == typid)
			return format_cache[i].format;
	if (!format_cache_registered)
	{
		CacheRegisterSyscacheCallback(TYPEOID, FormatCacheReset, (Datum) 0);
		format_cache_registered = true;
	}
	format = LookUpFormat(getBaseType(typid));
	slot = &format_cache[format_cache_next];
	format_cache_next = (format_cache_next + 1) % FORMAT_CACHE_SLOTS;
	slot->typid = typid;
	slot->format = format;
	return format;
}

/*
 * The format of an index's vector (its first key column, typed by its
 * operator class's input type); an error for a type gpu_ivfpq cannot read.
 */
GpuIvfpqVectorFormat
GpuIvfpqIndexFormat(Relation index)
{
	Oid			typid = TupleDescAttr(RelationGetDescr(index), 0)->atttypid;
	GpuIvfpqVectorFormat format = GpuIvfpqFormatOfType(typid);

	if (format == GPU_IVFPQ_FORMAT_NONE)
		ereport(ERROR,
				(errcode(ERRCODE_DATATYPE_MISMATCH),
				 errmsg("index \"%s\" has a column of type %s, which gpu_ivfpq cannot read",
						RelationGetRelationName(index), format_type_be(typid)),
				 errhint("gpu_ivfpq indexes real[] columns, and pgvector's vector and halfvec with the gpu_ivfpq_pgvector extension.")));
	return format;
}

/*
 * The format of argument argno of the function being called, from its
 * declared type (the SQL functions exist once per query type: real[] in
 * gpu_ivfpq, vector, halfvec and their arrays in gpu_ivfpq_pgvector, all
 * calling the same C function). *is_array says the argument is an array of
 * vector or halfvec values rather than one value (a real[] is one vector or
 * a matrix).
 */
GpuIvfpqVectorFormat
GpuIvfpqArgFormat(FunctionCallInfo fcinfo, int argno, bool *is_array)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fcinfo->flinfo->fn_oid));
	Form_pg_proc proc;
	Oid			typid;
	Oid			elem;
	GpuIvfpqVectorFormat format;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for function %u", fcinfo->flinfo->fn_oid);
	proc = (Form_pg_proc) GETSTRUCT(tup);
	if (argno >= proc->pronargs)
		elog(ERROR, "function %u has no argument %d", fcinfo->flinfo->fn_oid, argno + 1);
	typid = proc->proargtypes.values[argno];
	ReleaseSysCache(tup);

	*is_array = false;
	format = GpuIvfpqFormatOfType(typid);
	if (format != GPU_IVFPQ_FORMAT_NONE)
		return format;
	elem = get_element_type(getBaseType(typid));
	format = GpuIvfpqFormatOfType(elem);
	if (format == GPU_IVFPQ_FORMAT_VECTOR || format == GPU_IVFPQ_FORMAT_HALFVEC)
	{
		*is_array = true;
		return format;
	}
	ereport(ERROR,
			(errcode(ERRCODE_DATATYPE_MISMATCH),
			 errmsg("gpu_ivfpq cannot read query vectors of type %s", format_type_be(typid)),
			 errhint("Pass queries as real[], or as pgvector's vector or halfvec.")));
	return GPU_IVFPQ_FORMAT_NONE;
}

/* The SQL name of a format, for messages. */
const char *
GpuIvfpqFormatName(GpuIvfpqVectorFormat format)
{
	switch (format)
	{
		case GPU_IVFPQ_FORMAT_REAL_ARRAY:
			return "real[]";
		case GPU_IVFPQ_FORMAT_VECTOR:
			return "vector";
		case GPU_IVFPQ_FORMAT_HALFVEC:
			return "halfvec";
		case GPU_IVFPQ_FORMAT_NONE:
			break;
	}
	return "unknown";
}

/*
 * An IEEE 754 half (binary16) as a float: every half is exactly a float,
 * so the index, the GPU and the distances see the column's values
 * unchanged.
 */
static float
HalfToFloat(uint16 h)
{
	uint32		sign = (uint32) (h & 0x8000) << 16;
	uint32		exponent = (h >> 10) & 0x1F;
	uint32		mantissa = h & 0x3FF;
	uint32		bits;
	float		f;

	if (exponent == 0)
	{
		/* Zero and subnormals: mantissa x 2^-24, exact in a float. */
		f = std::ldexp((float) mantissa, -24);
		return sign ? -f : f;
	}
	if (exponent == 0x1F)
		bits = sign | 0x7F800000u | (mantissa << 13);	/* infinity, NaN */
	else
		bits = sign | ((exponent + (127 - 15)) << 23) | (mantissa << 13);
	memcpy(&f, &bits, sizeof(f));
	return f;
}

/*
 * The elements of a pgvector vector or halfvec value as float4 (a halfvec's
 * converted, in the current memory context): the layout is checked against
 * the value's size, and the values must be finite, as for real[]. what names
 * the value in errors.
 */
const float *
GpuIvfpqPgvectorElements(Datum value, GpuIvfpqVectorFormat format, int *dim, const char *what)
{
	struct varlena *v = PG_DETOAST_DATUM(value);
	const char *data = (const char *) v;
	int			elem_size = format == GPU_IVFPQ_FORMAT_HALFVEC ? (int) sizeof(uint16) : (int) sizeof(float);
	int16		n;
	const float *result;

	Assert(format == GPU_IVFPQ_FORMAT_VECTOR || format == GPU_IVFPQ_FORMAT_HALFVEC);
	if (VARSIZE(v) < (Size) PGVECTOR_HEADER_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("%s is not a valid %s value: %u bytes", what, GpuIvfpqFormatName(format),
						(unsigned) VARSIZE(v))));
	memcpy(&n, data + VARHDRSZ, sizeof(n));
	if (n < 1 || VARSIZE(v) != (Size) PGVECTOR_HEADER_BYTES + (Size) n * elem_size)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("%s is not a valid %s value: %d dimensions in %u bytes", what,
						GpuIvfpqFormatName(format), (int) n, (unsigned) VARSIZE(v))));
	if (format == GPU_IVFPQ_FORMAT_VECTOR)
		result = (const float *) (data + PGVECTOR_HEADER_BYTES);
	else
	{
		float	   *f = (float *) palloc(sizeof(float) * n);

		for (int i = 0; i < n; i++)
		{
			uint16		h;

			memcpy(&h, data + PGVECTOR_HEADER_BYTES + (Size) i * sizeof(uint16), sizeof(h));
			f[i] = HalfToFloat(h);
		}
		result = f;
	}
	GpuIvfpqCheckFinite(result, n, what);
	*dim = n;
	return result;
}
