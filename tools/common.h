// What the gpu_ivfpq tools share: errors, option values, buffered output,
// .fvecs files, and real[] values as PostgreSQL array text.
#pragma once

#include <getopt.h>

#include <cerrno>
#include <cmath>
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace tools {

// ---------------------------------------------------------------- errors

[[noreturn]] inline void die(const std::string& msg)
{
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    std::exit(1);
}

// ---------------------------------------------------------------- options
// The tools parse their options with getopt_long; these check the values.

// The integer value of the option being parsed (getopt_long's optarg).
inline long long opt_int(const char* name)
{
    char* end = nullptr;
    errno = 0;
    long long v = std::strtoll(optarg, &end, 10);
    if (errno || end == optarg || *end)
        die(std::string("--") + name + " needs an integer, got '" + optarg + "'");
    return v;
}

inline double opt_real(const char* name)
{
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(optarg, &end);
    if (errno || end == optarg || *end)
        die(std::string("--") + name + " needs a number, got '" + optarg + "'");
    return v;
}

// ---------------------------------------------------------------- output

// Buffered writer to a file, or stdout for "-", that dies on a write error
// (a closed pipe, a full disk) instead of producing a short file.
class Output {
public:
    explicit Output(const std::string& path) : path_(path.empty() ? "-" : path)
    {
        if (path_ == "-") {
            f_ = stdout;
        } else {
            f_ = std::fopen(path_.c_str(), "wb");
            if (!f_)
                die("cannot open " + path_ + " for writing: " + std::strerror(errno));
            owned_ = true;
        }
        buf_.reserve(kFlushBytes);
    }
    Output(const Output&) = delete;
    Output& operator=(const Output&) = delete;
    ~Output() { close(); }

    void write(const char* data, size_t n)
    {
        buf_.append(data, n);
        if (buf_.size() >= kFlushBytes)
            flush();
    }
    void write(std::string_view s) { write(s.data(), s.size()); }
    void close()
    {
        if (!f_)
            return;
        flush();
        if (std::fflush(f_) != 0)
            die("write to " + path_ + " failed: " + std::strerror(errno));
        if (owned_ && std::fclose(f_) != 0)
            die("closing " + path_ + " failed: " + std::strerror(errno));
        f_ = nullptr;
    }

private:
    static constexpr size_t kFlushBytes = 1 << 22;
    void flush()
    {
        if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size())
            die("write to " + path_ + " failed: " + std::strerror(errno));
        buf_.clear();
    }
    std::string path_;
    FILE* f_ = nullptr;
    bool owned_ = false;
    std::string buf_;
};

// ---------------------------------------------------------------- .fvecs
// Per vector: an int32 dimension, then d float32 (both little endian, as
// this machine stores them), the format of the SIFT1M/ANN benchmark files.

inline void write_fvecs_row(Output& out, const float* v, size_t d)
{
    int32_t dd = static_cast<int32_t>(d);
    out.write(reinterpret_cast<const char*>(&dd), 4);
    out.write(reinterpret_cast<const char*>(v), d * 4);
}

// Appends up to max_n vectors (0 = all) to out; returns their dimension.
inline size_t read_fvecs(const std::string& path, std::vector<float>& out, size_t max_n = 0)
{
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f)
        die("cannot open " + path + ": " + std::strerror(errno));
    size_t d = 0, n = 0;
    int32_t dd;
    while ((max_n == 0 || n < max_n) && std::fread(&dd, 4, 1, f) == 1) {
        if (dd <= 0 || (d && static_cast<size_t>(dd) != d))
            die(path + ": bad vector dimension " + std::to_string(dd) + " at vector " +
                std::to_string(n));
        d = static_cast<size_t>(dd);
        size_t base = out.size();
        out.resize(base + d);
        if (std::fread(&out[base], 4, d, f) != d)
            die(path + ": truncated at vector " + std::to_string(n));
        n++;
    }
    std::fclose(f);
    if (n == 0)
        die(path + ": no vectors");
    return d;
}

// ---------------------------------------------------------------- real[] text

// Appends v as a PostgreSQL array literal, {x1,x2,...}. The shortest form
// that reads back as the same float (std::to_chars), so a round trip through
// real[] is exact. Whole numbers (Fashion-MNIST's pixels) take the integer
// conversion, several times faster and, below 2^24, the same digits.
inline void append_array_text(std::string& s, const float* v, size_t d)
{
    char buf[32];
    s += '{';
    for (size_t j = 0; j < d; j++) {
        if (j)
            s += ',';
        const float x = v[j];
        // The range test first: converting NaN or a huge value to int is undefined.
        const bool small = std::fabs(x) < 16777216.0f;
        const int32_t i = small ? static_cast<int32_t>(x) : 0;
        std::to_chars_result r;
        if (small && static_cast<float>(i) == x && !(i == 0 && std::signbit(x)))
            r = std::to_chars(buf, buf + sizeof buf, i);
        else
            r = std::to_chars(buf, buf + sizeof buf, x);
        s.append(buf, r.ptr);
    }
    s += '}';
}

inline std::string array_text(const float* v, size_t d)
{
    std::string s;
    s.reserve(d * 8 + 2);
    append_array_text(s, v, d);
    return s;
}

// A table name, schema-qualified or not, quoted part by part with the
// connection's quote_name (a template: this header needs no libpqxx).
template <typename Connection>
std::string quote_table(Connection& conn, const std::string& name)
{
    std::string out;
    size_t start = 0;
    for (;;) {
        size_t dot = name.find('.', start);
        out += conn.quote_name(name.substr(start, dot == std::string::npos ? dot : dot - start));
        if (dot == std::string::npos)
            return out;
        out += '.';
        start = dot + 1;
    }
}

}  // namespace tools
