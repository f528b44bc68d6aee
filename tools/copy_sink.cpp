// CopySink: COPY text rows to a file, or to a table through libpqxx's
// stream_to (libpqxx sends the same text rows over the COPY protocol).
#include "copy_sink.h"

#include "common.h"

#ifdef GPU_IVFPQ_TOOLS_PQXX
#include <pqxx/pqxx>
#endif

namespace tools {
namespace {

// COPY text: tab-separated fields, one row a line. Ids, labels and array
// literals of numbers hold no tab, newline or backslash, so need no escaping.
class FileSink final : public CopySink {
public:
    explicit FileSink(const std::string& path) : out_(path) {}

    void row(int64_t id, const std::string& embedding) override
    {
        line_ = std::to_string(id);
        end_line(embedding);
    }
    void row(int64_t id, int32_t label, const std::string& embedding) override
    {
        line_ = std::to_string(id);
        line_ += '\t';
        line_ += std::to_string(label);
        end_line(embedding);
    }
    void finish() override { out_.close(); }

private:
    void end_line(const std::string& embedding)
    {
        line_ += '\t';
        line_ += embedding;
        line_ += '\n';
        out_.write(line_);
    }
    Output out_;
    std::string line_;
};

#ifdef GPU_IVFPQ_TOOLS_PQXX

std::vector<std::string> quote_columns(pqxx::connection& conn, const std::vector<std::string>& cols)
{
    std::vector<std::string> out;
    for (const std::string& c : cols)
        out.push_back(conn.quote_name(c));
    return out;
}

class TableSink final : public CopySink {
public:
    TableSink(const std::string& conninfo, const std::string& table,
              const std::vector<std::string>& columns)
        : conn_(conninfo),
          tx_(conn_),
          // libpqxx 6 puts the table and column names into the COPY
          // statement as given: they are quoted here.
          stream_(tx_, quote_table(conn_, table), quote_columns(conn_, columns))
    {
    }

    void row(int64_t id, const std::string& embedding) override
    {
        stream_ << std::tie(id, embedding);
    }
    void row(int64_t id, int32_t label, const std::string& embedding) override
    {
        stream_ << std::tie(id, label, embedding);
    }
    void finish() override
    {
        stream_.complete();
        tx_.commit();
    }

private:
    pqxx::connection conn_;
    pqxx::work tx_;
    pqxx::stream_to stream_;
};
#endif

}  // namespace

bool CopySink::have_database()
{
#ifdef GPU_IVFPQ_TOOLS_PQXX
    return true;
#else
    return false;
#endif
}

std::unique_ptr<CopySink> CopySink::table(const std::string& conninfo, const std::string& table,
                                          const std::vector<std::string>& columns)
{
#ifdef GPU_IVFPQ_TOOLS_PQXX
    return std::make_unique<TableSink>(conninfo, table, columns);
#else
    (void)conninfo;
    (void)columns;
    die("cannot load table " + table + ": these tools were built without libpqxx "
        "(write COPY text with --out and load it with psql instead)");
#endif
}

std::unique_ptr<CopySink> CopySink::file(const std::string& path)
{
    return std::make_unique<FileSink>(path);
}

}  // namespace tools
