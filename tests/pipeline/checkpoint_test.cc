// Checkpoints (pipeline/checkpoint.h): round trips, pruning, damaged and torn checkpoints (a real
// writer process killed mid-write), and an independent reader (Python).
#include "pipeline/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <thread>

#include "ops/io/json.h"
#include "ops/io/safetensors.h"
#include "ops/random.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;
using testing::ReadBytes;
using testing::TestDir;
using testing::WriteBytes;
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

// A tensor of arbitrary bit patterns (NaN payloads and denormals
// included), so only a bitwise copy compares equal.
Tensor RandomBits(const Shape& shape, DType dtype, uint64_t seed) {
  Tensor t = Tensor::Empty(shape, dtype);
  Rng rng(seed);
  auto* p = static_cast<unsigned char*>(t.raw_data());
  for (size_t i = 0; i < t.nbytes(); i += 8) {
    const uint64_t v = rng.NextU64();
    std::memcpy(p + i, &v, std::min<size_t>(8, t.nbytes() - i));
  }
  return t;
}

bool BitwiseEqual(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

void ExpectSameTensors(const NamedTensors& got, const NamedTensors& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_TRUE(BitwiseEqual(got[i].second, want[i].second)) << want[i].first;
  }
}

CheckpointState SomeState(int64_t step) {
  CheckpointState s;
  s.epoch = step / 100;
  s.batch_in_epoch = step % 100;
  s.global_step = step;
  s.optimizer_step = step;
  s.lr_step = step;
  s.seed = 42;
  s.config_hash = ConfigHash("name: test\n");
  return s;
}

NamedTensors SmallModel(uint64_t seed) {
  return {{"conv1.weight", RandomBits({4, 1, 3, 3}, DType::kF32, seed)},
          {"conv1.bias", RandomBits({4}, DType::kF32, seed + 1)},
          {"fc.weight", RandomBits({10, 4}, DType::kF64, seed + 2)}};
}

NamedTensors SmallOptimizer(uint64_t seed) {
  return {{"conv1.weight.momentum_buffer", RandomBits({4, 1, 3, 3}, DType::kF32, seed + 10)},
          {"fc.weight.momentum_buffer", RandomBits({10, 4}, DType::kF64, seed + 11)}};
}

std::string Join(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

std::set<std::string> FileNames(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// A process id that no longer exists: a child that has exited and been
// reaped.
pid_t DeadPid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

// ------------------------------------------------------------------ hashes

TEST(Checkpoint, ConfigHashIsFnv1a64) {
  // Published FNV-1a 64-bit test vectors.
  EXPECT_EQ(ConfigHash(""), "cbf29ce484222325");
  EXPECT_EQ(ConfigHash("a"), "af63dc4c8601ec8c");
  EXPECT_EQ(ConfigHash("foobar"), "85944171f73967e8");
  EXPECT_NE(ConfigHash("lr: 0.1\n"), ConfigHash("lr: 0.2\n"));
}

TEST(Checkpoint, Crc32MatchesTheStandardCheckValueAndTheWrittenFile) {
  EXPECT_EQ(Crc32("123456789", 9), 0xCBF43926u);  // the CRC-32 check value
  EXPECT_EQ(Crc32("", 0), 0u);
  // Chunked == whole, at every split (exercises the 8-byte path and tail).
  const std::string text = "The quick brown fox jumps over the lazy dog";
  const uint32_t whole = Crc32(text.data(), text.size());
  EXPECT_EQ(whole, 0x414FA339u);  // the well-known value of this sentence
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    EXPECT_EQ(Crc32(text.data() + cut, text.size() - cut, Crc32(text.data(), cut)), whole) << cut;
  }
  // A byte-at-a-time reference (the textbook bitwise algorithm).
  uint32_t ref = 0xFFFFFFFFu;
  for (const unsigned char c : text) {
    ref ^= c;
    for (int k = 0; k < 8; ++k) ref = (ref & 1) ? 0xEDB88320u ^ (ref >> 1) : ref >> 1;
  }
  EXPECT_EQ(whole, ~ref);

  const std::string path = TestDir() + "/x.safetensors";
  SafetensorsWritten w;
  SaveSafetensors(path, SmallModel(1), {{"format", "pt"}}, &w);
  const std::string bytes = ReadBytes(path);
  EXPECT_EQ(w.bytes, bytes.size());
  EXPECT_EQ(w.crc32, Crc32(bytes.data(), bytes.size()));
  const SafetensorsWritten f = FileSizeAndCrc32(path);
  EXPECT_EQ(f.bytes, w.bytes);
  EXPECT_EQ(f.crc32, w.crc32);
}

// ------------------------------------------------------------------ round trip

TEST(Checkpoint, RoundTripIsBitwiseForStateAndTensors) {
  const std::string run = TestDir();
  CheckpointState s;
  s.epoch = 3;
  s.batch_in_epoch = 17;
  s.global_step = 1234567;
  s.optimizer_step = 1234560;
  s.lr_step = 1234567;
  s.seed = 18446744073709551557ULL;  // above INT64_MAX: must not go through a double
  s.config_hash = ConfigHash("whatever");
  s.extra = {{"note", "line\nbreak \"quoted\" \xc3\xa9"}, {"world_size", "2"}};
  s.metrics_columns = {"epoch", "train_loss", "test_accuracy", "lr"};
  s.metrics_rows = {{1, 0.1, 1.0 / 3.0, 1e-300}, {2, -0.0, 5e-324, 0.01}};
  const NamedTensors model = SmallModel(7);
  const NamedTensors opt = SmallOptimizer(7);

  const std::string data = WriteCheckpoint(run, s, model, opt, 3);
  EXPECT_EQ(data, CheckpointDir(run) + "/step-001234567.safetensors");
  EXPECT_EQ(FileNames(CheckpointDir(run)),
            (std::set<std::string>{"step-001234567.safetensors", "step-001234567.json"}));

  std::vector<std::string> warnings;
  const std::optional<LoadedCheckpoint> got = FindLatestCheckpoint(run, &warnings);
  ASSERT_TRUE(got.has_value());
  EXPECT_TRUE(warnings.empty()) << Join(warnings);
  EXPECT_EQ(got->state, s);
  // == on doubles treats -0.0 == 0.0: check the bits of the metrics too.
  for (size_t r = 0; r < s.metrics_rows.size(); ++r) {
    EXPECT_EQ(std::memcmp(got->state.metrics_rows[r].data(), s.metrics_rows[r].data(),
                          s.metrics_rows[r].size() * sizeof(double)),
              0)
        << "row " << r;
  }
  EXPECT_EQ(got->data_path, data);
  ExpectSameTensors(got->model_tensors, model);
  ExpectSameTensors(got->optimizer_tensors, opt);

  // Any safetensors reader sees the model under its own names and the
  // optimizer under the prefix.
  const SafetensorsFile file = LoadSafetensors(data);
  ASSERT_NE(file.Find("conv1.weight"), nullptr);
  ASSERT_NE(file.Find("optimizer.fc.weight.momentum_buffer"), nullptr);
  EXPECT_TRUE(BitwiseEqual(*file.Find("optimizer.fc.weight.momentum_buffer"), opt[1].second));
  EXPECT_EQ(file.metadata.at("format"), "pt");

  // Non-finite metrics survive (a diverged epoch is still recorded).
  s.global_step = 1234568;
  s.metrics_rows.push_back({3, std::nan(""), INFINITY, -INFINITY});
  WriteCheckpoint(run, s, model, {}, 3);
  const auto again = FindLatestCheckpoint(run);
  ASSERT_TRUE(again.has_value());
  const auto& last = again->state.metrics_rows.back();
  EXPECT_TRUE(std::isnan(last[1]));
  EXPECT_EQ(last[2], INFINITY);
  EXPECT_EQ(last[3], -INFINITY);
  EXPECT_TRUE(again->optimizer_tensors.empty());
}

TEST(Checkpoint, BadStateIsRejectedBeforeAnythingIsWritten) {
  const std::string run = TestDir();
  CheckpointState s = SomeState(10);
  s.metrics_columns = {"a", "b"};
  s.metrics_rows = {{1, 2}, {3}};
  try {
    WriteCheckpoint(run, s, SmallModel(1), {}, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("metrics row 1 has 1 values for 2 columns"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(CheckpointDir(run)));
  // Names that collide once the optimizer prefix is added.
  EXPECT_THROW(WriteCheckpoint(run, SomeState(10), {{"optimizer.x", Tensor::Zeros({1})}},
                               {{"x", Tensor::Zeros({1})}}, 2),
               Error);
  EXPECT_FALSE(FindLatestCheckpoint(run).has_value());
}

// ------------------------------------------------------------------ tidying

TEST(Checkpoint, KeepLastDeletesTheOldest) {
  const std::string run = TestDir();
  for (int64_t step : {100, 200, 300, 400, 500}) {
    WriteCheckpoint(run, SomeState(step), SmallModel(step), SmallOptimizer(step), 3);
  }
  EXPECT_EQ(FileNames(CheckpointDir(run)),
            (std::set<std::string>{"step-000000300.safetensors", "step-000000300.json",
                                   "step-000000400.safetensors", "step-000000400.json",
                                   "step-000000500.safetensors", "step-000000500.json"}));
  const auto got = FindLatestCheckpoint(run);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->state.global_step, 500);
  ExpectSameTensors(got->model_tensors, SmallModel(500));

  // keep_last 1 leaves only the newest; 0 keeps everything.
  WriteCheckpoint(run, SomeState(600), SmallModel(600), {}, 1);
  EXPECT_EQ(FileNames(CheckpointDir(run)),
            (std::set<std::string>{"step-000000600.safetensors", "step-000000600.json"}));
  for (int64_t step : {700, 800, 900}) WriteCheckpoint(run, SomeState(step), SmallModel(1), {}, 0);
  EXPECT_EQ(FileNames(CheckpointDir(run)).size(), 8u);
}

TEST(Checkpoint, WritingAnEarlierStepDropsTheAbandonedLaterOnes) {
  const std::string run = TestDir();
  for (int64_t step : {100, 200, 300})
    WriteCheckpoint(run, SomeState(step), SmallModel(step), {}, 5);
  // Resumed from 200 (say 300 was damaged), the run writes 250.
  WriteCheckpoint(run, SomeState(250), SmallModel(250), {}, 5);
  EXPECT_EQ(FileNames(CheckpointDir(run)),
            (std::set<std::string>{"step-000000100.safetensors", "step-000000100.json",
                                   "step-000000200.safetensors", "step-000000200.json",
                                   "step-000000250.safetensors", "step-000000250.json"}));
  // Rewriting the same step replaces it whole.
  CheckpointState s = SomeState(250);
  s.extra["rewritten"] = "yes";
  WriteCheckpoint(run, s, SmallModel(251), {}, 5);
  const auto got = FindLatestCheckpoint(run);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->state.extra.at("rewritten"), "yes");
  ExpectSameTensors(got->model_tensors, SmallModel(251));
}

TEST(Checkpoint, NoDirectoryOrNoValidCheckpointIsNullopt) {
  const std::string run = TestDir();
  EXPECT_FALSE(FindLatestCheckpoint(run).has_value());
  EXPECT_FALSE(FindLatestCheckpoint(run + "/does/not/exist").has_value());
  WriteCheckpoint(run, SomeState(100), SmallModel(1), {}, 2);
  fs::remove(CheckpointDir(run) + "/step-000000100.safetensors");
  std::vector<std::string> warnings;
  EXPECT_FALSE(FindLatestCheckpoint(run, &warnings).has_value());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("skipped step-000000100: data file"), std::string::npos)
      << warnings[0];
  EXPECT_NE(warnings[0].find("missing"), std::string::npos) << warnings[0];
}

// ------------------------------------------------------------------ damage

// Two good checkpoints (100, 200) and a damaged 300; the damage is applied
// by `damage(dir)`. FindLatestCheckpoint must return 200 and explain 300.
// `damage` returns what the warnings must contain.
void ExpectSkipped(const std::function<std::vector<std::string>(const std::string&)>& damage) {
  const std::string run = TestDir();
  const std::string dir = CheckpointDir(run);
  for (int64_t step : {100, 200, 300}) {
    WriteCheckpoint(run, SomeState(step), SmallModel(step), SmallOptimizer(step), 5);
  }
  const std::vector<std::string> expect_in_warning = damage(dir);
  std::vector<std::string> warnings;
  const auto got = FindLatestCheckpoint(run, &warnings);
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(got->state.global_step, 200);
  ExpectSameTensors(got->model_tensors, SmallModel(200));
  ExpectSameTensors(got->optimizer_tensors, SmallOptimizer(200));
  EXPECT_EQ(got->warnings, warnings);
  const std::string all = Join(warnings);
  for (const std::string& e : expect_in_warning) EXPECT_NE(all.find(e), std::string::npos) << all;

  // The next write tidies: the damaged 300 is a later step, a stray temp
  // file of a dead writer is garbage.
  WriteCheckpoint(run, SomeState(210), SmallModel(210), {}, 5);
  for (const std::string& name : FileNames(dir)) {
    EXPECT_EQ(name.find("step-000000300"), std::string::npos) << name;
    EXPECT_EQ(name.find(".tmp."), std::string::npos) << name;
  }
  const auto next = FindLatestCheckpoint(run, &warnings);
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->state.global_step, 210);
  EXPECT_TRUE(warnings.empty()) << Join(warnings);
}

TEST(Checkpoint, TruncatedDataFileIsSkipped) {
  ExpectSkipped([](const std::string& dir) -> std::vector<std::string> {
    const std::string path = dir + "/step-000000300.safetensors";
    const uintmax_t full = fs::file_size(path);
    fs::resize_file(path, full - 100);
    return {
        StrCat("skipped step-000000300: data file is ", full - 100, " bytes, sidecar says ", full)};
  });
}

TEST(Checkpoint, MissingSidecarIsSkipped) {
  ExpectSkipped([](const std::string& dir) -> std::vector<std::string> {
    fs::remove(dir + "/step-000000300.json");
    return {"skipped step-000000300: no sidecar step-000000300.json"};
  });
}

TEST(Checkpoint, ChecksumMismatchIsSkipped) {
  ExpectSkipped([](const std::string& dir) -> std::vector<std::string> {
    // Same size, one bit flipped in the tensor data.
    const std::string path = dir + "/step-000000300.safetensors";
    std::string bytes = ReadBytes(path);
    const uint32_t good = Crc32(bytes.data(), bytes.size());
    bytes[bytes.size() - 5] ^= 0x10;
    WriteBytes(path, bytes);
    char want[80];
    std::snprintf(want, sizeof want, "data file's CRC-32 is %08x, sidecar says %08x",
                  Crc32(bytes.data(), bytes.size()), good);
    return {"skipped step-000000300: ", want};
  });
}

TEST(Checkpoint, UnparsableSidecarIsSkipped) {
  ExpectSkipped([](const std::string& dir) -> std::vector<std::string> {
    const std::string path = dir + "/step-000000300.json";
    const std::string text = ReadBytes(path);
    WriteBytes(path, text.substr(0, text.size() / 2));
    return {"skipped step-000000300: sidecar '", "is not valid JSON: JSON at byte "};
  });
}

TEST(Checkpoint, SidecarWithAWrongFieldIsSkipped) {
  ExpectSkipped([](const std::string& dir) -> std::vector<std::string> {
    const std::string path = dir + "/step-000000300.json";
    Json j = ParseJson(ReadBytes(path));
    j.Set("epoch", Json::String("three"));
    WriteBytes(path, WriteJson(j, 2));
    return {"skipped step-000000300: sidecar '",
            "key \"epoch\": expected an integer, got a string"};
  });
}

TEST(Checkpoint, TempFileLeftBehindIsIgnored) {
  ExpectSkipped([](const std::string& dir) -> std::vector<std::string> {
    // A writer died before renaming: only its temp file exists.
    fs::remove(dir + "/step-000000300.json");
    const std::string data = ReadBytes(dir + "/step-000000300.safetensors");
    fs::remove(dir + "/step-000000300.safetensors");
    const std::string temp = StrCat("step-000000300.safetensors.tmp.", DeadPid());
    WriteBytes(dir + "/" + temp, data.substr(0, data.size() / 3));
    return {StrCat("ignored ", temp, ": temporary file of a write that did not finish")};
  });
}

// ------------------------------------------------------------------ torn

// A real writer process SIGKILLed in the middle of writing a large
// checkpoint, at several points: while the temp file grows, once it has its
// full size (flushing), and once the data file is renamed but the sidecar
// is not. FindLatestCheckpoint must then return the previous checkpoint,
// or the new one only if it completed, bit for bit; never a torn one.
TEST(Checkpoint, WriterKilledMidWriteIsNeverPickedUp) {
  const NamedTensors big = {{"w", RandomBits({6 << 20}, DType::kF32, 99)}};  // 24 MiB
  const NamedTensors big_opt = {{"w.momentum_buffer", RandomBits({1 << 20}, DType::kF32, 98)}};
  const uint64_t big_bytes = big[0].second.nbytes() + big_opt[0].second.nbytes();
  enum class Trigger { kQuarter, kThreeQuarters, kFullTemp, kDataRenamed, kSidecarTemp };
  const Trigger triggers[] = {Trigger::kQuarter, Trigger::kThreeQuarters, Trigger::kFullTemp,
                              Trigger::kDataRenamed, Trigger::kSidecarTemp};
  int torn = 0;
  for (const Trigger trigger : triggers) {
    SCOPED_TRACE(static_cast<int>(trigger));
    const std::string run = TestDir() + "/run" + std::to_string(static_cast<int>(trigger));
    const std::string dir = CheckpointDir(run);
    WriteCheckpoint(run, SomeState(100), SmallModel(100), SmallOptimizer(100), 3);

    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      try {
        WriteCheckpoint(run, SomeState(200), big, big_opt, 3);
      } catch (...) {
        ::_exit(1);
      }
      ::_exit(0);
    }
    const std::string temp = StrCat(dir, "/step-000000200.safetensors.tmp.", pid);
    const std::string data = dir + "/step-000000200.safetensors";
    const std::string sidecar_temp = StrCat(dir, "/step-000000200.json.tmp.", pid);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    bool fired = false;
    int status = 0;
    while (std::chrono::steady_clock::now() < deadline) {
      std::error_code ec;
      const uintmax_t size = fs::file_size(temp, ec);
      const bool has_temp = !ec;
      switch (trigger) {
        case Trigger::kQuarter:
          fired = has_temp && size >= big_bytes / 4;
          break;
        case Trigger::kThreeQuarters:
          fired = has_temp && size >= big_bytes * 3 / 4;
          break;
        case Trigger::kFullTemp:
          fired = has_temp && size >= big_bytes;
          break;
        case Trigger::kDataRenamed:
          fired = fs::exists(data, ec);
          break;
        case Trigger::kSidecarTemp:
          fired = fs::exists(sidecar_temp, ec);
          break;
      }
      if (fired || ::waitpid(pid, &status, WNOHANG) == pid) break;
    }
    ::kill(pid, SIGKILL);
    ::waitpid(pid, &status, 0);

    std::vector<std::string> warnings;
    const auto got = FindLatestCheckpoint(run, &warnings);
    ASSERT_TRUE(got.has_value()) << Join(warnings);
    if (fs::exists(dir + "/step-000000200.json")) {
      // The writer got to the end before the signal landed.
      EXPECT_EQ(got->state.global_step, 200);
      ExpectSameTensors(got->model_tensors, big);
      ExpectSameTensors(got->optimizer_tensors, big_opt);
    } else {
      ++torn;
      EXPECT_EQ(got->state.global_step, 100) << Join(warnings);
      ExpectSameTensors(got->model_tensors, SmallModel(100));
      EXPECT_FALSE(warnings.empty());
      // A later write clears what the dead writer left.
      WriteCheckpoint(run, SomeState(150), SmallModel(150), {}, 3);
      for (const std::string& name : FileNames(dir)) {
        EXPECT_EQ(name.find("step-000000200"), std::string::npos) << name;
      }
    }
  }
  // At least the growing-temp-file kills must have caught a torn write.
  EXPECT_GE(torn, 2);
}

// ------------------------------------------------------------------ Python

// Python's own json, struct and zlib modules read the checkpoint: the
// sidecar's size and CRC match the file, and the tensors are where the
// header says (torch, when installed, reads them too).
TEST(Checkpoint, PythonReadsTheCheckpoint) {
  if (!fs::exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  const std::string run = TestDir();
  Tensor w = Tensor::Empty({2, 3}, DType::kF32);
  for (int i = 0; i < 6; ++i) w.Set(i, -1.0 + 0.5 * i);
  Tensor b = Tensor::Empty({2}, DType::kF64);
  b.Set(0, 10.25);
  b.Set(1, -3.0);
  Tensor m = Tensor::Full({2}, 0.125, DType::kF64);
  CheckpointState s = SomeState(300);
  s.seed = 18446744073709551557ULL;
  s.metrics_columns = {"epoch", "loss"};
  s.metrics_rows = {{1, 0.1}};
  const std::string data = WriteCheckpoint(run, s, {{"fc.weight", w}, {"fc.bias", b}},
                                           {{"fc.bias.momentum_buffer", m}}, 2);
  const std::string sidecar = CheckpointDir(run) + "/step-000000300.json";
  const std::string script = run + "/read.py";
  std::ofstream(script) << R"PY(
import json, struct, sys, zlib
raw = open(sys.argv[1], 'rb').read()
side = json.load(open(sys.argv[2]))
assert side['data_bytes'] == len(raw), (side['data_bytes'], len(raw))
assert side['data_crc32'] == '%08x' % zlib.crc32(raw), (side['data_crc32'], zlib.crc32(raw))
n = struct.unpack('<Q', raw[:8])[0]
hdr = json.loads(raw[8:8 + n].decode('utf-8'))
meta = hdr.pop('__metadata__')
data = raw[8 + n:]
out = ['format ' + meta['format'], 'seed %d' % side['seed'], 'step %d' % side['global_step'],
       'metrics %r' % side['metrics']['rows']]
for name, info in hdr.items():
    b, e = info['data_offsets']
    fmt = {'F32': 'f', 'F64': 'd'}[info['dtype']]
    vals = struct.unpack('<%d%s' % ((e - b) // struct.calcsize(fmt), fmt), data[b:e])
    out.append('%s %s %s %s' % (name, info['dtype'], info['shape'], ' '.join(repr(v) for v in vals)))
print('\n'.join(out))
)PY";
  FILE* p =
      ::popen(("/usr/bin/python3 " + script + " " + data + " " + sidecar + " 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p)) output += buf;
  ASSERT_EQ(::pclose(p), 0) << output;
  EXPECT_NE(output.find("format pt\n"), std::string::npos) << output;
  EXPECT_NE(output.find("seed 18446744073709551557\n"), std::string::npos) << output;
  EXPECT_NE(output.find("step 300\n"), std::string::npos) << output;
  EXPECT_NE(output.find("metrics [[1, 0.1]]\n"), std::string::npos) << output;
  EXPECT_NE(output.find("fc.weight F32 [2, 3] -1.0 -0.5 0.0 0.5 1.0 1.5\n"), std::string::npos)
      << output;
  EXPECT_NE(output.find("fc.bias F64 [2] 10.25 -3.0\n"), std::string::npos) << output;
  EXPECT_NE(output.find("optimizer.fc.bias.momentum_buffer F64 [2] 0.125 0.125\n"),
            std::string::npos)
      << output;
}

}  // namespace
}  // namespace cnnflow
