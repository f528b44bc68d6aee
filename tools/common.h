// Shared helpers of the gpu_ivfpq tools: PostgreSQL binary COPY writing and
// reading, .fvecs files, command-line parsing, and a seeded RNG.
#pragma once

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace tools {

// ---------------------------------------------------------------- errors

[[noreturn]] inline void die(const std::string& msg)
{
    std::fprintf(stderr, "error: %s\n", msg.c_str());
    std::exit(1);
}

// ---------------------------------------------------------------- byte order

inline uint16_t be16(uint16_t v) { return __builtin_bswap16(v); }
inline uint32_t be32(uint32_t v) { return __builtin_bswap32(v); }
inline uint64_t be64(uint64_t v) { return __builtin_bswap64(v); }

inline void put16(char*& p, uint16_t v) { v = be16(v); std::memcpy(p, &v, 2); p += 2; }
inline void put32(char*& p, uint32_t v) { v = be32(v); std::memcpy(p, &v, 4); p += 4; }
inline void put64(char*& p, uint64_t v) { v = be64(v); std::memcpy(p, &v, 8); p += 8; }

inline uint16_t get16(const char* p) { uint16_t v; std::memcpy(&v, p, 2); return be16(v); }
inline uint32_t get32(const char* p) { uint32_t v; std::memcpy(&v, p, 4); return be32(v); }
inline uint64_t get64(const char* p) { uint64_t v; std::memcpy(&v, p, 8); return be64(v); }

constexpr uint32_t kFloat4Oid = 700;  // element type of real[]
constexpr uint32_t kInt4Oid = 23;
constexpr uint32_t kInt8Oid = 20;

// ---------------------------------------------------------------- output

// Buffered writer to a FILE* (stdout or a file), with hard failure on error
// (a closed pipe, a full disk).
class Output {
public:
    explicit Output(const std::string& path)
    {
        if (path.empty() || path == "-") {
            f_ = stdout;
        } else {
            f_ = std::fopen(path.c_str(), "wb");
            if (!f_)
                die("cannot open " + path + " for writing: " + std::strerror(errno));
            owned_ = true;
        }
        path_ = path.empty() ? "-" : path;
        buf_.reserve(1 << 22);
    }
    ~Output() { close(); }

    void write(const char* data, size_t n)
    {
        buf_.insert(buf_.end(), data, data + n);
        if (buf_.size() >= (1u << 22))
            flush();
    }
    void flush()
    {
        if (!buf_.empty() && std::fwrite(buf_.data(), 1, buf_.size(), f_) != buf_.size())
            die("write to " + path_ + " failed: " + std::strerror(errno));
        buf_.clear();
    }
    void close()
    {
        if (!f_)
            return;
        flush();
        if (std::fflush(f_) != 0)
            die("write to " + path_ + " failed: " + std::strerror(errno));
        if (owned_)
            std::fclose(f_);
        f_ = nullptr;
    }

private:
    FILE* f_ = nullptr;
    bool owned_ = false;
    std::string path_;
    std::vector<char> buf_;
};

// ---------------------------------------------------------------- binary COPY

// Column kinds the tools emit.
enum class Col { Int8, Int4, Float4Array };

// Encodes rows in PostgreSQL's binary COPY format ("COPY t FROM STDIN WITH
// (FORMAT binary)"). A float4 array is a one-dimensional real[] with lower
// bound 1 and no NULLs.
class CopyEncoder {
public:
    static std::string header()
    {
        std::string h("PGCOPY\n\377\r\n\0", 11);
        h.append(8, '\0');  // flags (int32 0) + header extension length (int32 0)
        return h;
    }
    static std::string trailer() { return std::string("\377\377", 2); }

    // Size in bytes of one row of ncols with one float4 array of dim d
    // (other columns of fixed size).
    static size_t row_bytes(const std::vector<Col>& cols, size_t d)
    {
        size_t n = 2;
        for (Col c : cols) {
            switch (c) {
            case Col::Int8: n += 4 + 8; break;
            case Col::Int4: n += 4 + 4; break;
            case Col::Float4Array: n += 4 + 20 + d * 8; break;
            }
        }
        return n;
    }

    // Writes one array field (length word included) at p.
    static void put_float_array(char*& p, const float* v, size_t d)
    {
        put32(p, static_cast<uint32_t>(20 + d * 8));  // field length
        put32(p, 1);           // ndim
        put32(p, 0);           // has nulls
        put32(p, kFloat4Oid);  // element type
        put32(p, static_cast<uint32_t>(d));  // dimension
        put32(p, 1);           // lower bound
        for (size_t j = 0; j < d; j++) {
            uint32_t bits;
            std::memcpy(&bits, &v[j], 4);
            put32(p, 4);
            put32(p, bits);
        }
    }
    static void put_int8(char*& p, int64_t v)
    {
        put32(p, 8);
        put64(p, static_cast<uint64_t>(v));
    }
    static void put_int4(char*& p, int32_t v)
    {
        put32(p, 4);
        put32(p, static_cast<uint32_t>(v));
    }
};

// Parses a binary COPY stream of rows (int8 id, float4[] embedding), as sent
// by "COPY (SELECT id, embedding FROM t) TO STDOUT (FORMAT binary)". Feed it
// the chunks PQgetCopyData returns (each is whole rows, or the header).
class CopyRowParser {
public:
    // Each accepted row appends one id and d floats; d is fixed by the first
    // row, and every later row must have the same length.
    std::vector<int64_t> ids;
    std::vector<float> vecs;
    size_t d = 0;

    // Rows expected (a hint: reserves memory once d is known).
    size_t expect_rows = 0;

    void feed(const char* p, size_t n)
    {
        if (pending_.empty()) {
            // Usual case: a chunk holds whole rows; parse it in place.
            size_t used = parse(p, n);
            pending_.assign(p + used, p + n);
            return;
        }
        pending_.insert(pending_.end(), p, p + n);
        size_t used = parse(pending_.data(), pending_.size());
        pending_.erase(pending_.begin(), pending_.begin() + static_cast<long>(used));
    }

private:
    // Parses what it can of b[0, avail); returns the bytes consumed.
    size_t parse(const char* b, size_t avail)
    {
        size_t pos = 0;
        if (!header_done_) {
            if (avail < 19)
                return 0;
            if (std::memcmp(b, "PGCOPY\n\377\r\n\0", 11) != 0)
                throw std::runtime_error("not a binary COPY stream");
            uint32_t ext = get32(b + 15);
            if (avail < 19 + ext)
                return 0;
            pos = 19 + ext;
            header_done_ = true;
        }
        for (;;) {
            size_t start = pos;
            if (avail - pos < 2)
                break;
            int16_t nf = static_cast<int16_t>(get16(b + pos));
            pos += 2;
            if (nf == -1)  // trailer
                return avail;
            if (nf != 2)
                throw std::runtime_error("expected 2 columns (id, embedding), got " +
                                         std::to_string(nf));
            if (!parse_row(b, avail, pos)) {
                pos = start;
                break;
            }
        }
        return pos;
    }

    bool parse_row(const char* b, size_t avail, size_t& pos)
    {
        if (avail - pos < 4)
            return false;
        int32_t len = static_cast<int32_t>(get32(b + pos));
        if (len == -1)
            throw std::runtime_error("NULL id in table");
        if (len != 8 && len != 4)
            throw std::runtime_error("id column must be bigint or integer");
        if (avail - pos < 4 + static_cast<size_t>(len) + 4)
            return false;
        int64_t id = len == 8 ? static_cast<int64_t>(get64(b + pos + 4))
                              : static_cast<int32_t>(get32(b + pos + 4));
        size_t q = pos + 4 + len;
        int32_t alen = static_cast<int32_t>(get32(b + q));
        if (alen == -1)
            throw std::runtime_error("NULL embedding for id " + std::to_string(id));
        if (avail - q - 4 < static_cast<size_t>(alen))
            return false;
        const char* a = b + q + 4;
        int32_t ndim = static_cast<int32_t>(get32(a));
        uint32_t elem = get32(a + 8);
        if (elem != kFloat4Oid)
            throw std::runtime_error("embedding must be real[] (float4)");
        size_t dim = 0;
        const char* e = a + 12;
        if (ndim == 1) {
            dim = get32(a + 12);
            e = a + 20;
        } else if (ndim != 0) {
            throw std::runtime_error("embedding must be a one-dimensional array");
        }
        if (ids.empty()) {
            d = dim;
            if (expect_rows) {
                ids.reserve(expect_rows);
                vecs.reserve(expect_rows * d);
            }
        } else if (dim != d) {
            throw std::runtime_error("embedding of id " + std::to_string(id) + " has " +
                                     std::to_string(dim) + " elements, expected " +
                                     std::to_string(d));
        }
        if (static_cast<size_t>(alen) != (e - a) + dim * 8)
            throw std::runtime_error("NULL element in embedding of id " + std::to_string(id));
        ids.push_back(id);
        size_t base = vecs.size();
        vecs.resize(base + dim);
        float* out = &vecs[base];
        for (size_t j = 0; j < dim; j++) {
            if (get32(e) != 4)
                throw std::runtime_error("NULL element in embedding of id " + std::to_string(id));
            uint32_t bits = get32(e + 4);
            std::memcpy(&out[j], &bits, 4);
            e += 8;
        }
        pos = q + 4 + alen;
        return true;
    }

    std::vector<char> pending_;
    bool header_done_ = false;
};

// ---------------------------------------------------------------- .fvecs

// .fvecs: per vector an int32 dimension (little endian) then d float32.
inline void write_fvecs_row(Output& out, const float* v, size_t d)
{
    int32_t dd = static_cast<int32_t>(d);
    out.write(reinterpret_cast<const char*>(&dd), 4);
    out.write(reinterpret_cast<const char*>(v), d * 4);
}

// Reads up to max_n vectors (0 = all); returns d.
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

// ---------------------------------------------------------------- arguments

// "--name value" / "--name=value" options and bare flags.
class Args {
public:
    Args(int argc, char** argv, const std::vector<std::string>& flags = {})
    {
        for (int i = 1; i < argc; i++) {
            std::string a = argv[i];
            if (a.rfind("--", 0) != 0)
                die("unexpected argument '" + a + "' (see --help)");
            a = a.substr(2);
            auto eq = a.find('=');
            if (eq != std::string::npos) {
                opts_[a.substr(0, eq)].push_back(a.substr(eq + 1));
            } else if (is_flag(a, flags)) {
                opts_[a].push_back("1");
            } else {
                if (i + 1 >= argc)
                    die("option --" + a + " needs a value");
                opts_[a].push_back(argv[++i]);
            }
        }
    }
    bool has(const std::string& k) const { return opts_.count(k) != 0; }
    std::string str(const std::string& k, const std::string& def = "") const
    {
        auto it = opts_.find(k);
        return it == opts_.end() ? def : it->second.back();
    }
    std::vector<std::string> all(const std::string& k) const
    {
        auto it = opts_.find(k);
        return it == opts_.end() ? std::vector<std::string>{} : it->second;
    }
    long long num(const std::string& k, long long def) const
    {
        if (!has(k))
            return def;
        std::string s = str(k);
        char* end = nullptr;
        errno = 0;
        long long v = std::strtoll(s.c_str(), &end, 10);
        if (errno || end == s.c_str() || *end)
            die("--" + k + " needs an integer, got '" + s + "'");
        return v;
    }
    double real(const std::string& k, double def) const
    {
        if (!has(k))
            return def;
        std::string s = str(k);
        char* end = nullptr;
        double v = std::strtod(s.c_str(), &end);
        if (end == s.c_str() || *end)
            die("--" + k + " needs a number, got '" + s + "'");
        return v;
    }
    // Dies on options not in the known list.
    void check(const std::vector<std::string>& known) const
    {
        for (auto& kv : opts_) {
            bool ok = false;
            for (auto& k : known)
                ok = ok || k == kv.first;
            if (!ok)
                die("unknown option --" + kv.first + " (see --help)");
        }
    }

private:
    static bool is_flag(const std::string& a, const std::vector<std::string>& flags)
    {
        for (auto& f : flags)
            if (f == a)
                return true;
        return false;
    }
    std::map<std::string, std::vector<std::string>> opts_;
};

// ---------------------------------------------------------------- RNG

inline uint64_t splitmix64(uint64_t& x)
{
    uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// xoshiro256** seeded from (seed, stream, substream) via splitmix64: each
// (stream, substream) pair is an independent, reproducible sequence.
class Rng {
public:
    Rng(uint64_t seed, uint64_t stream = 0, uint64_t sub = 0)
    {
        uint64_t x = seed ^ (stream * 0xd1b54a32d192ed03ULL) ^ (sub * 0x8cb92ba72f3d8dd7ULL);
        for (int i = 0; i < 4; i++)
            s_[i] = splitmix64(x);
    }
    uint64_t next()
    {
        uint64_t r = rotl(s_[1] * 5, 7) * 9;
        uint64_t t = s_[1] << 17;
        s_[2] ^= s_[0];
        s_[3] ^= s_[1];
        s_[1] ^= s_[2];
        s_[0] ^= s_[3];
        s_[2] ^= t;
        s_[3] = rotl(s_[3], 45);
        return r;
    }
    // Uniform in [0, 1).
    double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
    // Standard normal (Box-Muller, both values used).
    double normal()
    {
        if (have_spare_) {
            have_spare_ = false;
            return spare_;
        }
        double u1 = uniform(), u2 = uniform();
        if (u1 < 1e-300)
            u1 = 1e-300;
        double r = std::sqrt(-2.0 * std::log(u1));
        spare_ = r * std::sin(2.0 * M_PI * u2);
        have_spare_ = true;
        return r * std::cos(2.0 * M_PI * u2);
    }
    // Fills n standard normals as floats (faster path).
    void normals(float* out, size_t n)
    {
        size_t i = 0;
        if (have_spare_ && n > 0) {
            out[i++] = static_cast<float>(spare_);
            have_spare_ = false;
        }
        for (; i + 1 < n; i += 2) {
            float u1 = static_cast<float>((next() >> 40) + 1) * 0x1.0p-24f;  // (0, 1]
            float u2 = static_cast<float>(next() >> 40) * 0x1.0p-24f;
            float r = std::sqrt(-2.0f * std::log(u1));
            float a = 6.2831853f * u2;
            out[i] = r * std::cos(a);
            out[i + 1] = r * std::sin(a);
        }
        if (i < n)
            out[i] = static_cast<float>(normal());
    }

private:
    static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
    uint64_t s_[4];
    bool have_spare_ = false;
    double spare_ = 0.0;
};

}  // namespace tools
