// Parse / write speed of a safetensors header of 1000 tensors: cnnflow's
// hand-written JSON (ops/io/json.cc) against nlohmann-json 3.11.2; and
// CRC-32 of 64 MB: cnnflow's slicing-by-8 table against zlib's crc32.
// Median of 15 runs each (9 for the CRC). The "ours" CRC is the table
// ops/io/safetensors.cc carried until zlib replaced it, taken from git; the
// JSON is ops/io/json.cc as it is. Not part of the build (needs Debian's
// nlohmann-json3-dev); run by hand from the repository root:
// clang-format off
//   git show e0fbbf3:ops/io/safetensors.cc | awk '/^\/\/ -+ CRC-32/{f=1} /^SafetensorsWritten FileSizeAndCrc32/{f=0} f' > /tmp/crc_old.inc
//   g++ -std=c++20 -O2 -I. -I/tmp bench/io_libraries_bench.cc ops/io/json.cc -o /tmp/io_bench -lz && /tmp/io_bench
// clang-format on
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "ops/io/json.h"
namespace cnnflow {
#include "crc_old.inc"
}
using namespace cnnflow;
template <class F>
double MedianMs(F f, int reps = 15) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// The median over `reps` runs of 20 calls of f, per call.
template <class F>
double PerCallMs(F f, int reps = 15) {
  return MedianMs(
             [&] {
               for (int k = 0; k < 20; ++k) f();
             },
             reps) /
         20;
}

// "model name, ISA" of this CPU, from /proc/cpuinfo (the bench is built
// outside the project, without its ISA probe).
std::string CpuAndIsa() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, model = "?", isa = "no avx2";
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0 && model == "?") model = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0) {
      isa = line.find(" avx512f") != std::string::npos ? "avx512"
            : line.find(" avx2") != std::string::npos  ? "avx2"
                                                       : isa;
    }
  }
  return model + ", ISA " + isa;
}

struct CountSax : nlohmann::json_sax<nlohmann::json> {
  size_t n = 0;
  bool null() override { return ++n; }
  bool boolean(bool) override { return ++n; }
  bool number_integer(number_integer_t) override { return ++n; }
  bool number_unsigned(number_unsigned_t) override { return ++n; }
  bool number_float(number_float_t, const string_t&) override { return ++n; }
  bool string(string_t&) override { return ++n; }
  bool binary(binary_t&) override { return ++n; }
  bool start_object(std::size_t) override { return ++n; }
  bool key(string_t&) override { return ++n; }
  bool end_object() override { return ++n; }
  bool start_array(std::size_t) override { return ++n; }
  bool end_array() override { return ++n; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};
int main() {
  Json h = Json::Object();
  int64_t off = 0;
  for (int i = 0; i < 1000; ++i) {
    Json t = Json::Object();
    t.Set("dtype", Json::String("F32"));
    Json shape = Json::Array();
    shape.Append(Json::Int(256));
    shape.Append(Json::Int(128));
    shape.Append(Json::Int(3));
    shape.Append(Json::Int(3));
    t.Set("shape", shape);
    Json offs = Json::Array();
    offs.Append(Json::Int(off));
    off += 256 * 128 * 9 * 4;
    offs.Append(Json::Int(off));
    t.Set("data_offsets", offs);
    h.Set("layer" + std::to_string(i) + ".conv.weight", t);
  }
  Json meta = Json::Object();
  meta.Set("format", Json::String("pt"));
  h.Set("__metadata__", meta);
  const std::string text = WriteJson(h);
  std::printf("cpu %s; header: %zu bytes, 1000 tensors\n", CpuAndIsa().c_str(), text.size());
  size_t sink = 0;
  const double ours_parse = PerCallMs([&] { sink += ParseJson(text).size(); });
  const double ours_write = PerCallMs([&] { sink += WriteJson(h).size(); });
  nlohmann::ordered_json nj;
  const double nl_parse = PerCallMs([&] {
    nj = nlohmann::ordered_json::parse(text);
    sink += nj.size();
  });
  const double nl_write = PerCallMs([&] { sink += nj.dump().size(); });
  const double sax_parse = PerCallMs([&] {
    CountSax c;
    nlohmann::json::sax_parse(text, &c);
    sink += c.n;
  });
  std::printf("nlohmann SAX tokenizer alone (no tree): %.3f ms\n", sax_parse);
  nlohmann::json uj = nlohmann::json::parse(text);
  const double nlu_parse = PerCallMs([&] {
    uj = nlohmann::json::parse(text);
    sink += uj.size();
  });
  std::printf("parse: ours %.3f ms, nlohmann ordered_json %.3f ms (%.2fx), nlohmann json %.3f ms\n",
              ours_parse, nl_parse, nl_parse / ours_parse, nlu_parse);
  std::printf("write: ours %.3f ms, nlohmann ordered_json dump %.3f ms (%.2fx)\n", ours_write,
              nl_write, nl_write / ours_write);
  std::vector<unsigned char> buf(64 << 20);
  for (size_t i = 0; i < buf.size(); ++i)
    buf[i] = static_cast<unsigned char>(i * 2654435761u >> 13);
  uint32_t a = 0, b = 0;
  const double ours_crc = MedianMs([&] { a = Crc32(buf.data(), buf.size(), 0); }, 9);
  const double z_crc = MedianMs(
      [&] { b = static_cast<uint32_t>(crc32(0L, buf.data(), static_cast<uInt>(buf.size()))); }, 9);
  std::printf("crc32 of 64 MB: ours %.1f ms (%.2f GB/s), zlib %s %.1f ms (%.2f GB/s), equal %d\n",
              ours_crc, buf.size() / ours_crc / 1e6, zlibVersion(), z_crc, buf.size() / z_crc / 1e6,
              a == b);
  return sink == 0;
}
