// knn_bench: recall and latency of k-NN queries through SQL, from one client.
//
// For each setting (a list of GUC assignments), it SETs the GUCs, PREPAREs
//   SELECT <id> FROM <table> ORDER BY <column> <op> $1::real[] LIMIT <k>
// runs every query vector through it (a binary float4[] parameter), and
// reports recall@k against exact ground truth, queries per second and the
// p50/p99 latency. Ground truth comes from the engine's brute_force_knn on
// the table's vectors read back over binary COPY, or from a cache file.
#include <libpq-fe.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <thread>
#include <unordered_set>

#include "common.h"
#include "topk.h"

using namespace tools;
using Clock = std::chrono::steady_clock;

namespace {

const char* kUsage = R"USAGE(usage: knn_bench --table T (--queries FILE.fvecs | --query-table QT) [options]

  --conninfo STR        libpq connection string (default: libpq environment, PGHOST etc.)
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

// ---------------------------------------------------------------- libpq

struct Conn {
    PGconn* c = nullptr;
    ~Conn()
    {
        if (c)
            PQfinish(c);
    }
};

void exec_ok(PGconn* c, const std::string& sql)
{
    PGresult* r = PQexec(c, sql.c_str());
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
        std::string msg = PQerrorMessage(c);
        PQclear(r);
        die("'" + sql + "' failed: " + msg);
    }
    PQclear(r);
}

std::string scalar(PGconn* c, const std::string& sql)
{
    PGresult* r = PQexec(c, sql.c_str());
    if (PQresultStatus(r) != PGRES_TUPLES_OK || PQntuples(r) < 1) {
        std::string msg = PQerrorMessage(c);
        PQclear(r);
        die("'" + sql + "' failed: " + msg);
    }
    std::string v = PQgetvalue(r, 0, 0);
    PQclear(r);
    return v;
}

std::string ident(PGconn* c, const std::string& name)
{
    // Accept schema-qualified names: quote each part.
    std::string out;
    size_t start = 0;
    for (;;) {
        size_t dot = name.find('.', start);
        std::string part = name.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
        char* q = PQescapeIdentifier(c, part.c_str(), part.size());
        if (!q)
            die(std::string("bad identifier: ") + PQerrorMessage(c));
        out += q;
        PQfreemem(q);
        if (dot == std::string::npos)
            break;
        out += '.';
        start = dot + 1;
    }
    return out;
}

// Runs a COPY ... TO STDOUT (FORMAT binary) of (id, vector) rows.
void copy_out(PGconn* c, const std::string& sql, CopyRowParser& parser)
{
    PGresult* r = PQexec(c, sql.c_str());
    if (PQresultStatus(r) != PGRES_COPY_OUT) {
        std::string msg = PQerrorMessage(c);
        PQclear(r);
        die("'" + sql + "' failed: " + msg);
    }
    PQclear(r);
    char* buf = nullptr;
    int n;
    try {
        while ((n = PQgetCopyData(c, &buf, 0)) > 0) {
            parser.feed(buf, static_cast<size_t>(n));
            PQfreemem(buf);
            buf = nullptr;
        }
    } catch (const std::exception& e) {
        die(std::string("reading '") + sql + "': " + e.what());
    }
    if (n == -2)
        die(std::string("COPY failed: ") + PQerrorMessage(c));
    r = PQgetResult(c);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        std::string msg = PQerrorMessage(c);
        PQclear(r);
        die("'" + sql + "' failed: " + msg);
    }
    PQclear(r);
    while ((r = PQgetResult(c)))
        PQclear(r);
}

// Binary float4[] parameter.
std::string float4_array(const float* v, size_t d)
{
    std::string s(20 + d * 8, '\0');
    char* p = &s[0];
    put32(p, 1);
    put32(p, 0);
    put32(p, kFloat4Oid);
    put32(p, static_cast<uint32_t>(d));
    put32(p, 1);
    for (size_t j = 0; j < d; j++) {
        uint32_t bits;
        std::memcpy(&bits, &v[j], 4);
        put32(p, 4);
        put32(p, bits);
    }
    return s;
}

std::string text_array(const float* v, size_t d)
{
    std::string s = "{";
    char b[32];
    for (size_t j = 0; j < d; j++) {
        std::snprintf(b, sizeof b, "%s%.9g", j ? "," : "", static_cast<double>(v[j]));
        s += b;
    }
    return s + "}";
}

// ---------------------------------------------------------------- settings

struct Setting {
    std::string label;
    std::vector<std::pair<std::string, std::string>> gucs;
};

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

struct GroundTruth {
    size_t nq = 0, kgt = 0;
    std::vector<float> dist;  // nq x kgt, ascending
    std::vector<int64_t> ids; // nq x kgt (-1 = none)
};

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ULL)
{
    const unsigned char* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

struct CacheKey {
    uint64_t nq, kgt, d, rows, metric, qhash, thash;
};

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

void compute_gt(const std::vector<float>& queries, size_t nq, const CopyRowParser& base,
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

std::string plan_node(PGconn* c, const std::string& sql, const std::string& param)
{
    const char* values[1] = {param.c_str()};
    std::string q = "EXPLAIN (COSTS OFF) " + sql;
    PGresult* r = PQexecParams(c, q.c_str(), 1, nullptr, values, nullptr, nullptr, 0);
    std::string out = "?";
    if (PQresultStatus(r) == PGRES_TUPLES_OK) {
        for (int i = 0; i < PQntuples(r); i++) {
            std::string line = PQgetvalue(r, i, 0);
            size_t pos = line.find_first_not_of(" ->");
            line = line.substr(pos == std::string::npos ? 0 : pos);
            if (line.find("Scan") != std::string::npos) {
                size_t on = line.find(" on ");
                out = on == std::string::npos ? line : line.substr(0, on);
                break;
            }
        }
    }
    PQclear(r);
    return out;
}

}  // namespace

int main(int argc, char** argv)
{
    Args args(argc, argv, {"help"});
    if (args.has("help")) {
        std::fputs(kUsage, stdout);
        return 0;
    }
    args.check({"conninfo", "table", "column", "id-column", "queries", "query-table", "nq", "k",
                "op", "settings", "sql", "warmup", "gt-cache", "threads", "min-recall",
                "latencies"});
    const std::string table = args.str("table");
    if (table.empty())
        die("--table is required (see --help)");
    if (args.has("queries") == args.has("query-table"))
        die("give exactly one of --queries FILE or --query-table TABLE");
    const std::string op = args.str("op", "<->");
    gpuivfpq::Metric metric;
    if (op == "<->")
        metric = gpuivfpq::Metric::L2;
    else if (op == "<#>")
        metric = gpuivfpq::Metric::InnerProduct;
    else if (op == "<=>")
        metric = gpuivfpq::Metric::Cosine;
    else
        die("--op must be <->, <#> or <=>");
    const long long k_arg = args.num("k", 10);
    const long long nq_arg = args.num("nq", 0);
    const long long warmup = args.num("warmup", 20);
    const long long threads = args.num("threads", 2);
    if (k_arg < 1 || nq_arg < 0 || warmup < 0 || threads < 1)
        die("--k and --threads must be >= 1, --nq and --warmup >= 0");
    const size_t k = static_cast<size_t>(k_arg);
    const double min_recall = args.real("min-recall", -1.0);
    std::vector<Setting> settings = parse_settings(args.all("settings"));

    Conn conn;
    conn.c = PQconnectdb(args.str("conninfo").c_str());
    if (PQstatus(conn.c) != CONNECTION_OK)
        die(std::string("connection failed: ") + PQerrorMessage(conn.c));
    PGconn* c = conn.c;
    for (const std::string& s : args.all("sql"))
        exec_ok(c, s);

    const std::string col = ident(c, args.str("column", "embedding"));
    const std::string idcol = ident(c, args.str("id-column", "id"));
    const std::string tab = ident(c, table);

    // Queries.
    std::vector<float> queries;
    size_t d = 0, nq = 0;
    if (args.has("queries")) {
        d = read_fvecs(args.str("queries"), queries, static_cast<size_t>(nq_arg));
        nq = queries.size() / d;
    } else {
        CopyRowParser qp;
        std::string sql = "COPY (SELECT " + idcol + ", " + col + " FROM " +
                          ident(c, args.str("query-table")) + " ORDER BY " + idcol +
                          (nq_arg > 0 ? " LIMIT " + std::to_string(nq_arg) : "") +
                          ") TO STDOUT (FORMAT binary)";
        copy_out(c, sql, qp);
        d = qp.d;
        nq = qp.ids.size();
        queries.swap(qp.vecs);
    }
    if (nq == 0 || d == 0)
        die("no query vectors");

    // Ground truth (k plus a margin, so that ties at the k-th distance count).
    const uint64_t rows = std::stoull(scalar(c, "SELECT count(*) FROM " + tab));
    if (rows == 0)
        die("table " + table + " is empty");
    const size_t kgt = static_cast<size_t>(std::min<uint64_t>(rows, k + 16));
    CacheKey key{nq, kgt, d, rows, static_cast<uint64_t>(metric),
                 fnv1a(queries.data(), queries.size() * 4), fnv1a(table.data(), table.size())};
    GroundTruth gt;
    std::string gt_note;
    const std::string cache = args.str("gt-cache");
    auto t0 = Clock::now();
    if (!cache.empty() && load_cache(cache, key, gt)) {
        gt_note = "ground truth: cached in " + cache;
    } else {
        CopyRowParser base;
        base.expect_rows = rows;
        copy_out(c, "COPY (SELECT " + idcol + ", " + col + " FROM " + tab + ") TO STDOUT (FORMAT binary)",
                 base);
        if (base.d != d)
            die("queries have " + std::to_string(d) + " dimensions, table vectors " +
                std::to_string(base.d));
        double t_read = std::chrono::duration<double>(Clock::now() - t0).count();
        auto t1 = Clock::now();
        compute_gt(queries, nq, base, metric, kgt, static_cast<int>(threads), gt);
        double t_gt = std::chrono::duration<double>(Clock::now() - t1).count();
        char b[160];
        std::snprintf(b, sizeof b, "ground truth: brute force (read %zu rows in %.1f s, knn in %.2f s)",
                      base.ids.size(), t_read, t_gt);
        gt_note = b;
        if (!cache.empty())
            save_cache(cache, key, gt);
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

    const std::string sql = "SELECT " + idcol + " FROM " + tab + " ORDER BY " + col + " " + op +
                            " $1::real[] LIMIT " + std::to_string(k);
    std::vector<std::string> params(nq);
    for (size_t i = 0; i < nq; i++)
        params[i] = float4_array(&queries[i * d], d);

    std::printf("# knn_bench: table %s (%llu rows, %zu dims), %zu queries, k=%zu, op %s\n",
                table.c_str(), static_cast<unsigned long long>(rows), d, nq, k, op.c_str());
    std::printf("# %s\n", gt_note.c_str());
    std::printf("# query: %s\n", sql.c_str());

    struct Row {
        std::string setting, plan;
        double recall, qps, p50, p99;
    };
    std::vector<Row> table_rows;
    std::vector<std::string> set_before;
    bool below = false;
    FILE* lat_file = nullptr;
    if (args.has("latencies")) {
        lat_file = std::fopen(args.str("latencies").c_str(), "w");
        if (!lat_file)
            die("cannot write " + args.str("latencies") + ": " + std::strerror(errno));
    }
    for (const Setting& s : settings) {
        for (const std::string& name : set_before)
            exec_ok(c, "RESET " + name);
        set_before.clear();
        for (auto g : s.gucs) {
            if (g.first.find('.') == std::string::npos) {
                char* nl = PQescapeLiteral(c, g.first.c_str(), g.first.size());
                bool core = scalar(c, "SELECT count(*) FROM pg_settings WHERE name = " +
                                          std::string(nl)) != "0";
                PQfreemem(nl);
                if (!core)
                    g.first = "gpu_ivfpq." + g.first;
            }
            char* lit = PQescapeLiteral(c, g.second.c_str(), g.second.size());
            exec_ok(c, "SET " + g.first + " = " + std::string(lit));
            PQfreemem(lit);
            set_before.push_back(g.first);
        }
        exec_ok(c, "DEALLOCATE ALL");
        const Oid types[1] = {1021};  // float4[]
        PGresult* pr = PQprepare(c, "knn", sql.c_str(), 1, types);
        if (PQresultStatus(pr) != PGRES_COMMAND_OK)
            die("PREPARE failed: " + std::string(PQerrorMessage(c)));
        PQclear(pr);
        std::string plan = plan_node(c, sql, text_array(&queries[0], d));

        auto run_one = [&](size_t i, std::vector<int64_t>* got) {
            const char* values[1] = {params[i].data()};
            const int lengths[1] = {static_cast<int>(params[i].size())};
            const int formats[1] = {1};
            PGresult* r = PQexecPrepared(c, "knn", 1, values, lengths, formats, 1);
            if (PQresultStatus(r) != PGRES_TUPLES_OK) {
                std::string msg = PQerrorMessage(c);
                PQclear(r);
                die("query " + std::to_string(i) + " with setting " + s.label + " failed: " + msg);
            }
            if (got) {
                got->clear();
                for (int row = 0; row < PQntuples(r); row++) {
                    const char* v = PQgetvalue(r, row, 0);
                    got->push_back(PQgetlength(r, row, 0) == 8
                                       ? static_cast<int64_t>(get64(v))
                                       : static_cast<int32_t>(get32(v)));
                }
            }
            PQclear(r);
        };

        for (long long w = 0; w < warmup; w++)
            run_one(static_cast<size_t>(w) % nq, nullptr);

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
            recall_sum += static_cast<double>(std::min(hits, k)) / static_cast<double>(std::min<size_t>(k, rows));
        }
        Row row{s.label, plan, recall_sum / static_cast<double>(nq),
                static_cast<double>(nq) / total, percentile(lat, 0.50), percentile(lat, 0.99)};
        if (min_recall >= 0 && row.recall < min_recall)
            below = true;
        table_rows.push_back(row);
        std::fflush(stdout);
    }
    for (const std::string& name : set_before)
        exec_ok(c, "RESET " + name);
    if (lat_file && std::fclose(lat_file) != 0)
        die("writing " + args.str("latencies") + " failed");

    // The table.
    std::string rk = "recall@" + std::to_string(k);
    size_t w_set = std::string("setting").size(), w_plan = std::string("plan").size();
    for (auto& r : table_rows) {
        w_set = std::max(w_set, r.setting.size());
        w_plan = std::max(w_plan, r.plan.size());
    }
    std::printf("%-*s | %9s | %9s | %8s | %8s | %s\n", static_cast<int>(w_set), "setting", rk.c_str(),
                "QPS", "p50 ms", "p99 ms", "plan");
    std::printf("%s-|-%s-|-%s-|-%s-|-%s-|-%s\n", std::string(w_set, '-').c_str(),
                std::string(9, '-').c_str(), std::string(9, '-').c_str(), std::string(8, '-').c_str(),
                std::string(8, '-').c_str(), std::string(w_plan, '-').c_str());
    for (auto& r : table_rows)
        std::printf("%-*s | %9.4f | %9.1f | %8.3f | %8.3f | %s\n", static_cast<int>(w_set),
                    r.setting.c_str(), r.recall, r.qps, r.p50, r.p99, r.plan.c_str());
    std::fflush(stdout);
    if (below) {
        std::fprintf(stderr, "knn_bench: recall@%zu below --min-recall %.4f\n", k, min_recall);
        return 2;
    }
    return 0;
}
