// aminsert: encode one new row and append it to its nearest list.
#include "am/am.h"
#include "service/service.h"
#include "service/wal_announce.h"
#include "common/guard.h"
#include "engine/ivfpq.h"

/* Inserts one row: NULLs are not indexed; a wrong dimension is an error. */
bool
gpuivfpqinsert(Relation index, Datum *values, bool *isnull, ItemPointer heap_tid,
			   Relation heap, IndexUniqueCheck checkUnique,
			   bool indexUnchanged, IndexInfo *indexInfo)
{
	MemoryContext ctx;
	MemoryContext old;
	GpuIvfpqMetaPageData meta;
	const float *v;
	int			dim;
	char	   *entry;
	GpuIvfpqEntryLayout el;
	int32		list = 0;
	float		radius = 0.0f;
	float		qerror = 0.0f;

	if (isnull[0])
		return false;

	ctx = AllocSetContextCreate(CurrentMemoryContext, "gpu_ivfpq insert", ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(ctx);

	v = GpuIvfpqDatumVector(values[0], GpuIvfpqIndexFormat(index), &dim, "indexed vector");
	GpuIvfpqReadMeta(index, &meta);
	if (meta.dimensions == 0)
	{
		/* An index built on an empty table: its first vector sets the dimension m must divide. */
		GpuIvfpqCheckIndexableDim(dim);
		if (index->rd_options != NULL &&
			((GpuIvfpqOptions *) index->rd_options)->codes == GPU_IVFPQ_CODES_RABITQ)
			GpuIvfpqRabitqCheckDim(index, dim);
		else
			(void) GpuIvfpqChooseM(index, dim, true);
		GpuIvfpqSetDimensions(index, &meta, dim);
	}
	if ((uint32) dim != meta.dimensions)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_EXCEPTION),
				 errmsg("vector has %d dimensions, the index \"%s\" has %u",
						dim, RelationGetRelationName(index), meta.dimensions),
				 errhint("Every indexed vector must have the same number of dimensions.")));

	el = GpuIvfpqLayoutOf(&meta);
	entry = (char *) palloc0(el.xsize);
	if (el.vdim > 0)
		memcpy(entry, v, sizeof(float) * el.vdim);
	memcpy(entry + el.xtid, heap_tid, GPU_IVFPQ_TID_BYTES);
	if (el.keyed)
	{
		int64		key = GpuIvfpqFilterKeyOf(index, values[1], isnull[1]);

		memcpy(entry + el.xkey, &key, GPU_IVFPQ_FILTER_KEY_BYTES);
	}
	if (GpuIvfpqIsRabitq(&meta))
		GpuIvfpqRabitqEncode(GpuIvfpqGetRabitqModel(index, &meta), v, 1, &list,
							 (uint8 *) entry + el.xcode, &radius, 1, false);
	else if (meta.trained)
	{
		gpuivfpq::IvfPqModel *model = GpuIvfpqGetModel(index, &meta);
		uint8	   *code = (uint8 *) entry + el.xcode;

		GpuIvfpqGuard("encoding", [&] {
			model->encode(v, 1, &list, code, &radius, 1);
			model->quantization_errors(v, 1, &list, code, &qerror);
		});
	}
	/* Before the page: a standby learns first whether it will hear of the change. */
	GpuIvfpqWalNoteChange(index, &meta);
	GpuIvfpqAppendEntries(index, &meta, list, entry, 1, radius, qerror, false);
	/* After the page: a mirror loaded from now on sees it in the pages or the log. */
	if (meta.trained)
		GpuIvfpqServiceLogAppend(index, &meta, list, GpuIvfpqTidToLabel(heap_tid),
								 (const uint8 *) entry + el.xcode, el.vdim > 0 ? v : NULL,
								 el.keyed ? (const char *) entry + el.xkey : NULL);

	MemoryContextSwitchTo(old);
	MemoryContextDelete(ctx);
	return false;
}
