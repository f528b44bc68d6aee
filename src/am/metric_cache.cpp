// The per-backend cache of restored gpu_metric indexes: scans, batch
// functions and inserts search and change the engine's copy of an index
// instead of reading its pages each time. An entry is current while the
// metapage's change count, build id and the relation's file match what it
// was restored from (every insert and VACUUM advances the count in the same
// WAL record as its pages, so this holds on standbys too). Each entry lives
// in a memory context of its own that owns the engine object.
#include "am/metric_am.h"
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
		RelFileNodeEquals(entry->node, index->rd_node) &&
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
	entry->node = index->rd_node;
	entry->build_id = meta->build_id;
	entry->change_count = meta->change_count;
	entry->cxt = cxt;
	/* The structure's arrays are needed only until the engine has copied them. */
	MemoryContextSwitchTo(tmp);
	state = GpuMetricReadState(index, meta, &tids);
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
				entry->change_count == meta->change_count)
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
	entry = Restore(index, meta);
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
