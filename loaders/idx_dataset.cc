#include "loaders/idx_dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>

#include "loaders/source_registry.h"
#include "ops/error.h"

namespace cnnflow {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // uint8, 3 dimensions
constexpr uint32_t kLabelsMagic = 0x00000801;  // uint8, 1 dimension
// Bytes in one sample (rows x cols): 2^28, a 16384 x 16384 image.
constexpr int64_t kMaxSampleBytes = int64_t{1} << 28;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzPtr = std::unique_ptr<gzFile_s, GzCloser>;

std::string Hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// Reads up to n bytes; returns how many were read (fewer at end of file).
size_t ReadBytes(gzFile f, uint8_t* dst, size_t n, const std::string& path) {
  size_t got = 0;
  while (got < n) {
    const unsigned want = static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
    const int r = gzread(f, dst + got, want);
    if (r < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      throw Error(
          StrCat("IDX '", path, "': read error: ", errnum == Z_ERRNO ? std::strerror(errno) : msg));
    }
    if (r == 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

// One IDX file of uint8 values: checks the magic, returns the dimensions
// and the data.
std::vector<uint8_t> ReadIdx(const std::string& path, uint32_t magic, const char* what,
                             std::vector<int64_t>* dims) {
  const std::string pre = StrCat("IDX '", path, "': ");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    throw Error(StrCat(pre, "cannot open: ", std::strerror(errno)));
  }
  GzPtr f(gzopen(path.c_str(), "rb"));
  if (!f) throw Error(StrCat(pre, "cannot open: ", std::strerror(errno)));
  gzbuffer(f.get(), 1 << 18);

  const int rank = static_cast<int>(magic & 0xff);
  std::vector<uint8_t> head(4 + 4 * rank);
  const size_t got_head = ReadBytes(f.get(), head.data(), 4, path);
  if (got_head < 4) {
    throw Error(StrCat(pre, "truncated header: expected 4 bytes of magic number, got ", got_head));
  }
  auto be32 = [&](size_t at) {
    return static_cast<uint32_t>(head[at]) << 24 | static_cast<uint32_t>(head[at + 1]) << 16 |
           static_cast<uint32_t>(head[at + 2]) << 8 | static_cast<uint32_t>(head[at + 3]);
  };
  const uint32_t found = be32(0);
  if (found != magic) {
    throw Error(
        StrCat(pre, "bad magic number ", Hex(found), ", expected ", Hex(magic), " (", what, ")"));
  }
  const size_t got_dims = ReadBytes(f.get(), head.data() + 4, 4 * rank, path);
  if (got_dims < static_cast<size_t>(4 * rank)) {
    throw Error(StrCat(pre, "truncated header: expected ", 4 * rank, " bytes of dimensions, got ",
                       got_dims));
  }
  dims->clear();
  for (int i = 0; i < rank; ++i) dims->push_back(be32(4 + 4 * i));
  // A sample is dims[1] x ... bytes. The total alone does not bound it: with
  // 0 samples a header could state any rows x cols (found by fuzz/,
  // fuzz_idx: [0, 256, 1612709888] images became samples of 400 GB).
  auto dims_text = [&] {
    std::string t;
    for (int64_t d : *dims) t += (t.empty() ? "" : ", ") + std::to_string(d);
    return "[" + t + "]";
  };
  if ((*dims)[0] == 0) throw Error(StrCat(pre, "the header says 0 samples ", dims_text()));
  int64_t sample = 1;  // each factor <= 2^28 before it multiplies: no overflow
  for (int i = 1; i < rank && sample > 0 && sample <= kMaxSampleBytes; ++i) {
    const int64_t d = (*dims)[i];
    sample = d == 0 || d > kMaxSampleBytes ? 0 : sample * d;
  }
  if (sample == 0 || sample > kMaxSampleBytes) {
    throw Error(StrCat(pre, "implausible sample size in the header ", dims_text(), ": each of the ",
                       (*dims)[0], " samples must be 1 to ", kMaxSampleBytes, " bytes"));
  }
  int64_t total = 0;
  if (__builtin_mul_overflow((*dims)[0], rank > 1 ? sample : 1, &total) ||
      total > (int64_t{1} << 40)) {
    throw Error(StrCat(pre, "implausible dimensions in the header ", dims_text()));
  }
  // Grow as data arrives, so a corrupt header cannot make us allocate a
  // terabyte before finding the file is short.
  std::vector<uint8_t> data;
  size_t got = 0;
  constexpr size_t kChunk = 16 << 20;
  while (got < static_cast<size_t>(total)) {
    const size_t want = std::min(static_cast<size_t>(total) - got, kChunk);
    data.resize(got + want);
    const size_t r = ReadBytes(f.get(), data.data() + got, want, path);
    got += r;
    if (r < want) break;
  }
  if (got < static_cast<size_t>(total)) {
    throw Error(StrCat(pre, "truncated data: expected ", total, " bytes, got ", got));
  }
  return data;
}

}  // namespace

std::unique_ptr<IdxDataset> IdxDataset::Open(const std::string& images_path,
                                             const std::string& labels_path) {
  std::unique_ptr<IdxDataset> ds(new IdxDataset());
  ds->images_path_ = images_path;
  ds->labels_path_ = labels_path;
  std::vector<int64_t> idims, ldims;
  ds->pixels_ = ReadIdx(images_path, kImagesMagic, "uint8 images [n, rows, cols]", &idims);
  ds->labels_ = ReadIdx(labels_path, kLabelsMagic, "uint8 labels [n]", &ldims);
  if (idims[0] != ldims[0]) {
    throw Error(StrCat("IDX: '", images_path, "' has ", idims[0], " images but '", labels_path,
                       "' has ", ldims[0], " labels"));
  }
  ds->size_ = idims[0];
  ds->rows_ = idims[1];
  ds->cols_ = idims[2];
  int max_label = 0;
  for (uint8_t l : ds->labels_) max_label = std::max<int>(max_label, l);
  ds->num_classes_ = max_label + 1;
  return ds;
}

ReadResult IdxDataset::Read(int64_t index, const ReadContext&, float* dst) const {
  CNNFLOW_ENFORCE(index >= 0 && index < size_, "IDX '", images_path_, "': sample ", index,
                  " out of range [0, ", size_, ")");
  const int64_t n = rows_ * cols_;
  const uint8_t* src = pixels_.data() + index * n;
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]) / 255.f;
  return {labels_[index], ""};
}

std::string IdxDataset::description() const {
  return StrCat("IDX ", images_path_, " + ", labels_path_, " (", size_, " samples of [1, ", rows_,
                ", ", cols_, "], ", num_classes_, " classes)");
}

CNNFLOW_REGISTER_SOURCE(
    idx,
    Schema("IDX files as MNIST and Fashion-MNIST ship them (gzip-compressed or plain): "
           "uint8 images [n, rows, cols] -> samples [1, rows, cols] in [0, 1], uint8 labels [n].")
        .Required("images", ParamType::kString, "path of the images file (magic 0x00000803)")
        .Required("labels", ParamType::kString, "path of the labels file (magic 0x00000801)"),
    [](const Args& a) -> std::shared_ptr<Dataset> {
      return IdxDataset::Open(a.String("images"), a.String("labels"));
    });

}  // namespace cnnflow
