// The one catch ladder of the C++/PostgreSQL boundary (guard.h).
#include <cstdio>

/* Engine headers (the C++ library) before PostgreSQL's, whose macros rename libc calls. */
#include "engine/error.h"
#include "engine/interrupt.h"
#include "common/guard.h"

GpuIvfpqPgError::GpuIvfpqPgError(int sqlerrcode, const char *message)
	: sqlerrcode_(sqlerrcode)
{
	strlcpy(message_, message ? message : "", sizeof(message_));
}

/* Maps the exception being handled to an errcode and a message. */
void
GpuIvfpqCatchCurrent(GpuIvfpqCaught *caught) noexcept
{
	caught->out_of_memory = false;
	caught->from_postgres = false;
	caught->interrupted = false;
	caught->sqlerrcode = ERRCODE_INTERNAL_ERROR;
	try
	{
		throw;
	}
	catch (const GpuIvfpqPgError &e)
	{
		caught->sqlerrcode = e.sqlerrcode();
		caught->from_postgres = true;
		caught->out_of_memory = e.sqlerrcode() == ERRCODE_OUT_OF_MEMORY;
		snprintf(caught->message, sizeof(caught->message), "%s", e.what());
	}
	catch (const gpuivfpq::Error &e)
	{
		switch (e.kind())
		{
			case gpuivfpq::ErrorKind::InvalidArgument:
				caught->sqlerrcode = ERRCODE_INVALID_PARAMETER_VALUE;
				break;
			case gpuivfpq::ErrorKind::OutOfMemory:
				caught->sqlerrcode = ERRCODE_OUT_OF_MEMORY;
				caught->out_of_memory = true;
				break;
			case gpuivfpq::ErrorKind::Unsupported:
				caught->sqlerrcode = ERRCODE_FEATURE_NOT_SUPPORTED;
				break;
			case gpuivfpq::ErrorKind::Internal:
				caught->sqlerrcode = ERRCODE_INTERNAL_ERROR;
				break;
		}
		snprintf(caught->message, sizeof(caught->message), "%s", e.what());
	}
	catch (const gpuivfpq::Interrupted &e)
	{
		caught->sqlerrcode = ERRCODE_QUERY_CANCELED;
		caught->interrupted = true;
		snprintf(caught->message, sizeof(caught->message), "%s", e.what());
	}
	catch (const std::bad_alloc &)
	{
		caught->sqlerrcode = ERRCODE_OUT_OF_MEMORY;
		caught->out_of_memory = true;
		snprintf(caught->message, sizeof(caught->message), "out of host memory");
	}
	catch (const std::exception &e)
	{
		snprintf(caught->message, sizeof(caught->message), "%s", e.what());
	}
	catch (...)
	{
		snprintf(caught->message, sizeof(caught->message), "unknown C++ exception");
	}
}

void
GpuIvfpqReportCaught(const char *what, const GpuIvfpqCaught *caught)
{
	/*
	 * The engine stopped because this would end the statement (or the
	 * process): the cancel, timeout or shutdown reports itself.
	 */
	if (caught->interrupted)
	{
		CHECK_FOR_INTERRUPTS();
		ereport(ERROR,
				(errcode(ERRCODE_QUERY_CANCELED),
				 errmsg("canceling statement: gpu_ivfpq %s was interrupted", what)));
	}
	/* PostgreSQL's own errors (a cancel, a missing relation) keep their words. */
	if (caught->from_postgres)
		ereport(ERROR, (errcode(caught->sqlerrcode), errmsg("%s", caught->message)));
	ereport(ERROR,
			(errcode(caught->sqlerrcode),
			 errmsg("gpu_ivfpq %s failed: %s", what, caught->message)));
	pg_unreachable();
}

void
GpuIvfpqTakeError(MemoryContext cxt, int *sqlerrcode, char *message, Size len)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(cxt);
	edata = CopyErrorData();
	FlushErrorState();
	*sqlerrcode = edata->sqlerrcode;
	strlcpy(message, edata->message ? edata->message : "error", len);
	FreeErrorData(edata);
}

/*
 * The engine's interrupt poll: whether the next CHECK_FOR_INTERRUPTS() would
 * end the statement or the process (ProcessInterrupts' rules for a
 * termination and for a cancel or timeout), so that the engine never stops
 * for an interrupt that would let the statement go on. Called on the
 * engine's threads: it only reads the flags the signal handlers set.
 */
static bool
GpuIvfpqEngineShouldStop(void)
{
	if (!InterruptPending || InterruptHoldoffCount != 0 || CritSectionCount != 0)
		return false;
	return ProcDiePending || (QueryCancelPending && QueryCancelHoldoffCount == 0);
}

void
GpuIvfpqInstallInterruptPoll(void)
{
	gpuivfpq::set_interrupt_poll(GpuIvfpqEngineShouldStop);
}
