// fmnist_load: Fashion-MNIST idx files (gzip) into PostgreSQL, or to COPY
// text or .fvecs files.
//
// Rows are (id bigint, label integer, embedding real[784]) with the pixel
// values as floats: raw 0..255 by default, or 0..1 with --scale unit.
#include <zlib.h>

#include <exception>

#include "common.h"
#include "copy_sink.h"

using namespace tools;

namespace {

const char* kUsage = R"USAGE(usage: fmnist_load [options]

Reads Fashion-MNIST (or MNIST) idx files (.gz or plain) and loads them into a
table (id bigint, label integer, embedding real[784]) with --table, or writes
them as COPY text rows (for COPY t (id, label, embedding) FROM STDIN) or as
.fvecs.

  --set train|test     which split (default train: 60000 rows; test: 10000)
  --dir DIR            dataset folder (default /usr/share/datasets/fashion-mnist)
  --images FILE        images file (default DIR/<set>-images-idx3-ubyte.gz)
  --labels FILE        labels file (default DIR/<set>-labels-idx1-ubyte.gz)
  --table T            load into table T's columns (id, label, embedding) in one
                       transaction (COPY through libpqxx)
  --conninfo STR       libpq connection string for --table (default: the PGHOST,
                       PGPORT, PGUSER, PGDATABASE ... environment)
  --format copy|fvecs  without --table: COPY text rows (default) or .fvecs
                       (vectors only, no ids or labels)
  --out FILE           without --table: output file (default - = stdout)
  --no-label           rows (id, embedding) only
  --scale raw|unit     pixel values 0..255 (raw, default) or divided by 255 (unit)
  --limit N            only the first N images (default 0 = all)
  --id-start I         id of the first image (default 1; ids follow file order)
  --help

Examples:
  fmnist_load --set train --table fm_train
  fmnist_load --set test --limit 1000 | psql -c "COPY fm_test (id, label, embedding) FROM STDIN"
)USAGE";

// Reads a whole (optionally gzip-compressed) file.
std::vector<unsigned char> read_gz(const std::string& path)
{
    gzFile f = gzopen(path.c_str(), "rb");
    if (!f)
        die("cannot open " + path + ": " + std::strerror(errno));
    std::vector<unsigned char> data;
    unsigned char buf[1 << 16];
    for (;;) {
        int n = gzread(f, buf, sizeof buf);
        if (n < 0) {
            int err;
            const char* msg = gzerror(f, &err);
            die("reading " + path + ": " + msg);
        }
        if (n == 0)
            break;
        data.insert(data.end(), buf, buf + n);
    }
    gzclose(f);
    return data;
}

// idx headers are big-endian 32-bit words.
uint32_t be_at(const std::vector<unsigned char>& v, size_t off)
{
    return (uint32_t(v[off]) << 24) | (uint32_t(v[off + 1]) << 16) | (uint32_t(v[off + 2]) << 8) |
           uint32_t(v[off + 3]);
}

// The command line, checked, with the file names filled in.
struct Options {
    std::string set = "train", dir = "/usr/share/datasets/fashion-mnist", images, labels;
    std::string table, conninfo, format = "copy", out = "-", scale = "raw";
    bool with_label = true;
    long long limit = 0, id_start = 1;
};

// Parses and checks the options (getopt_long); dies with a message on a bad one.
Options parse_options(int argc, char** argv)
{
    enum { kSet = 256, kDir, kImages, kLabels, kTable, kConninfo, kFormat, kOut, kNoLabel,
           kScale, kLimit, kIdStart, kHelp };
    static const option longopts[] = {
        {"set", required_argument, nullptr, kSet},
        {"dir", required_argument, nullptr, kDir},
        {"images", required_argument, nullptr, kImages},
        {"labels", required_argument, nullptr, kLabels},
        {"table", required_argument, nullptr, kTable},
        {"conninfo", required_argument, nullptr, kConninfo},
        {"format", required_argument, nullptr, kFormat},
        {"out", required_argument, nullptr, kOut},
        {"no-label", no_argument, nullptr, kNoLabel},
        {"scale", required_argument, nullptr, kScale},
        {"limit", required_argument, nullptr, kLimit},
        {"id-start", required_argument, nullptr, kIdStart},
        {"help", no_argument, nullptr, kHelp},
        {nullptr, 0, nullptr, 0}};
    Options o;
    bool have_out = false;
    int c;
    while ((c = getopt_long(argc, argv, "", longopts, nullptr)) != -1) {
        switch (c) {
        case kSet: o.set = optarg; break;
        case kDir: o.dir = optarg; break;
        case kImages: o.images = optarg; break;
        case kLabels: o.labels = optarg; break;
        case kTable: o.table = optarg; break;
        case kConninfo: o.conninfo = optarg; break;
        case kFormat: o.format = optarg; break;
        case kOut: o.out = optarg; have_out = true; break;
        case kNoLabel: o.with_label = false; break;
        case kScale: o.scale = optarg; break;
        case kLimit: o.limit = opt_int("limit"); break;
        case kIdStart: o.id_start = opt_int("id-start"); break;
        case kHelp: std::fputs(kUsage, stdout); std::exit(0);
        default: die("see --help");  // getopt_long has named the bad option
        }
    }
    if (optind < argc)
        die(std::string("unexpected argument '") + argv[optind] + "' (see --help)");
    if (o.set != "train" && o.set != "test")
        die("--set must be train or test");
    if (o.format != "copy" && o.format != "fvecs")
        die("--format must be copy or fvecs");
    if (o.scale != "raw" && o.scale != "unit")
        die("--scale must be raw or unit");
    if (!o.table.empty() && (have_out || o.format != "copy"))
        die("--table loads the rows itself: no --out or --format with it");
    if (o.limit < 0)
        die("--limit must be >= 0");
    const std::string prefix = o.set == "train" ? "train" : "t10k";
    if (o.images.empty())
        o.images = o.dir + "/" + prefix + "-images-idx3-ubyte.gz";
    if (o.labels.empty())
        o.labels = o.dir + "/" + prefix + "-labels-idx1-ubyte.gz";
    return o;
}

// Reads the idx files and sends the rows to the table or the file.
void run(const Options& o)
{
    std::vector<unsigned char> img = read_gz(o.images);
    if (img.size() < 16 || be_at(img, 0) != 0x00000803)
        die(o.images + ": not an idx3 (images) file");
    const size_t n = be_at(img, 4), d = size_t(be_at(img, 8)) * be_at(img, 12);
    if (img.size() < 16 + n * d)
        die(o.images + ": truncated");

    const bool fvecs = o.format == "fvecs";
    const bool with_label = o.with_label && !fvecs;
    std::vector<unsigned char> lab;
    if (with_label) {
        lab = read_gz(o.labels);
        if (lab.size() < 8 || be_at(lab, 0) != 0x00000801)
            die(o.labels + ": not an idx1 (labels) file");
        if (be_at(lab, 4) != n || lab.size() < 8 + n)
            die(o.labels + ": label count does not match the " + std::to_string(n) + " images");
    }
    const size_t count = o.limit > 0 && size_t(o.limit) < n ? size_t(o.limit) : n;
    const float mul = o.scale == "unit" ? 1.0f / 255.0f : 1.0f;

    std::unique_ptr<Output> fvecs_out;
    std::unique_ptr<CopySink> sink;
    if (fvecs) {
        fvecs_out = std::make_unique<Output>(o.out);
    } else if (!o.table.empty()) {
        std::vector<std::string> cols{"id", "label", "embedding"};
        if (!with_label)
            cols.erase(cols.begin() + 1);
        sink = CopySink::table(o.conninfo, o.table, cols);
    } else {
        sink = CopySink::file(o.out);
    }

    std::vector<float> v(d);
    std::string text;
    for (size_t i = 0; i < count; i++) {
        const unsigned char* px = &img[16 + i * d];
        for (size_t j = 0; j < d; j++)
            v[j] = static_cast<float>(px[j]) * mul;
        if (fvecs) {
            write_fvecs_row(*fvecs_out, v.data(), d);
            continue;
        }
        text.clear();
        append_array_text(text, v.data(), d);
        const int64_t id = o.id_start + static_cast<long long>(i);
        if (with_label)
            sink->row(id, lab[8 + i], text);
        else
            sink->row(id, text);
    }
    if (fvecs)
        fvecs_out->close();
    else
        sink->finish();
}

}  // namespace

int main(int argc, char** argv)
{
    Options o = parse_options(argc, argv);
    try {
        run(o);
    } catch (const std::exception& e) {
        die(e.what());
    }
    return 0;
}
