// loader_bench: how close cnnflow's loader comes to the physical limit of
// JPEG decoding on the same bytes. bench/loader_vs_pytorch.sh runs it next
// to PyTorch's DataLoader (bench/pytorch_loader.py).
//
// 1. raw_turbojpeg: the limit. The first --records JPEG payloads of the
//    config's data.train LMDB are copied into memory, then decoded to RGB in
//    a loop by the TurboJPEG API itself (tjDecompressHeader3 + tjDecompress2,
//    accurate DCT as cnnflow and PIL use), no cnnflow code in the timed
//    loop; 1 thread (the limit the tables compare with), and 2 std::threads
//    on disjoint halves (the machine's 2 cores). Each rep is one pass.
//    Figures 1 and 2 alternate in each of --reps rounds.
// 2. cnnflow_read: Dataset::Read + the data transform on the same records,
//    one thread, no graph: decode + augmentation + normalisation per sample
//    (what the loader stage does per sample, without batching or threads).
// 3. cnnflow_loader: the config's real train graph with the training step
//    cut out (sampler -> prefetch -> load), via TuneLoader (pipeline/tuner.h),
//    for each --threads value; --reps alternating rounds, median reported.
//
// One machine-readable line per figure:
//   raw_turbojpeg threads=1 images_per_s=... best=... records=... mean_bytes=... ...
//   raw_turbojpeg_floats threads=1 ...   (the same + the float batch rows, see DecodeStripe)
//   cnnflow_read images_per_s=... best=... records=...
//   cnnflow_loader load_threads=1 prefetch=4 images_per_s=... best=... cpu_cores=... runs=...
//   cnnflow_train_step images_per_s=...   (configured loader + the config's train step)
//
// Usage: loader_bench CONFIG [--set key=value ...] [--records N] [--reps R]
//        [--steps S] [--threads 1,2] [--prefetch D] [--no-raw] [--no-read]
//        [--no-loader]
#include <sys/resource.h>
#include <turbojpeg.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "loaders/dataset.h"
#include "loaders/lmdb_store.h"
#include "loaders/record.h"
#include "ops/error.h"
#include "pipeline/run_config.h"
#include "pipeline/trainer.h"
#include "pipeline/tuner.h"

namespace cnnflow {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU seconds of the whole process (every thread), to show how many cores
// a setting really got on a shared machine.
double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

std::string Join(const std::vector<double>& v) {
  std::string s;
  for (double x : v) {
    if (!s.empty()) s += ',';
    s += std::to_string(static_cast<int64_t>(x));
  }
  return s;
}

struct Options {
  std::string config;
  std::vector<std::string> sets;
  int64_t records = 20000;
  int reps = 3;
  int64_t steps = 100;
  std::vector<int64_t> threads = {1, 2};
  int64_t prefetch = 4;
  bool raw = true, read = true, loader = true;
};

constexpr const char* kUsage =
    "usage: loader_bench CONFIG [--set key=value ...] [--records N] [--reps R] [--steps S]\n"
    "                    [--threads 1,2] [--prefetch D] [--no-raw] [--no-read] [--no-loader]\n";

int64_t ParseInt(const std::string& flag, const std::string& v) {
  try {
    size_t used = 0;
    const long long x = std::stoll(v, &used);
    if (used == v.size() && x > 0) return x;
  } catch (const std::exception&) {
  }
  throw ConfigError(StrCat(flag, " needs a positive integer, got '", v, "'"));
}

Options ParseArgs(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw ConfigError(StrCat(a, " needs a value"));
      return argv[++i];
    };
    if (a == "--set") {
      o.sets.push_back(value());
    } else if (a == "--records") {
      o.records = ParseInt(a, value());
    } else if (a == "--reps") {
      o.reps = static_cast<int>(ParseInt(a, value()));
    } else if (a == "--steps") {
      o.steps = ParseInt(a, value());
    } else if (a == "--prefetch") {
      o.prefetch = ParseInt(a, value());
    } else if (a == "--threads") {
      o.threads.clear();
      std::string list = value();
      for (size_t p = 0; p <= list.size();) {
        const size_t q = std::min(list.find(',', p), list.size());
        o.threads.push_back(ParseInt(a, list.substr(p, q - p)));
        p = q + 1;
      }
    } else if (a == "--no-raw") {
      o.raw = false;
    } else if (a == "--no-read") {
      o.read = false;
    } else if (a == "--no-loader") {
      o.loader = false;
    } else if (!a.empty() && a[0] != '-' && o.config.empty()) {
      o.config = a;
    } else {
      throw ConfigError(StrCat("unknown argument '", a, "'\n", kUsage));
    }
  }
  if (o.config.empty()) throw ConfigError(StrCat("CONFIG is required\n", kUsage));
  return o;
}

// The first `n` records' JPEG payloads, copied out of the LMDB.
std::vector<std::string> ReadJpegs(const std::string& path, int64_t n) {
  LmdbReader reader(path);
  n = std::min(n, reader.size());
  std::vector<std::string> jpegs;
  jpegs.reserve(static_cast<size_t>(n));
  RecordView r;
  for (int64_t i = 0; i < n; ++i) {
    const RecordStatus s = DecodeRecord(reader.Get(i), &r);
    if (!s.ok()) throw Error(StrCat(path, ": record ", reader.Key(i), ": ", s.message()));
    if (r.encoding != RecordEncoding::kJpeg) {
      throw Error(StrCat(path, ": record ", reader.Key(i), " is ", RecordEncodingName(r.encoding),
                         ", not JPEG (convert with --encoded)"));
    }
    jpegs.emplace_back(reinterpret_cast<const char*>(r.data), r.size);
  }
  return jpegs;
}

// TurboJPEG only: header + decode to packed RGB, per image, into a reused
// buffer. Decodes jpegs[first], jpegs[first + stride], ...; returns the
// pixels decoded. Throws Error naming the record on failure.
// With `floats` ([C, H, W], C 1 or 3, no larger than the images), each
// image's top-left H x W also goes as floats v / 255, CHW, into the next
// row of a batch of 128 such rows: what any float loader must write, a
// batch that leaves the caches at 224x224 (the loader's floor beside the
// decode, which reuses one small buffer).
double DecodeStripe(const std::vector<std::string>& jpegs, size_t first, size_t stride,
                    const Shape* floats = nullptr) {
  std::vector<float> batch(floats != nullptr ? 128 * static_cast<size_t>(floats->numel()) : 0);
  size_t row = 0;
  tjhandle tj = tjInitDecompress();
  if (tj == nullptr) throw Error(StrCat("tjInitDecompress: ", tjGetErrorStr2(nullptr)));
  std::vector<unsigned char> rgb;
  double pixels = 0;
  for (size_t i = first; i < jpegs.size(); i += stride) {
    const auto* data = reinterpret_cast<const unsigned char*>(jpegs[i].data());
    const auto size = static_cast<unsigned long>(jpegs[i].size());
    int w = 0, h = 0, subsamp = 0, colorspace = 0;
    bool ok = tjDecompressHeader3(tj, data, size, &w, &h, &subsamp, &colorspace) == 0;
    if (ok) {
      rgb.resize(static_cast<size_t>(w) * h * 3);
      ok = tjDecompress2(tj, data, size, rgb.data(), w, 0, h, TJPF_RGB, 0) == 0;
    }
    if (!ok) {
      const std::string msg = tjGetErrorStr2(tj);
      tjDestroy(tj);
      throw Error(StrCat("TurboJPEG failed on record ", i, ": ", msg));
    }
    pixels += static_cast<double>(w) * h;
    if (floats != nullptr) {
      const int64_t c = (*floats)[0], fh = std::min<int64_t>((*floats)[1], h),
                    fw = std::min<int64_t>((*floats)[2], w);
      float* out = batch.data() + (row++ % 128) * floats->numel();
      for (int64_t ch = 0; ch < c; ++ch) {
        for (int64_t y = 0; y < fh; ++y) {
          const unsigned char* px = rgb.data() + (y * w) * 3 + ch;
          float* o = out + (ch * (*floats)[1] + y) * (*floats)[2];
          for (int64_t x = 0; x < fw; ++x) o[x] = px[3 * x] / 255.f;
        }
      }
    }
  }
  tjDestroy(tj);
  return pixels;
}

// Rates of repeated passes: images/s and CPU cores per pass.
struct Passes {
  std::vector<double> rates, cores;
  void Add(double images, double seconds, double cpu) {
    rates.push_back(images / seconds);
    cores.push_back(cpu / seconds);
  }
  double median() const { return Median(rates); }
  double best() const { return *std::max_element(rates.begin(), rates.end()); }
};

// The limit, one pass: `threads` std::threads (own handle each, disjoint
// stripes), no cnnflow code. Returns the pixels decoded.
double RawPass(const std::vector<std::string>& jpegs, int threads, Passes* passes,
               const Shape* floats = nullptr) {
  const auto t0 = Clock::now();
  const double cpu0 = CpuSeconds();
  std::vector<double> px(static_cast<size_t>(threads));
  std::vector<std::exception_ptr> failed(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      try {
        px[t] = DecodeStripe(jpegs, static_cast<size_t>(t), static_cast<size_t>(threads), floats);
      } catch (...) {
        failed[t] = std::current_exception();
      }
    });
  }
  for (auto& th : pool) th.join();
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);
  if (passes != nullptr) {
    passes->Add(static_cast<double>(jpegs.size()), SecondsSince(t0), CpuSeconds() - cpu0);
  }
  double pixels = 0;
  for (double p : px) pixels += p;
  return pixels;
}

// cnnflow's per-sample path without the graph, one pass on this thread:
// Dataset::Read (decode + augment) and the normalisation, into one buffer.
void ReadPass(Trainer& trainer, int64_t records, int64_t epoch, Passes* passes) {
  const Dataset& data = trainer.context().dataset("train");
  const Shape shape = data.sample_shape();
  const int64_t n = std::min(records, data.size());
  std::vector<float> sample(static_cast<size_t>(shape.numel()));
  const ReadContext ctx{trainer.config().seed, epoch, true};
  const auto t0 = Clock::now();
  const double cpu0 = CpuSeconds();
  for (int64_t i = 0; i < n; ++i) {
    const ReadResult r = data.Read(i, ctx, sample.data());
    if (!r.ok()) throw Error(StrCat("record ", data.Key(i), ": ", r.error));
    if (!data.normalizes()) trainer.context().transform.Apply(sample.data(), shape);
  }
  if (passes != nullptr) passes->Add(static_cast<double>(n), SecondsSince(t0), CpuSeconds() - cpu0);
}

// Raw decode with 1 and 2 threads and cnnflow's read, alternating in each
// of --reps rounds after one untimed warm-up round, so load changes on a
// shared machine hit all three alike.
void SinglePasses(const std::vector<std::string>& jpegs, Trainer* trainer, const Options& o) {
  Passes raw1, raw2, float1, float2, read;
  double pixels = 0, bytes = 0;
  for (const auto& j : jpegs) bytes += static_cast<double>(j.size());
  // The float rows write the config's sample shape (known with a trainer).
  const Shape sample =
      trainer != nullptr ? trainer->context().dataset("train").sample_shape() : Shape{};
  const bool floats = o.raw && trainer != nullptr && sample.rank() == 3;
  for (int rep = 0; rep < o.reps + 1; ++rep) {
    const bool timed = rep > 0;
    if (o.raw) {
      pixels = RawPass(jpegs, 1, timed ? &raw1 : nullptr);
      RawPass(jpegs, 2, timed ? &raw2 : nullptr);
    }
    if (floats) {
      RawPass(jpegs, 1, timed ? &float1 : nullptr, &sample);
      RawPass(jpegs, 2, timed ? &float2 : nullptr, &sample);
    }
    if (trainer != nullptr) ReadPass(*trainer, o.records, rep, timed ? &read : nullptr);
  }
  if (o.raw) {
    const double n = static_cast<double>(jpegs.size());
    for (const auto& [threads, p] : {std::pair<int, const Passes*>{1, &raw1}, {2, &raw2}}) {
      std::printf(
          "raw_turbojpeg threads=%d images_per_s=%.0f best=%.0f cpu_cores=%.2f records=%zu "
          "mean_bytes=%.0f mean_pixels=%.0f megapixels_per_s=%.1f runs=%s\n",
          threads, p->median(), p->best(), Median(p->cores), jpegs.size(), bytes / n, pixels / n,
          p->median() * pixels / n / 1e6, Join(p->rates).c_str());
    }
  }
  if (floats) {
    for (const auto& [threads, p] : {std::pair<int, const Passes*>{1, &float1}, {2, &float2}}) {
      std::printf(
          "raw_turbojpeg_floats threads=%d images_per_s=%.0f best=%.0f cpu_cores=%.2f "
          "shape=%s runs=%s\n",
          threads, p->median(), p->best(), Median(p->cores),
          StrCat(sample[0], "x", sample[1], "x", sample[2]).c_str(), Join(p->rates).c_str());
    }
  }
  if (trainer != nullptr) {
    std::printf("cnnflow_read images_per_s=%.0f best=%.0f cpu_cores=%.2f records=%lld runs=%s\n",
                read.median(), read.best(), Median(read.cores),
                static_cast<long long>(
                    std::min<int64_t>(o.records, trainer->context().dataset("train").size())),
                Join(read.rates).c_str());
  }
  std::fflush(stdout);
}

// The loader graph per thread count: --reps interleaved rounds of one
// TuneLoader call, so load changes hit every setting alike; the loader
// alone, and training end to end beside it.
void CnnflowLoader(Trainer& trainer, const Options& o) {
  const TuneReport report = TuneLoader(trainer, o.threads, {o.prefetch}, o.steps, o.reps);
  for (const TuneSetting& s : report.settings) {
    std::printf(
        "cnnflow_loader load_threads=%lld prefetch=%lld images_per_s=%.0f best=%.0f "
        "cpu_cores=%.2f steps=%lld batch=%lld runs=%s\n",
        static_cast<long long>(s.load_threads), static_cast<long long>(o.prefetch),
        s.loader_images_per_s, *std::max_element(s.loader_runs.begin(), s.loader_runs.end()),
        s.loader_alone_cores, static_cast<long long>(o.steps),
        static_cast<long long>(trainer.config().batch), Join(s.loader_runs).c_str());
    std::printf("cnnflow_train load_threads=%lld images_per_s=%.0f loader_cpu_cores=%.2f runs=%s\n",
                static_cast<long long>(s.load_threads), s.images_per_s, s.loader_cores,
                Join(s.train_runs).c_str());
  }
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  try {
    const Options o = ParseArgs(argc, argv);
    RunConfig config = LoadRunConfig(o.config, o.sets);
    auto train = config.data.find("train");
    if (train == config.data.end() || train->second.source != "lmdb") {
      throw ConfigError(StrCat(o.config, ": data.train must be an lmdb source"));
    }
    const std::string path = train->second.args.String("path");
    std::printf("config %s threads=%d batch=%lld lmdb=%s\n", o.config.c_str(), config.threads,
                static_cast<long long>(config.batch), path.c_str());
    const std::vector<std::string> jpegs =
        o.raw ? ReadJpegs(path, o.records) : std::vector<std::string>{};
    std::unique_ptr<Trainer> trainer;
    if (o.read || o.loader) trainer = std::make_unique<Trainer>(std::move(config));
    if (o.raw || o.read) SinglePasses(jpegs, o.read ? trainer.get() : nullptr, o);
    if (o.loader) CnnflowLoader(*trainer, o);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "loader_bench: %s\n", e.what());
    return 1;
  }
}

}  // namespace
}  // namespace cnnflow

int main(int argc, char** argv) { return cnnflow::Main(argc, argv); }
