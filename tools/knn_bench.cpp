// knn_bench: recall and latency of k-NN queries through SQL, from one client.
//
// For each setting (a list of GUC assignments), it SETs the GUCs, prepares
//   SELECT <id> FROM <table> ORDER BY <column> <op> $1::real[] LIMIT <k>
// runs every query vector through it, and reports recall@k against exact
// ground truth, queries per second and the p50/p99 latency. Ground truth
// comes from the engine's brute_force_knn on the table's vectors, read back
// over COPY, or from a cache file. Talks to PostgreSQL through libpqxx.
#include <pqxx/pqxx>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <exception>
#include <numeric>
#include <thread>
#include <unordered_set>

#include "common.h"
#include "engine/topk.h"

using namespace tools;
using Clock = std::chrono::steady_clock;

namespace {

const char* kUsage = R"USAGE(usage: knn_bench --table T (--queries FILE.fvecs | --query-table QT) [options]

  --conninfo STR        libpq connection string (default: the PGHOST, PGPORT, ... environment)
  --table T             table searched (columns --id-column, --column)
  --column C            vector column, real[] (default embedding)
  --id-column C         id column, bigint or integer (default id)
  --queries FILE        query vectors, .fvecs
  --query-table QT      or: query vectors from this table (same column names), ordered by id
  --nq N                use the first N queries (default all)
  --k K                 neighbours per query (default 10)
  --op OP               <-> (L2, default), <#> (inner product) or <=> (cosine)
  --settings LIST       settings to compare, separated by ';' or spaces; each is a comma
                        list of GUC=value (a name that is neither a core setting nor
                        dotted means gpu_ivfpq.<name>), or 'default' for none. Example: "probes=8,rerank=100;probes=32,rerank=200"
                        (may be repeated; default: one run with 'default')
  --sql STMT            run STMT once after connecting (may be repeated), e.g. "SET jit = off"
  --warmup N            untimed queries before each setting (default 20)
  --gt-cache FILE       load ground truth from FILE when it matches (queries, k, metric,
                        table name and row count), else compute it and save it there
  --threads T           threads for the ground truth (default 2)
  --min-recall X        exit 2 when any setting's recall@k is below X
  --latencies FILE      write every query's latency: lines "setting<TAB>query<TAB>ms"
  --help

The table printed has one row per setting: setting | recall@k | QPS | p50 ms |
p99 ms | plan (the scan node of EXPLAIN for the first query). Recall counts a
returned id as correct when its exact distance ties the k-th true distance.
)USAGE";

// The command line, checked.
struct Options {
    std::string conninfo, table, column = "embedding", id_column = "id", queries, query_table;
    std::string gt_cache, latencies;
    std::vector<std::string> settings, sql;
    long long nq = 0, k = 10, warmup = 20, threads = 2;
    double min_recall = -1.0;
    std::string op = "<->";
};

// Parses and checks the options (getopt_long); dies with a message on a bad one.
Options parse_options(int argc, char** argv)
{
    enum { kConninfo = 256, kTable, kColumn, kIdColumn, kQueries, kQueryTable, kNq, kK, kOp,
           kSettings, kSql, kWarmup, kGtCache, kThreads, kMinRecall, kLatencies, kHelp };
    static const option longopts[] = {
        {"conninfo", required_argument, nullptr, kConninfo},
        {"table", required_argument, nullptr, kTable},
        {"column", required_argument, nullptr, kColumn},
        {"id-column", required_argument, nullptr, kIdColumn},
        {"queries", required_argument, nullptr, kQueries},
        {"query-table", required_argument, nullptr, kQueryTable},
        {"nq", required_argument, nullptr, kNq},
        {"k", required_argument, nullptr, kK},
        {"op", required_argument, nullptr, kOp},
        {"settings", required_argument, nullptr, kSettings},
        {"sql", required_argument, nullptr, kSql},
        {"warmup", required_argument, nullptr, kWarmup},
        {"gt-cache", required_argument, nullptr, kGtCache},
        {"threads", required_argument, nullptr, kThreads},
        {"min-recall", required_argument, nullptr, kMinRecall},
        {"latencies", required_argument, nullptr, kLatencies},
        {"help", no_argument, nullptr, kHelp},
        {nullptr, 0, nullptr, 0}};
    Options o;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, nullptr)) != -1) {
        switch (c) {
        case kConninfo: o.conninfo = optarg; break;
        case kTable: o.table = optarg; break;
        case kColumn: o.column = optarg; break;
        case kIdColumn: o.id_column = optarg; break;
        case kQueries: o.queries = optarg; break;
        case kQueryTable: o.query_table = optarg; break;
        case kNq: o.nq = opt_int("nq"); break;
        case kK: o.k = opt_int("k"); break;
        case kOp: o.op = optarg; break;
        case kSettings: o.settings.push_back(optarg); break;
        case kSql: o.sql.push_back(optarg); break;
        case kWarmup: o.warmup = opt_int("warmup"); break;
        case kGtCache: o.gt_cache = optarg; break;
        case kThreads: o.threads = opt_int("threads"); break;
        case kMinRecall: o.min_recall = opt_real("min-recall"); break;
        case kLatencies: o.latencies = optarg; break;
        case kHelp: std::fputs(kUsage, stdout); std::exit(0);
        default: die("see --help");  // getopt_long has named the bad option
        }
    }
    if (optind < argc)
        die(std::string("unexpected argument '") + argv[optind] + "' (see --help)");
    if (o.table.empty())
        die("--table is required (see --help)");
    if (o.queries.empty() == o.query_table.empty())
        die("give exactly one of --queries FILE or --query-table TABLE");
    if (o.k < 1 || o.nq < 0 || o.warmup < 0 || o.threads < 1)
        die("--k and --threads must be >= 1, --nq and --warmup >= 0");
    return o;
}

// ---------------------------------------------------------------- vectors

// (id, vector) rows of a table; every vector has d elements.
struct Vectors {
    std::vector<int64_t> ids;
    std::vector<float> vecs;
    size_t d = 0;
};

// Parses a one-dimensional real[] in text form, {x1,x2,...}, into out.
void parse_array_text(std::string_view s, int64_t id, std::vector<float>& out)
{
    out.clear();
    if (s.size() < 2 || s.front() != '{' || s.back() != '}')
        throw std::runtime_error("embedding of id " + std::to_string(id) +
                                 " is not a one-dimensional array: " + std::string(s.substr(0, 40)));
    const char* p = s.data() + 1;
    const char* end = s.data() + s.size() - 1;
    while (p < end) {
        float v;
        auto r = std::from_chars(p, end, v);
        if (r.ec != std::errc() || (r.ptr != end && *r.ptr != ','))
            throw std::runtime_error("embedding of id " + std::to_string(id) +
                                     " has an element that is not a number (NULL?)");
        out.push_back(v);
        p = r.ptr + 1;
    }
}

// Reads every (id, vector) row of a table through COPY ... TO STDOUT.
// Lines are taken raw: libpqxx 6.4's stream_from >> leaves a flag
// uninitialised when the columns are named, and fails at random. A line is
// "id<TAB>{x1,...}\n"; numbers need no COPY unescaping, and NULL is \N.
Vectors read_vectors(pqxx::transaction_base& tx, const std::string& table,
                     const std::string& id_column, const std::string& column, size_t expect_rows)
{
    Vectors out;
    pqxx::stream_from stream(tx, table, std::vector<std::string>{id_column, column});
    std::string line;
    std::vector<float> v;
    while (stream.get_raw_line(line)) {
        if (!line.empty() && line.back() == '\n')
            line.pop_back();
        const size_t tab = line.find('\t');
        int64_t id = 0;
        auto r = std::from_chars(line.data(), line.data() + (tab == std::string::npos ? 0 : tab), id);
        if (tab == std::string::npos || r.ec != std::errc() || r.ptr != line.data() + tab)
            throw std::runtime_error("unexpected row in " + table + " (NULL id?): " +
                                     line.substr(0, 40));
        if (line.compare(tab + 1, std::string::npos, "\\N") == 0)
            throw std::runtime_error("NULL embedding for id " + std::to_string(id));
        parse_array_text(std::string_view(line).substr(tab + 1), id, v);
        if (out.ids.empty()) {
            out.d = v.size();
            out.ids.reserve(expect_rows);
            out.vecs.reserve(expect_rows * out.d);
        } else if (v.size() != out.d) {
            throw std::runtime_error("embedding of id " + std::to_string(id) + " has " +
                                     std::to_string(v.size()) + " elements, expected " +
                                     std::to_string(out.d));
        }
        out.ids.push_back(id);
        out.vecs.insert(out.vecs.end(), v.begin(), v.end());
    }
    stream.complete();
    return out;
}


// ---------------------------------------------------------------- settings

// One --settings entry: its text, and the GUC assignments it stands for.
struct Setting {
    std::string label;
    std::vector<std::pair<std::string, std::string>> gucs;
};

// Splits --settings values into settings (";" or spaces) and assignments (",").
std::vector<Setting> parse_settings(const std::vector<std::string>& args)
{
    std::vector<Setting> out;
    for (const std::string& arg : args) {
        std::string cur;
        auto flush = [&]() {
            if (cur.empty())
                return;
            Setting s;
            s.label = cur;
            if (cur != "default") {
                size_t start = 0;
                while (start <= cur.size()) {
                    size_t comma = cur.find(',', start);
                    std::string kv = cur.substr(start, comma == std::string::npos ? std::string::npos
                                                                                 : comma - start);
                    if (!kv.empty()) {
                        size_t eq = kv.find('=');
                        if (eq == std::string::npos || eq == 0)
                            die("setting '" + kv + "' is not name=value");
                        std::string name = kv.substr(0, eq);
                        for (char ch : name)
                            if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.'))
                                die("bad GUC name '" + name + "'");
                        s.gucs.emplace_back(name, kv.substr(eq + 1));
                    }
                    if (comma == std::string::npos)
                        break;
                    start = comma + 1;
                }
            }
            out.push_back(s);
            cur.clear();
        };
        for (char ch : arg) {
            if (ch == ';' || std::isspace(static_cast<unsigned char>(ch)))
                flush();
            else
                cur += ch;
        }
        flush();
    }
    if (out.empty())
        out.push_back(Setting{"default", {}});
    return out;
}

// ---------------------------------------------------------------- ground truth

// The exact kgt nearest ids and distances of every query.
struct GroundTruth {
    size_t nq = 0, kgt = 0;
    std::vector<float> dist;  // nq x kgt, ascending
    std::vector<int64_t> ids; // nq x kgt (-1 = none)
};

// FNV-1a hash, for the ground-truth cache key.
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ULL)
{
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

// What the cached ground truth depends on; a cache file must match it whole.
struct CacheKey {
    uint64_t nq, kgt, d, rows, metric, qhash, thash;
};

// Loads the ground truth from path when its key matches; false otherwise.
bool load_cache(const std::string& path, const CacheKey& key, GroundTruth& gt)
{
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f)
        return false;
    char magic[8];
    CacheKey k{};
    bool ok = std::fread(magic, 8, 1, f) == 1 && std::memcmp(magic, "KNNGT01", 8) == 0 &&
              std::fread(&k, sizeof k, 1, f) == 1 && std::memcmp(&k, &key, sizeof k) == 0;
    if (ok) {
        gt.nq = key.nq;
        gt.kgt = key.kgt;
        gt.dist.resize(gt.nq * gt.kgt);
        gt.ids.resize(gt.nq * gt.kgt);
        ok = std::fread(gt.dist.data(), 4, gt.dist.size(), f) == gt.dist.size() &&
             std::fread(gt.ids.data(), 8, gt.ids.size(), f) == gt.ids.size();
    }
    std::fclose(f);
    return ok;
}

// Saves the ground truth (through a temporary file, renamed); warns on failure.
void save_cache(const std::string& path, const CacheKey& key, const GroundTruth& gt)
{
    std::string tmp = path + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) {
        std::fprintf(stderr, "warning: cannot write ground-truth cache %s: %s\n", tmp.c_str(),
                     std::strerror(errno));
        return;
    }
    bool ok = std::fwrite("KNNGT01", 8, 1, f) == 1 && std::fwrite(&key, sizeof key, 1, f) == 1 &&
              std::fwrite(gt.dist.data(), 4, gt.dist.size(), f) == gt.dist.size() &&
              std::fwrite(gt.ids.data(), 8, gt.ids.size(), f) == gt.ids.size();
    ok = (std::fclose(f) == 0) && ok;
    if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
        std::remove(tmp.c_str());
        std::fprintf(stderr, "warning: cannot write ground-truth cache %s\n", path.c_str());
    }
}

// Exact k-NN of the queries over the table vectors, split over threads.
void compute_gt(const std::vector<float>& queries, size_t nq, const Vectors& base,
                gpuivfpq::Metric metric, size_t kgt, int threads, GroundTruth& gt)
{
    const size_t d = base.d, n = base.ids.size();
    gt.nq = nq;
    gt.kgt = kgt;
    gt.dist.assign(nq * kgt, 0.0f);
    gt.ids.assign(nq * kgt, -1);
    std::vector<int64_t> labels(nq * kgt, -1);
    size_t per = (nq + static_cast<size_t>(threads) - 1) / static_cast<size_t>(threads);
    std::vector<std::thread> pool;
    std::vector<std::string> errors(static_cast<size_t>(threads));
    for (int t = 0; t < threads; t++) {
        size_t a = static_cast<size_t>(t) * per, b = std::min(nq, a + per);
        if (a >= b)
            break;
        pool.emplace_back([&, a, b, t]() {
            try {
                gpuivfpq::brute_force_knn(&queries[a * d], b - a, base.vecs.data(), n, d, metric,
                                          kgt, &gt.dist[a * kgt], &labels[a * kgt]);
            } catch (const std::exception& e) {
                errors[static_cast<size_t>(t)] = e.what();
            }
        });
    }
    for (auto& th : pool)
        th.join();
    for (auto& e : errors)
        if (!e.empty())
            die("brute_force_knn: " + e);
    for (size_t i = 0; i < labels.size(); i++)
        gt.ids[i] = labels[i] >= 0 ? base.ids[static_cast<size_t>(labels[i])] : -1;
}

// The p-quantile of v, interpolated between neighbours.
double percentile(std::vector<double> v, double p)
{
    if (v.empty())
        return 0;
    std::sort(v.begin(), v.end());
    double pos = p * static_cast<double>(v.size() - 1);
    size_t lo = static_cast<size_t>(pos);
    size_t hi = std::min(lo + 1, v.size() - 1);
    return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

// The scan node EXPLAIN shows for sql with the parameter query.
std::string plan_node(pqxx::transaction_base& tx, const std::string& sql, const std::string& query)
{
    pqxx::result r = tx.exec_params("EXPLAIN (COSTS OFF) " + sql, query);
    for (const auto& row : r) {
        std::string line = row[0].c_str();
        size_t pos = line.find_first_not_of(" ->");
        line = line.substr(pos == std::string::npos ? 0 : pos);
        if (line.find("Scan") != std::string::npos) {
            size_t on = line.find(" on ");
            return on == std::string::npos ? line : line.substr(0, on);
        }
    }
    return "?";
}

// One line of the printed table.
struct Row {
    std::string setting, plan;
    double recall, qps, p50, p99;
};

// Prints the results as an aligned table.
void print_table(const std::vector<Row>& rows, size_t k)
{
    std::string rk = "recall@" + std::to_string(k);
    size_t w_set = std::string("setting").size(), w_plan = std::string("plan").size();
    for (auto& r : rows) {
        w_set = std::max(w_set, r.setting.size());
        w_plan = std::max(w_plan, r.plan.size());
    }
    std::printf("%-*s | %9s | %9s | %8s | %8s | %s\n", static_cast<int>(w_set), "setting", rk.c_str(),
                "QPS", "p50 ms", "p99 ms", "plan");
    std::printf("%s-|-%s-|-%s-|-%s-|-%s-|-%s\n", std::string(w_set, '-').c_str(),
                std::string(9, '-').c_str(), std::string(9, '-').c_str(), std::string(8, '-').c_str(),
                std::string(8, '-').c_str(), std::string(w_plan, '-').c_str());
    for (auto& r : rows)
        std::printf("%-*s | %9.4f | %9.1f | %8.3f | %8.3f | %s\n", static_cast<int>(w_set),
                    r.setting.c_str(), r.recall, r.qps, r.p50, r.p99, r.plan.c_str());
    std::fflush(stdout);
}

// Returns the exit status: 0, or 2 when a setting's recall is below --min-recall.
int run(const Options& o)
{
    gpuivfpq::Metric metric;
    if (o.op == "<->")
        metric = gpuivfpq::Metric::L2;
    else if (o.op == "<#>")
        metric = gpuivfpq::Metric::InnerProduct;
    else if (o.op == "<=>")
        metric = gpuivfpq::Metric::Cosine;
    else
        die("--op must be <->, <#> or <=>");
    const size_t k = size_t(o.k);
    const std::vector<Setting> settings = parse_settings(o.settings);

    pqxx::connection conn(o.conninfo);
    // Autocommit: SET and RESET last for the session, as from psql.
    pqxx::nontransaction tx(conn);
    for (const std::string& s : o.sql)
        tx.exec(s);

    const std::string col = conn.quote_name(o.column);
    const std::string idcol = conn.quote_name(o.id_column);
    const std::string tab = quote_table(conn, o.table);

    // Queries.
    std::vector<float> queries;
    size_t d = 0, nq = 0;
    if (!o.queries.empty()) {
        d = read_fvecs(o.queries, queries, size_t(o.nq));
        nq = queries.size() / d;
    } else {
        // The first --nq rows by id (COPY of a whole table has no order).
        Vectors q = read_vectors(tx, quote_table(conn, o.query_table), idcol, col, 0);
        d = q.d;
        std::vector<size_t> order(q.ids.size());
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return q.ids[a] < q.ids[b]; });
        nq = o.nq > 0 ? std::min(order.size(), size_t(o.nq)) : order.size();
        queries.resize(nq * d);
        for (size_t i = 0; i < nq; i++)
            std::copy_n(&q.vecs[order[i] * d], d, &queries[i * d]);
    }
    if (nq == 0 || d == 0)
        die("no query vectors");

    // Ground truth (k plus a margin, so that ties at the k-th distance count).
    const uint64_t rows = tx.exec("SELECT count(*) FROM " + tab)[0][0].as<uint64_t>();
    if (rows == 0)
        die("table " + o.table + " is empty");
    const size_t kgt = size_t(std::min<uint64_t>(rows, k + 16));
    CacheKey key{nq, kgt, d, rows, static_cast<uint64_t>(metric),
                 fnv1a(queries.data(), queries.size() * 4), fnv1a(o.table.data(), o.table.size())};
    GroundTruth gt;
    std::string gt_note;
    auto t0 = Clock::now();
    if (!o.gt_cache.empty() && load_cache(o.gt_cache, key, gt)) {
        gt_note = "ground truth: cached in " + o.gt_cache;
    } else {
        Vectors base = read_vectors(tx, tab, idcol, col, rows);
        if (base.d != d)
            die("queries have " + std::to_string(d) + " dimensions, table vectors " +
                std::to_string(base.d));
        double t_read = std::chrono::duration<double>(Clock::now() - t0).count();
        auto t1 = Clock::now();
        compute_gt(queries, nq, base, metric, kgt, int(o.threads), gt);
        double t_gt = std::chrono::duration<double>(Clock::now() - t1).count();
        char b[160];
        std::snprintf(b, sizeof b, "ground truth: brute force (read %zu rows in %.1f s, knn in %.2f s)",
                      base.ids.size(), t_read, t_gt);
        gt_note = b;
        if (!o.gt_cache.empty())
            save_cache(o.gt_cache, key, gt);
    }

    // Tie-aware truth sets: every id whose exact distance is within rounding
    // of the k-th smallest.
    std::vector<std::unordered_set<int64_t>> truth(nq);
    for (size_t i = 0; i < nq; i++) {
        const float* dist = &gt.dist[i * kgt];
        const int64_t* ids = &gt.ids[i * kgt];
        size_t kk = std::min(k, kgt);
        float thr = dist[kk - 1];
        float tol = 1e-5f * std::fabs(thr) + 1e-6f;
        for (size_t j = 0; j < kgt; j++)
            if (ids[j] >= 0 && (j < kk || dist[j] <= thr + tol))
                truth[i].insert(ids[j]);
    }

    const std::string sql = "SELECT " + idcol + " FROM " + tab + " ORDER BY " + col + " " + o.op +
                            " $1::real[] LIMIT " + std::to_string(k);
    // Each query's vector as the parameter's text, {x1,...}: exact, as
    // append_array_text writes the shortest form that reads back the same.
    std::vector<std::string> params(nq);
    for (size_t i = 0; i < nq; i++)
        params[i] = array_text(&queries[i * d], d);

    std::printf("# knn_bench: table %s (%llu rows, %zu dims), %zu queries, k=%zu, op %s\n",
                o.table.c_str(), static_cast<unsigned long long>(rows), d, nq, k, o.op.c_str());
    std::printf("# %s\n", gt_note.c_str());
    std::printf("# query: %s\n", sql.c_str());

    std::vector<Row> table_rows;
    std::vector<std::string> set_before;
    bool below = false;
    FILE* lat_file = nullptr;
    if (!o.latencies.empty()) {
        lat_file = std::fopen(o.latencies.c_str(), "w");
        if (!lat_file)
            die("cannot write " + o.latencies + ": " + std::strerror(errno));
    }
    for (const Setting& s : settings) {
        for (const std::string& name : set_before)
            tx.exec("RESET " + name);
        set_before.clear();
        for (auto g : s.gucs) {
            if (g.first.find('.') == std::string::npos &&
                tx.exec_params1("SELECT count(*) FROM pg_settings WHERE name = $1", g.first)[0]
                        .as<long>() == 0)
                g.first = "gpu_ivfpq." + g.first;
            tx.exec("SET " + g.first + " = " + tx.quote(g.second));
            set_before.push_back(g.first);
        }
        // Prepared afresh for each setting, as the plan may depend on it.
        conn.unprepare("knn");
        conn.prepare("knn", sql);
        const std::string plan = plan_node(tx, sql, params[0]);

        auto run_one = [&](size_t i, std::vector<int64_t>* got) {
            pqxx::result r;
            try {
                r = tx.exec_prepared("knn", params[i]);
            } catch (const std::exception& e) {
                die("query " + std::to_string(i) + " with setting " + s.label + " failed: " + e.what());
            }
            if (got) {
                got->clear();
                for (const auto& row : r)
                    got->push_back(row[0].as<int64_t>());
            }
        };

        for (long long w = 0; w < o.warmup; w++)
            run_one(size_t(w) % nq, nullptr);

        std::vector<double> lat(nq);
        std::vector<std::vector<int64_t>> results(nq);
        auto start = Clock::now();
        for (size_t i = 0; i < nq; i++) {
            auto q0 = Clock::now();
            run_one(i, &results[i]);
            lat[i] = std::chrono::duration<double, std::milli>(Clock::now() - q0).count();
        }
        double total = std::chrono::duration<double>(Clock::now() - start).count();
        if (lat_file)
            for (size_t i = 0; i < nq; i++)
                std::fprintf(lat_file, "%s\t%zu\t%.4f\n", s.label.c_str(), i, lat[i]);

        double recall_sum = 0;
        for (size_t i = 0; i < nq; i++) {
            size_t hits = 0;
            std::unordered_set<int64_t> seen;
            for (size_t j = 0; j < results[i].size() && j < k; j++)
                if (seen.insert(results[i][j]).second && truth[i].count(results[i][j]))
                    hits++;
            recall_sum += double(std::min(hits, k)) / double(std::min<size_t>(k, rows));
        }
        Row row{s.label, plan, recall_sum / double(nq), double(nq) / total, percentile(lat, 0.50),
                percentile(lat, 0.99)};
        if (o.min_recall >= 0 && row.recall < o.min_recall)
            below = true;
        table_rows.push_back(row);
    }
    for (const std::string& name : set_before)
        tx.exec("RESET " + name);
    if (lat_file && std::fclose(lat_file) != 0)
        die("writing " + o.latencies + " failed");

    print_table(table_rows, k);
    if (below) {
        std::fprintf(stderr, "knn_bench: recall@%zu below --min-recall %.4f\n", k, o.min_recall);
        return 2;
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv)
{
    const Options o = parse_options(argc, argv);
    try {
        return run(o);
    } catch (const std::exception& e) {
        die(e.what());
    }
}
