// WAL records of gpu_ivfpq's resource manager that announce the change
// log's entries (an insert's entry, VACUUM's removals, invalidations): WAL
// replay changes the index pages on a standby without the change log, and
// the replay of these records pushes the same entries there, so the
// standby's GPU mirrors follow its pages. Also the metapage flag that
// tells standbys when a primary could not announce its changes.
#include "service/shmem.h"
#include "service/wal_announce.h"

extern "C" {
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xlogreader.h"
#include "lib/stringinfo.h"
}

/* Record kinds, in the info bits left to a resource manager. */
#define XLOG_GPU_IVFPQ_APPEND		0x00
#define XLOG_GPU_IVFPQ_REMOVE		0x10
#define XLOG_GPU_IVFPQ_INVALIDATE	0x20

/*
 * Every record starts with this. APPEND: then the entry's vector (vdim
 * floats, aligned since the header is and replay gets the data MAXALIGNed)
 * and its code (count bytes, up to the widest RaBitQ row,
 * GPU_IVFPQ_LOG_MAX_CODE); REMOVE: count labels (int64); INVALIDATE:
 * nothing, and only key.db and key.index are set. Replay checks the length
 * against these fields, so a record of another layout is never misread.
 */
typedef struct GpuIvfpqWalChange
{
	GpuIvfpqKey key;			/* the index version the change is to */
	int64		label;			/* APPEND: the entry's heap TID */
	int64		filter_key;		/* APPEND: its filter key (0 without a filter column) */
	int32		list;			/* APPEND: its list */
	int32		vdim;			/* APPEND: floats of its vector (0: none) */
	int32		count;			/* APPEND: code bytes (m); REMOVE: labels */
	int32		reserved;		/* 0; anything else comes from another layout */
} GpuIvfpqWalChange;

StaticAssertDecl(sizeof(GpuIvfpqWalChange) == 48, "the WAL record header changed size");

static bool rmgr_registered = false;

/*
 * Whether changes here are announced: the resource manager is registered
 * and the change log exists (both come with the preload), and standbys may
 * exist (wal_level replica or logical; with minimal there are none, and a
 * standby made after a change of wal_level loads its mirrors from pages
 * written meanwhile).
 */
static bool
Announcing(void)
{
	return rmgr_registered && gpu_ivfpq_service != NULL && XLogStandbyInfoActive();
}

/* Writes one record: the header, then the payload's parts (NULL or empty ones skipped). */
static void
InsertChange(uint8 info, const GpuIvfpqWalChange *rec, const void *part1, Size len1,
			 const void *part2, Size len2)
{
	XLogBeginInsert();
	XLogRegisterData((char *) rec, sizeof(*rec));
	if (part1 != NULL && len1 > 0)
		XLogRegisterData((char *) part1, (int) len1);
	if (part2 != NULL && len2 > 0)
		XLogRegisterData((char *) part2, (int) len2);
	(void) XLogInsert(GPU_IVFPQ_RMGR_ID, info);
}

/*
 * Announces an insert's log entry, with its vector (entry->vdim floats) or
 * without (NULL), and its code (entry->m bytes).
 */
void
GpuIvfpqWalAnnounceAppend(Relation index, const GpuIvfpqLogEntry *entry, const float *vector, const uint8 *code)
{
	GpuIvfpqWalChange rec;

	if (!Announcing() || !RelationNeedsWAL(index))
		return;
	memset(&rec, 0, sizeof(rec));
	rec.key = entry->key;
	rec.label = entry->label;
	rec.filter_key = entry->filter_key;
	rec.list = entry->list;
	rec.vdim = vector != NULL ? entry->vdim : 0;
	rec.count = entry->m;
	InsertChange(XLOG_GPU_IVFPQ_APPEND, &rec, vector, sizeof(float) * rec.vdim, code, rec.count);
}

/* Announces VACUUM's removal of n labels from the mirror of key, in one record. */
void
GpuIvfpqWalAnnounceRemove(Relation index, const GpuIvfpqKey *key, const int64 *labels, int n)
{
	GpuIvfpqWalChange rec;

	if (!Announcing() || !RelationNeedsWAL(index) || n <= 0)
		return;
	memset(&rec, 0, sizeof(rec));
	rec.key = *key;
	rec.count = n;
	InsertChange(XLOG_GPU_IVFPQ_REMOVE, &rec, labels, sizeof(int64) * n, NULL, 0);
}

/* Announces an invalidation of the mirrors of key's index (logged: the index is WAL-logged). */
void
GpuIvfpqWalAnnounceInvalidate(const GpuIvfpqKey *key, bool logged)
{
	GpuIvfpqWalChange rec;

	if (!Announcing() || !logged)
		return;
	memset(&rec, 0, sizeof(rec));
	rec.key.db = key->db;
	rec.key.index = key->index;
	InsertChange(XLOG_GPU_IVFPQ_INVALIDATE, &rec, NULL, 0, NULL, 0);
}

/* ---- replay ---- */

/* The name of a record kind, or NULL for one this build does not know. */
static const char *
GpuIvfpqWalIdentify(uint8 info)
{
	switch (info & ~XLR_INFO_MASK)
	{
		case XLOG_GPU_IVFPQ_APPEND:
			return "APPEND";
		case XLOG_GPU_IVFPQ_REMOVE:
			return "REMOVE";
		case XLOG_GPU_IVFPQ_INVALIDATE:
			return "INVALIDATE";
	}
	return NULL;
}

/*
 * Whether a record of this kind, with this header, is exactly len bytes
 * long as this build writes it (with sane counts).
 */
static bool
LayoutMatches(uint8 info, const GpuIvfpqWalChange *rec, Size len)
{
	if (rec->reserved != 0)
		return false;
	switch (info)
	{
		case XLOG_GPU_IVFPQ_APPEND:
			return rec->count >= 1 && rec->count <= GPU_IVFPQ_LOG_MAX_CODE &&
				rec->vdim >= 0 && rec->vdim <= GPU_IVFPQ_SERVICE_MAX_DIM &&
				len == sizeof(*rec) + sizeof(float) * rec->vdim + rec->count;
		case XLOG_GPU_IVFPQ_REMOVE:
			return rec->count >= 1 && len == sizeof(*rec) + sizeof(int64) * (Size) rec->count;
		case XLOG_GPU_IVFPQ_INVALIDATE:
			return len == sizeof(*rec);
	}
	return false;
}

/* Pushes an invalidation of the mirrors of one index into the change log. */
static void
PushInvalidate(Oid db, Oid index)
{
	GpuIvfpqLogEntry e;

	memset(&e, 0, sizeof(e));
	e.key.db = db;
	e.key.index = index;
	e.kind = LOG_INVALIDATE;
	(void) GpuIvfpqLogPush(&e, NULL, NULL);
}

/*
 * rm_redo: pushes the announced change into this server's change log, after
 * the page records before it were replayed, exactly as the primary pushed
 * it after writing its pages, and wakes the service. Never waits for the
 * service (nor errors without one: then no mirror exists). A record this
 * build cannot read drops the mirror it concerns, which reloads from the
 * pages, or every mirror when not even its index can be read.
 */
static void
GpuIvfpqWalRedo(XLogReaderState *record)
{
	uint8		info = XLogRecGetInfo(record) & ~XLR_INFO_MASK;
	Size		len = XLogRecGetDataLen(record);
	const char *data = XLogRecGetData(record);
	GpuIvfpqWalChange rec;

	if (gpu_ivfpq_service == NULL)
		return;
	if (len < sizeof(rec))
	{
		ereport(WARNING,
				(errmsg("gpu_ivfpq: WAL record of %zu bytes is shorter than any this build writes; every GPU mirror is dropped",
						len)));
		GpuIvfpqLogDropAll();
	}
	else
	{
		memcpy(&rec, data, sizeof(rec));
		if (!LayoutMatches(info, &rec, len))
		{
			ereport(WARNING,
					(errmsg("gpu_ivfpq: WAL record (kind 0x%02X, %zu bytes) for index %u of database %u is not one this build writes; its GPU mirror is dropped",
							info, len, rec.key.index, rec.key.db)));
			PushInvalidate(rec.key.db, rec.key.index);
		}
		else if (info == XLOG_GPU_IVFPQ_APPEND)
		{
			GpuIvfpqLogEntry e;
			const float *vector = (const float *) (data + sizeof(rec));
			const uint8 *code = (const uint8 *) (data + sizeof(rec) + sizeof(float) * rec.vdim);

			/* A wide code (a RaBitQ row) goes to the vector ring, as on the primary. */
			memset(&e, 0, offsetof(GpuIvfpqLogEntry, code));
			e.key = rec.key;
			e.kind = LOG_APPEND;
			e.m = (uint16) rec.count;
			e.list = rec.list;
			e.label = rec.label;
			e.vdim = rec.vdim;
			e.filter_key = rec.filter_key;
			(void) GpuIvfpqLogPush(&e, rec.vdim > 0 ? vector : NULL, code);
		}
		else if (info == XLOG_GPU_IVFPQ_REMOVE)
			(void) GpuIvfpqLogPushRemove(&rec.key, (const int64 *) (data + sizeof(rec)), rec.count);
		else
			PushInvalidate(rec.key.db, rec.key.index);
	}
	GpuIvfpqServiceWake();
}

/* rm_desc: what a record says, for the server's messages about WAL and pg_walinspect. */
static void
GpuIvfpqWalDesc(StringInfo buf, XLogReaderState *record)
{
	uint8		info = XLogRecGetInfo(record) & ~XLR_INFO_MASK;
	Size		len = XLogRecGetDataLen(record);
	GpuIvfpqWalChange rec;

	if (len < sizeof(rec))
	{
		appendStringInfo(buf, "%zu bytes, not a layout of this build", len);
		return;
	}
	memcpy(&rec, XLogRecGetData(record), sizeof(rec));
	appendStringInfo(buf, "db %u index %u", rec.key.db, rec.key.index);
	if (!LayoutMatches(info, &rec, len))
		appendStringInfo(buf, ", %zu bytes, not a layout of this build", len);
	else if (info == XLOG_GPU_IVFPQ_APPEND)
		appendStringInfo(buf, " rel %u build %u: list %d tid (%u,%u) code %d bytes vector %d floats filter key " INT64_FORMAT,
						 rec.key.relnode, rec.key.build, rec.list, (unsigned int) (rec.label >> 16),
						 (unsigned int) (rec.label & 0xFFFF), rec.count, rec.vdim, rec.filter_key);
	else if (info == XLOG_GPU_IVFPQ_REMOVE)
		appendStringInfo(buf, " rel %u build %u: %d entries", rec.key.relnode, rec.key.build, rec.count);
}

/*
 * rm_cleanup, at the end of recovery: mirrors loaded while this server was
 * a standby may lack changes that a primary without the preload never
 * announced (a standby refuses the indexes it flagged, a primary does
 * not), and so may a load still running. Every mirror goes, as when the
 * change log overflows (which also discards loads in flight), and reloads
 * from the pages on its next scan.
 */
static void
GpuIvfpqWalCleanup(void)
{
	if (gpu_ivfpq_service == NULL)
		return;
	ereport(LOG,
			(errmsg("gpu_ivfpq: recovery ended, every GPU mirror is dropped and reloads on its next scan")));
	GpuIvfpqLogDropAll();
	GpuIvfpqServiceWake();
}

/*
 * Registers the resource manager; from _PG_init while shared_preload_libraries
 * is processed (the only time PostgreSQL accepts one), so that the startup
 * process can replay the records and backends write them.
 */
void
GpuIvfpqWalRegister(void)
{
	static RmgrData rmgr;

	memset(&rmgr, 0, sizeof(rmgr));
	rmgr.rm_name = GPU_IVFPQ_RMGR_NAME;
	rmgr.rm_redo = GpuIvfpqWalRedo;
	rmgr.rm_desc = GpuIvfpqWalDesc;
	rmgr.rm_identify = GpuIvfpqWalIdentify;
	rmgr.rm_cleanup = GpuIvfpqWalCleanup;
	RegisterCustomRmgr(GPU_IVFPQ_RMGR_ID, &rmgr);
	rmgr_registered = true;
}

/*
 * Called before an insert or VACUUM changes the pages of index (meta: its
 * metapage, kept up to date). Where changes are not announced (no
 * preload), the metapage says so once, before the first unannounced
 * change reaches any standby: they stop serving the index from GPU
 * mirrors that would miss it. Where they are, a flag left by such a
 * server goes, after an invalidation that drops the standbys' mirrors,
 * which may have missed those changes.
 */
void
GpuIvfpqWalNoteChange(Relation index, GpuIvfpqMetaPageData *meta)
{
	bool		flagged = (meta->flags & GPU_IVFPQ_META_UNANNOUNCED) != 0;

	/* Indexes that no server mirrors, or that no standby sees. */
	if (!GpuIvfpqLogsChanges(meta) || !RelationNeedsWAL(index) ||
		!XLogStandbyInfoActive())
		return;
	if (!Announcing() && !flagged)
		GpuIvfpqSetMetaFlag(index, meta, GPU_IVFPQ_META_UNANNOUNCED, true);
	else if (Announcing() && flagged)
	{
		GpuIvfpqServiceInvalidate(index, false);
		GpuIvfpqSetMetaFlag(index, meta, GPU_IVFPQ_META_UNANNOUNCED, false);
	}
}
