// The per-backend cache of restored gpu_metric indexes: scans, batch
// functions and inserts search and change the engine's copy of an index
// instead of reading its pages each time. An entry is current while the
// metapage's change count, build id and the relation's file match what it
// was restored from (every insert and VACUUM advances the count in the same
// WAL record as its pages, so this holds on standbys too). An entry behind
// by other backends' inserts only reads the records they appended; after a
// VACUUM it is restored in full. Each entry lives in a memory context of
// its own that owns the engine object.
#include "metric/am.h"
#include "common/guard.h"

/* Indexes a backend keeps restored at once; the least recently used goes first. */
#define GPU_METRIC_CACHE_ENTRIES 8

static GpuMetricCached *cache_entries[GPU_METRIC_CACHE_ENTRIES];
static uint64 cache_clock = 0;

/* Whether entry describes the index as meta (read from its metapage) does. */
static bool
EntryMatches(const GpuMetricCached *entry, Relation index, const GpuMetricMetaPageData *meta)
{
	return entry->indexrelid == RelationGetRelid(index) &&
		GpuIvfpqRelFileEquals(entry->node, GpuIvfpqRelFileOf(index)) &&
		entry->build_id == meta->build_id;
}

/*
 * Restores the index from its pages into a new entry. The caller holds the
 * metapage's lock, under which it read meta. The entry's context is made
 * under the current one and moved to the top only once complete, so that
 * an error on the way frees it with the transaction.
 */
static GpuMetricCached *
Restore(Relation index, const GpuMetricMetaPageData *meta)
{
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext, "gpu_metric cached index",
											  ALLOCSET_DEFAULT_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	MemoryContext tmp = AllocSetContextCreate(cxt, "gpu_metric restore", ALLOCSET_DEFAULT_SIZES);
	GpuMetricCached *entry = (GpuMetricCached *) palloc0(sizeof(GpuMetricCached));
	GpuMetricStoredState *state;
	ItemPointerData *tids;

	entry->indexrelid = RelationGetRelid(index);
	entry->node = GpuIvfpqRelFileOf(index);
	entry->build_id = meta->build_id;
	entry->change_count = meta->change_count;
	entry->cxt = cxt;
	/* The structure's arrays are needed only until the engine has copied them. */
	MemoryContextSwitchTo(tmp);
	state = GpuMetricReadState(index, meta, &tids, &entry->end_blk, &entry->end_off);
	entry->vacuum_count = meta->vacuum_count;
	entry->engine = GpuIvfpqMakeOwned<GpuMetricEngine>(cxt, "restoring the index", *state);

	/* Kept for the batch functions (TIDs, and the words they return). */
	MemoryContextSwitchTo(cxt);
	entry->objects = meta->objects;
	entry->capacity = Max(meta->objects, (uint64) 16);
	entry->tids = (ItemPointerData *) palloc_extended(sizeof(ItemPointerData) * entry->capacity, MCXT_ALLOC_HUGE);
	memcpy(entry->tids, tids, sizeof(ItemPointerData) * meta->objects);
	entry->offsets = (uint64 *) palloc_extended(sizeof(uint64) * (entry->capacity + 1), MCXT_ALLOC_HUGE);
	memcpy(entry->offsets, state->offsets, sizeof(uint64) * (meta->objects + 1));
	entry->bytes_used = (Size) state->offsets[meta->objects];
	entry->bytes_capacity = Max(entry->bytes_used, (Size) 1024);
	entry->bytes = (char *) palloc_extended(entry->bytes_capacity, MCXT_ALLOC_HUGE);
	memcpy(entry->bytes, state->bytes, entry->bytes_used);
	MemoryContextDelete(tmp);
	entry->valid = true;
	MemoryContextSwitchTo(old);
	return entry;
}

/*
 * Brings entry up to meta when only inserts happened since it was current:
 * reads the object records appended after the ones it holds and inserts
 * each into the engine's copy where the record says (no VACUUM since, so
 * the copy holds every earlier record with its flags). false when it
 * cannot (a VACUUM, a rebuild, records that do not follow): the caller
 * restores the index in full. The caller holds the metapage's lock.
 */
static bool
CatchUp(Relation index, GpuMetricCached *entry, const GpuMetricMetaPageData *meta)
{
	MemoryContext cxt;
	MemoryContext old;
	uint32	   *cps;
	BlockNumber blk = entry->end_blk;
	int			off = entry->end_off;
	int			extra = GpuMetricObjectExtra(meta);
	BlockNumber nblocks = RelationGetNumberOfBlocks(index);
	BlockNumber pages = 0;
	bool		ok = true;

	if (entry->vacuum_count != meta->vacuum_count || meta->objects < entry->objects ||
		entry->engine->index().size() != entry->objects)
		return false;
	if (blk == InvalidBlockNumber)
	{
		blk = meta->object_head;
		off = 0;
	}
	cxt = AllocSetContextCreate(CurrentMemoryContext, "gpu_metric catch-up", ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(cxt);
	cps = (uint32 *) palloc(sizeof(uint32) * GPU_METRIC_MAX_WORD_BYTES);
	/* Ahead of the pages until done: an error on the way leaves it to a full restore. */
	entry->valid = false;
	while (ok && blk != InvalidBlockNumber)
	{
		Buffer		buf;
		Page		page;
		const char *base;
		int			used;

		/* Past the end, the metapage (a lock this backend may hold), or a loop: a full restore says why. */
		if (blk == GPU_METRIC_METAPAGE_BLKNO || blk >= nblocks || ++pages > nblocks)
		{
			ok = false;
			break;
		}
		buf = ReadBuffer(index, blk);
		LockBuffer(buf, BUFFER_LOCK_SHARE);
		page = BufferGetPage(buf);
		used = GpuMetricObjectPageUsed(index, blk, page);
		base = (const char *) PageGetContents(page);
		ok = off <= used;
		while (ok && off < used)
		{
			GpuMetricObjectHeader hdr;
			int			next = GpuMetricNextObject(index, meta, blk, base, used, off, &hdr);
			const char *part = base + off + GPU_METRIC_OBJ_HEADER;
			const char *word = part + extra;
			uint32		cluster = 0;
			size_t		ncp = 0;
			GpuIvfpqCaught caught;

			if (meta->method == GPU_METRIC_METHOD_LC)
				memcpy(&cluster, part, sizeof(uint32));
			/* A record appended since holds its flags from its insert: none (or a later VACUUM's). */
			ok = entry->objects < meta->objects && hdr.flags == 0;
			if (ok)
				ok = GpuIvfpqTry([&] {
					ncp = GpuMetricDecode(word, hdr.nbytes, cps);
					entry->engine->insert_stored(cps, ncp, cluster, (const uint8_t *) part);
				}, &caught);
			if (ok)
			{
				GpuMetricCacheReserve(entry, hdr.nbytes);
				GpuMetricCacheAppend(entry, &hdr.tid, word, hdr.nbytes);
				entry->end_blk = blk;
				entry->end_off = next;
			}
			off = next;
		}
		blk = GpuMetricPageGetOpaque(page)->next;
		UnlockReleaseBuffer(buf);
		off = 0;
	}
	MemoryContextSwitchTo(old);
	MemoryContextDelete(cxt);
	if (!ok || entry->objects != meta->objects || entry->engine->index().size() != entry->objects)
		return false;
	elog(DEBUG2, "gpu_metric: index \"%s\" caught up to %llu objects", RelationGetRelationName(index),
		 (unsigned long long) meta->objects);
	entry->change_count = meta->change_count;
	entry->valid = true;
	return true;
}

/*
 * The current restored copy of index, meta being its metapage as read under
 * the metapage's lock, which the caller still holds (share to search,
 * exclusive to insert). Valid until the next call of this file's functions.
 */
GpuMetricCached *
GpuMetricGetCachedLocked(Relation index, const GpuMetricMetaPageData *meta)
{
	int			slot = -1;
	GpuMetricCached *entry;

	for (int i = 0; i < GPU_METRIC_CACHE_ENTRIES; i++)
	{
		entry = cache_entries[i];
		if (entry != NULL && entry->indexrelid == RelationGetRelid(index))
		{
			if (entry->valid && EntryMatches(entry, index, meta) &&
				(entry->change_count == meta->change_count || CatchUp(index, entry, meta)))
			{
				entry->last_used = ++cache_clock;
				return entry;
			}
			slot = i;
			break;
		}
	}
	if (slot < 0)
	{
		/* A free slot, else the least recently used. */
		slot = 0;
		for (int i = 0; i < GPU_METRIC_CACHE_ENTRIES; i++)
		{
			if (cache_entries[i] == NULL)
			{
				slot = i;
				break;
			}
			if (cache_entries[i]->last_used < cache_entries[slot]->last_used)
				slot = i;
		}
	}
	if (cache_entries[slot] != NULL)
	{
		MemoryContext gone = cache_entries[slot]->cxt;

		cache_entries[slot] = NULL;
		MemoryContextDelete(gone);
	}
	{
		TimestampTz start = GetCurrentTimestamp();

		entry = Restore(index, meta);
		elog(DEBUG1, "gpu_metric: restored index \"%s\" (%llu objects) from its pages in %.3f ms",
			 RelationGetRelationName(index), (unsigned long long) meta->objects,
			 (double) (GetCurrentTimestamp() - start) / 1000.0);
	}
	MemoryContextSetParent(entry->cxt, TopMemoryContext);
	entry->last_used = ++cache_clock;
	cache_entries[slot] = entry;
	return entry;
}

/*
 * The current restored copy of index, and its metapage in *meta: takes the
 * metapage's share lock for as long as it reads.
 */
GpuMetricCached *
GpuMetricGetCached(Relation index, GpuMetricMetaPageData *meta)
{
	Buffer		metabuf = ReadBuffer(index, GPU_METRIC_METAPAGE_BLKNO);
	GpuMetricCached *entry;

	LockBuffer(metabuf, BUFFER_LOCK_SHARE);
	GpuMetricReadMeta(index, metabuf, meta);
	entry = GpuMetricGetCachedLocked(index, meta);
	UnlockReleaseBuffer(metabuf);
	return entry;
}

/*
 * Makes room in entry for one more object of len bytes, so that recording
 * it after the engine took it (GpuMetricCacheAppend) cannot fail.
 */
void
GpuMetricCacheReserve(GpuMetricCached *entry, int len)
{
	MemoryContext old = MemoryContextSwitchTo(entry->cxt);

	if (entry->objects + 1 > entry->capacity)
	{
		entry->capacity *= 2;
		entry->tids = (ItemPointerData *) repalloc_huge(entry->tids, sizeof(ItemPointerData) * entry->capacity);
		entry->offsets = (uint64 *) repalloc_huge(entry->offsets, sizeof(uint64) * (entry->capacity + 1));
	}
	if (entry->bytes_used + len > entry->bytes_capacity)
	{
		entry->bytes_capacity = Max(entry->bytes_capacity * 2, entry->bytes_used + len);
		entry->bytes = (char *) repalloc_huge(entry->bytes, entry->bytes_capacity);
	}
	MemoryContextSwitchTo(old);
}

/* Records the object an insert just added to entry's engine (room reserved). */
void
GpuMetricCacheAppend(GpuMetricCached *entry, const ItemPointerData *tid, const char *utf8, int len)
{
	Assert(entry->objects + 1 <= entry->capacity && entry->bytes_used + len <= entry->bytes_capacity);
	entry->tids[entry->objects] = *tid;
	memcpy(entry->bytes + entry->bytes_used, utf8, len);
	entry->bytes_used += len;
	entry->objects++;
	entry->offsets[entry->objects] = entry->bytes_used;
}
