// fmnist_load: Fashion-MNIST idx files (gzip) to PostgreSQL binary COPY.
//
// Emits rows (id bigint, label integer, embedding real[784]) with the pixel
// values as floats: raw 0..255 by default, or 0..1 with --scale unit.
#include <zlib.h>

#include "common.h"

using namespace tools;

namespace {

const char* kUsage = R"USAGE(usage: fmnist_load [options]

Reads Fashion-MNIST (or MNIST) idx files (.gz or plain) and writes them as
PostgreSQL binary COPY rows (id bigint, label integer, embedding real[784]),
for COPY t (id, label, embedding) FROM STDIN WITH (FORMAT binary).

  --set train|test     which split (default train: 60000 rows; test: 10000)
  --dir DIR            dataset folder (default /usr/share/datasets/fashion-mnist)
  --images FILE        images file (default DIR/<set>-images-idx3-ubyte.gz)
  --labels FILE        labels file (default DIR/<set>-labels-idx1-ubyte.gz)
  --format copy|fvecs  copy (default) or .fvecs (vectors only, no ids/labels)
  --no-label           COPY rows (id, embedding) only
  --scale raw|unit     pixel values 0..255 (raw, default) or divided by 255 (unit)
  --limit N            only the first N images (default all)
  --id-start I         id of the first image (default 1; ids follow file order)
  --out FILE           output (default - = stdout)
  --help
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

uint32_t be_at(const std::vector<unsigned char>& v, size_t off)
{
    return (uint32_t(v[off]) << 24) | (uint32_t(v[off + 1]) << 16) | (uint32_t(v[off + 2]) << 8) |
           uint32_t(v[off + 3]);
}

}  // namespace

int main(int argc, char** argv)
{
    Args args(argc, argv, {"help", "no-label"});
    if (args.has("help")) {
        std::fputs(kUsage, stdout);
        return 0;
    }
    args.check({"set", "dir", "images", "labels", "format", "no-label", "scale", "limit",
                "id-start", "out"});
    const std::string set = args.str("set", "train");
    if (set != "train" && set != "test")
        die("--set must be train or test");
    const std::string dir = args.str("dir", "/usr/share/datasets/fashion-mnist");
    const std::string prefix = set == "train" ? "train" : "t10k";
    const std::string images_path = args.str("images", dir + "/" + prefix + "-images-idx3-ubyte.gz");
    const std::string labels_path = args.str("labels", dir + "/" + prefix + "-labels-idx1-ubyte.gz");
    const std::string format = args.str("format", "copy");
    if (format != "copy" && format != "fvecs")
        die("--format must be copy or fvecs");
    const std::string scale = args.str("scale", "raw");
    if (scale != "raw" && scale != "unit")
        die("--scale must be raw or unit");
    const bool with_label = !args.has("no-label");
    const long long limit = args.num("limit", 0);
    const long long id_start = args.num("id-start", 1);

    std::vector<unsigned char> img = read_gz(images_path);
    if (img.size() < 16 || be_at(img, 0) != 0x00000803)
        die(images_path + ": not an idx3 (images) file");
    const size_t n = be_at(img, 4), rows = be_at(img, 8), cols = be_at(img, 12);
    const size_t d = rows * cols;
    if (img.size() < 16 + n * d)
        die(images_path + ": truncated");

    std::vector<unsigned char> lab;
    if (with_label && format == "copy") {
        lab = read_gz(labels_path);
        if (lab.size() < 8 || be_at(lab, 0) != 0x00000801)
            die(labels_path + ": not an idx1 (labels) file");
        if (be_at(lab, 4) != n || lab.size() < 8 + n)
            die(labels_path + ": label count does not match the " + std::to_string(n) + " images");
    }

    size_t count = n;
    if (limit > 0 && static_cast<size_t>(limit) < n)
        count = static_cast<size_t>(limit);
    const float mul = scale == "unit" ? 1.0f / 255.0f : 1.0f;

    Output out(args.str("out", "-"));
    std::vector<Col> cols_kind{Col::Int8};
    if (with_label)
        cols_kind.push_back(Col::Int4);
    cols_kind.push_back(Col::Float4Array);
    std::vector<char> row(CopyEncoder::row_bytes(cols_kind, d));
    std::vector<float> v(d);
    if (format == "copy") {
        std::string h = CopyEncoder::header();
        out.write(h.data(), h.size());
    }
    for (size_t i = 0; i < count; i++) {
        const unsigned char* px = &img[16 + i * d];
        for (size_t j = 0; j < d; j++)
            v[j] = static_cast<float>(px[j]) * mul;
        if (format == "fvecs") {
            write_fvecs_row(out, v.data(), d);
            continue;
        }
        char* p = row.data();
        put16(p, static_cast<uint16_t>(cols_kind.size()));
        CopyEncoder::put_int8(p, id_start + static_cast<long long>(i));
        if (with_label)
            CopyEncoder::put_int4(p, lab[8 + i]);
        CopyEncoder::put_float_array(p, v.data(), d);
        out.write(row.data(), static_cast<size_t>(p - row.data()));
    }
    if (format == "copy") {
        std::string tr = CopyEncoder::trailer();
        out.write(tr.data(), tr.size());
    }
    out.close();
    return 0;
}
