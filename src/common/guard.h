// The C++/PostgreSQL boundary: exactly one mechanism each way.
//
// PostgreSQL reports errors with longjmp, C++ with exceptions; neither may
// cross the other's frames.
//   GpuIvfpqGuard / GpuIvfpqTry  PostgreSQL code runs C++ code: one catch
//       ladder (GpuIvfpqCatchCurrent) turns any exception into a code and a
//       message; the guard ereports only after the C++ frames are gone, the
//       service worker (which must answer requests, not abort) gets a bool.
//   GpuIvfpqPgCall  C++ code (with live objects) calls something that can
//       ereport: the ERROR is caught inside and rethrown as a C++ exception,
//       so destructors run and the guard above reports it with its errcode.
//   GpuIvfpqMakeOwned  engine objects owned by a memory context: deleted
//       when the context is reset or deleted, on success or error alike.
// Cancels reach the engine the other way, as a poll (engine/interrupt.h)
// that GpuIvfpqInstallInterruptPoll installs: the engine's loops stop with
// gpuivfpq::Interrupted once CHECK_FOR_INTERRUPTS() would end the statement,
// and the guard then lets CHECK_FOR_INTERRUPTS() raise it.
// Frames that can ereport hold no std:: containers (a longjmp would skip
// their destructors); they hold palloc'd memory or owned engine objects.
#pragma once

#include <exception>
#include <new>
#include <utility>

#include "common/pg.h"

/* What the catch ladder made of an exception. */
typedef struct GpuIvfpqCaught
{
	int			sqlerrcode;
	bool		out_of_memory;	/* device or host memory: callers may fall back */
	bool		from_postgres;	/* a PostgreSQL ERROR carried by GpuIvfpqPgCall */
	bool		interrupted;	/* the engine stopped for a pending cancel or shutdown */
	char		message[512];
} GpuIvfpqCaught;

/* A PostgreSQL ERROR carried through C++ frames by GpuIvfpqPgCall. */
class GpuIvfpqPgError : public std::exception
{
public:
	GpuIvfpqPgError(int sqlerrcode, const char *message);
	const char *what() const noexcept override { return message_; }
	int			sqlerrcode() const { return sqlerrcode_; }

private:
	int			sqlerrcode_;
	char		message_[512];
};

/* The one catch ladder; call only from inside a catch block. */
extern void GpuIvfpqCatchCurrent(GpuIvfpqCaught *caught) noexcept;

/*
 * ereport(ERROR) for a caught exception ("gpu_ivfpq <what> failed: ..."); an
 * interrupted engine raises the pending cancel or shutdown itself.
 */
[[noreturn]] extern void GpuIvfpqReportCaught(const char *what, const GpuIvfpqCaught *caught);

/* Makes the engine's loops stop for this process's cancels and shutdowns (_PG_init). */
extern void GpuIvfpqInstallInterruptPoll(void);

/* Runs fn; false (and caught filled) when it threw. Never ereports. */
template <typename Fn>
static inline bool
GpuIvfpqTry(Fn &&fn, GpuIvfpqCaught *caught)
{
	try
	{
		fn();
		return true;
	}
	catch (...)
	{
		GpuIvfpqCatchCurrent(caught);
		return false;
	}
}

/*
 * Runs fn (C++ code) and turns any exception into ereport(ERROR) once fn's
 * frames are gone, so no longjmp ever crosses a C++ frame.
 */
template <typename Fn>
static inline void
GpuIvfpqGuard(const char *what, Fn &&fn)
{
	GpuIvfpqCaught caught;

	if (!GpuIvfpqTry(std::forward<Fn>(fn), &caught))
		GpuIvfpqReportCaught(what, &caught);
}

/* Copies the current PostgreSQL error into err and clears it (inside PG_CATCH). */
extern void GpuIvfpqTakeError(MemoryContext cxt, int *sqlerrcode, char *message, Size len);

/*
 * Runs fn (PostgreSQL calls only, no C++ objects with destructors inside)
 * from C++ code: an ERROR raised in it becomes a GpuIvfpqPgError exception.
 * The error is flushed without a (sub)transaction rollback, so fn must be a
 * call that leaves nothing behind when it fails (no lock or resource taken
 * before the ERROR), made outside critical sections and HOLD_INTERRUPTS:
 * errfinish clears those counts. Only the message and errcode travel.
 */
template <typename Fn>
static inline void
GpuIvfpqPgCall(Fn &&fn)
{
	MemoryContext cxt = CurrentMemoryContext;
	volatile bool failed = false;
	int			code = 0;
	char		message[512];

	Assert(CritSectionCount == 0 && InterruptHoldoffCount == 0);
	PG_TRY();
	{
		fn();
	}
	PG_CATCH();
	{
		GpuIvfpqTakeError(cxt, &code, message, sizeof(message));
		failed = true;
	}
	PG_END_TRY();
	if (failed)
		throw GpuIvfpqPgError(code, message);
}

/* An owned engine object and the callback that deletes it. */
template <typename T>
struct GpuIvfpqOwned
{
	MemoryContextCallback callback;
	T		   *object;
};

template <typename T>
static void
GpuIvfpqDeleteOwned(void *arg)
{
	GpuIvfpqOwned<T> *owned = (GpuIvfpqOwned<T> *) arg;
	T		   *object = owned->object;

	owned->object = nullptr;
	delete object;				/* engine destructors do not throw */
}

/*
 * new T(args...) owned by cxt: deleted when cxt is reset or deleted. The
 * object must not outlive cxt; to free it early, free cxt.
 */
template <typename T, typename... Args>
static inline T *
GpuIvfpqMakeOwned(MemoryContext cxt, const char *what, Args &&...args)
{
	GpuIvfpqOwned<T> *owned = (GpuIvfpqOwned<T> *) MemoryContextAllocZero(cxt, sizeof(GpuIvfpqOwned<T>));

	GpuIvfpqGuard(what, [&] { owned->object = new T(std::forward<Args>(args)...); });
	owned->callback.func = GpuIvfpqDeleteOwned<T>;
	owned->callback.arg = owned;
	MemoryContextRegisterResetCallback(cxt, &owned->callback);
	return owned->object;
}
