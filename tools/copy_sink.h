// Where the loaders (gen_synthetic, fmnist_load) send their rows: straight
// into a PostgreSQL table over COPY, or into a file of COPY text rows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tools {

// Rows of (id bigint[, label integer], embedding real[]), the embedding
// already as array text (append_array_text).
class CopySink {
public:
    // COPY into table's columns, in order, over conninfo (a libpq connection
    // string; empty: the PGHOST, PGPORT, ... environment). One transaction:
    // the rows appear at finish(), or not at all. Only in tools built with
    // libpqxx; elsewhere it dies with a message saying so.
    static std::unique_ptr<CopySink> table(const std::string& conninfo, const std::string& table,
                                           const std::vector<std::string>& columns);
    // COPY text rows (tab-separated fields, one row a line) written to path,
    // stdout for "-": what COPY t FROM STDIN or COPY t FROM 'file' reads.
    static std::unique_ptr<CopySink> file(const std::string& path);

    virtual ~CopySink() = default;
    virtual void row(int64_t id, const std::string& embedding) = 0;
    virtual void row(int64_t id, int32_t label, const std::string& embedding) = 0;
    // Ends the COPY and commits (table), or flushes and closes (file).
    virtual void finish() = 0;
    // True when table() can work: the tools were built with libpqxx.
    static bool have_database();
};

}  // namespace tools
