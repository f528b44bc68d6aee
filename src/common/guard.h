// The one boundary where C++ exceptions become PostgreSQL errors.
#pragma once

#include <cstdio>
#include <exception>
#include <new>

#include "engine/error.h"
#include "common/pg.h"

// Runs fn (engine code: plain memory, no PostgreSQL calls) and turns any
// exception into ereport(ERROR) only after fn's frames are gone, so no
// longjmp ever crosses a C++ frame and no exception crosses a PostgreSQL one.
template <typename Fn>
static inline void
GpuIvfpqGuard(const char *what, Fn &&fn)
{
	char		msg[512];
	int			code = 0;

	msg[0] = '\0';
	try
	{
		fn();
	}
	catch (const gpuivfpq::Error &e)
	{
		snprintf(msg, sizeof(msg), "%s", e.what());
		switch (e.kind())
		{
			case gpuivfpq::ErrorKind::InvalidArgument:
				code = ERRCODE_INVALID_PARAMETER_VALUE;
				break;
			case gpuivfpq::ErrorKind::OutOfMemory:
				code = ERRCODE_OUT_OF_MEMORY;
				break;
			case gpuivfpq::ErrorKind::Unsupported:
				code = ERRCODE_FEATURE_NOT_SUPPORTED;
				break;
			default:
				code = ERRCODE_INTERNAL_ERROR;
				break;
		}
	}
	catch (const std::bad_alloc &)
	{
		snprintf(msg, sizeof(msg), "out of memory");
		code = ERRCODE_OUT_OF_MEMORY;
	}
	catch (const std::exception &e)
	{
		snprintf(msg, sizeof(msg), "%s", e.what());
		code = ERRCODE_INTERNAL_ERROR;
	}
	catch (...)
	{
		snprintf(msg, sizeof(msg), "unknown C++ exception");
		code = ERRCODE_INTERNAL_ERROR;
	}
	if (code != 0)
		ereport(ERROR, (errcode(code), errmsg("gpu_ivfpq %s failed: %s", what, msg)));
}
