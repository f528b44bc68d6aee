// Engine errors: the engine reports failures by throwing, never by aborting.
#pragma once

#include <stdexcept>
#include <string>

namespace gpuivfpq {

// Kind lets the PostgreSQL guard pick an errcode without parsing text.
enum class ErrorKind { InvalidArgument, OutOfMemory, Internal, Unsupported };

class Error : public std::runtime_error {
public:
    Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
    ErrorKind kind() const { return kind_; }

private:
    ErrorKind kind_;
};

// Throws Error(InvalidArgument) with msg when cond is false.
inline void require(bool cond, const std::string& msg)
{
    if (!cond)
        throw Error(ErrorKind::InvalidArgument, msg);
}

// The same for a literal: no std::string is built unless cond is false (the
// checks of per-page and per-row routines, such as adc_scan, run millions
// of times a second; a message longer than the small-string buffer would
// cost an allocation each time).
inline void require(bool cond, const char* msg)
{
    if (!cond)
        throw Error(ErrorKind::InvalidArgument, msg);
}

}  // namespace gpuivfpq
