// The change log's entries as WAL records of gpu_ivfpq's own resource
// manager, so that standbys (and crash recovery) keep GPU mirrors coherent
// with the index pages that WAL replay changes; what the access method and
// _PG_init call (wal_announce.cpp).
#pragma once

#include "am/am.h"

/*
 * The WAL resource manager id of gpu_ivfpq, in PostgreSQL's custom range
 * (128..255; 128, RM_EXPERIMENTAL_ID, is for development only). It is
 * written into every record, so it must never change, and no other
 * extension loaded by the same server may use it.
 */
#define GPU_IVFPQ_RMGR_ID		187
#define GPU_IVFPQ_RMGR_NAME		"gpu_ivfpq"

extern void GpuIvfpqWalRegister(void);
extern void GpuIvfpqWalNoteChange(Relation index, GpuIvfpqMetaPageData *meta);
