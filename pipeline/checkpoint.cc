#include "pipeline/checkpoint.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "ops/error.h"
#include "ops/io/file_write.h"
#include "ops/io/json.h"
#include "ops/io/safetensors.h"

namespace cnnflow {

namespace fs = std::filesystem;

namespace {

constexpr char kFormat[] = "cnnflow-checkpoint";
constexpr int64_t kVersion = 1;
constexpr char kDataExt[] = ".safetensors";
constexpr char kSidecarExt[] = ".json";
constexpr uintmax_t kMaxSidecarBytes = 64 << 20;

// ------------------------------------------------------------------ names

// A file of the checkpoint directory, by its name.
struct Entry {
  enum class Type { kData, kSidecar, kTemp };
  Type type;
  int64_t step;
  long pid = 0;  // kTemp: the writer's process id
};

bool ParseDigits(const std::string& s, int64_t* out) {
  if (s.empty() || s.size() > 18) return false;
  int64_t x = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
    x = x * 10 + (c - '0');
  }
  *out = x;
  return true;
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// step-<digits>.safetensors | step-<digits>.json, each optionally followed
// by .tmp.<pid> (SaveSafetensors' and our temp names).
std::optional<Entry> ParseName(std::string name) {
  if (name.rfind("step-", 0) != 0) return std::nullopt;
  Entry e{Entry::Type::kData, 0};
  const size_t tmp = name.find(".tmp.");
  if (tmp != std::string::npos) {
    int64_t pid;
    if (!ParseDigits(name.substr(tmp + 5), &pid)) return std::nullopt;
    e.type = Entry::Type::kTemp;
    e.pid = static_cast<long>(pid);
    name.resize(tmp);
  }
  std::string stem;
  if (EndsWith(name, kDataExt)) {
    stem = name.substr(0, name.size() - std::strlen(kDataExt));
    if (e.type != Entry::Type::kTemp) e.type = Entry::Type::kData;
  } else if (EndsWith(name, kSidecarExt)) {
    stem = name.substr(0, name.size() - std::strlen(kSidecarExt));
    if (e.type != Entry::Type::kTemp) e.type = Entry::Type::kSidecar;
  } else {
    return std::nullopt;
  }
  if (!ParseDigits(stem.substr(5), &e.step)) return std::nullopt;
  return e;
}

struct StepFiles {
  bool data = false;
  bool sidecar = false;
};

struct Listing {
  std::map<int64_t, StepFiles> steps;
  std::vector<std::pair<std::string, Entry>> temps;  // file name, entry
};

Listing ListDir(const fs::path& dir) {
  Listing out;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const std::optional<Entry> e = ParseName(name);
    if (!e) continue;
    switch (e->type) {
      case Entry::Type::kData:
        out.steps[e->step].data = true;
        break;
      case Entry::Type::kSidecar:
        out.steps[e->step].sidecar = true;
        break;
      case Entry::Type::kTemp:
        out.temps.emplace_back(name, *e);
        break;
    }
  }
  if (ec)
    throw Error(StrCat("cannot list checkpoint directory '", dir.string(), "': ", ec.message()));
  return out;
}

// ------------------------------------------------------------------ files

void RemoveFile(const fs::path& p) {
  std::error_code ec;
  fs::remove(p, ec);  // best effort: a file that will not go is skipped on load anyway
}

// Removes a checkpoint, sidecar first: a half-removed one has no sidecar
// and is therefore invalid, never half-valid.
void RemoveCheckpoint(const fs::path& dir, int64_t step) {
  RemoveFile(dir / (CheckpointName(step) + kSidecarExt));
  RemoveFile(dir / (CheckpointName(step) + kDataExt));
}

bool ProcessGone(long pid) { return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

// ------------------------------------------------------------------ sidecar

std::string Hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

// A metrics value: a JSON number, or a string for what JSON cannot hold.
Json MetricToJson(double v) {
  if (std::isnan(v)) return Json::String("NaN");
  if (std::isinf(v)) return Json::String(v > 0 ? "Infinity" : "-Infinity");
  return Json::Number(v);
}

double MetricFromJson(const Json& v) {
  if (v.is_string()) {
    if (v.AsString() == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (v.AsString() == "Infinity") return std::numeric_limits<double>::infinity();
    if (v.AsString() == "-Infinity") return -std::numeric_limits<double>::infinity();
    throw Error(StrCat("expected a number, \"NaN\", \"Infinity\" or \"-Infinity\", got \"",
                       v.AsString(), "\""));
  }
  return v.AsDouble();
}

Json SidecarJson(const CheckpointState& s, const std::string& data_file,
                 const SafetensorsWritten& written, size_t model_count, size_t optimizer_count) {
  Json j = Json::Object();
  j.Set("format", Json::String(kFormat));
  j.Set("version", Json::Int(kVersion));
  j.Set("data_file", Json::String(data_file));
  j.Set("data_bytes", Json::Uint(written.bytes));
  j.Set("data_crc32", Json::String(Hex32(written.crc32)));
  j.Set("model_tensors", Json::Uint(model_count));
  j.Set("optimizer_tensors", Json::Uint(optimizer_count));
  j.Set("optimizer_prefix", Json::String(kOptimizerTensorPrefix));
  j.Set("epoch", Json::Int(s.epoch));
  j.Set("batch_in_epoch", Json::Int(s.batch_in_epoch));
  j.Set("global_step", Json::Int(s.global_step));
  j.Set("optimizer_step", Json::Int(s.optimizer_step));
  j.Set("lr_step", Json::Int(s.lr_step));
  j.Set("seed", Json::Uint(s.seed));
  j.Set("config_hash", Json::String(s.config_hash));
  Json& extra = j.Set("extra", Json::Object());
  for (const auto& [k, v] : s.extra) extra.Set(k, Json::String(v));
  Json& metrics = j.Set("metrics", Json::Object());
  Json& columns = metrics.Set("columns", Json::Array());
  for (const std::string& c : s.metrics_columns) columns.Append(Json::String(c));
  Json& rows = metrics.Set("rows", Json::Array());
  for (const auto& row : s.metrics_rows) {
    Json& r = rows.Append(Json::Array());
    for (const double v : row) r.Append(MetricToJson(v));
  }
  return j;
}

// Reads `key` of the sidecar through `get`, naming the key in errors.
template <typename Get>
auto Field(const Json& j, const char* key, Get get) {
  try {
    return get(j.At(key));
  } catch (const Error& e) {
    throw Error(StrCat("key \"", key, "\": ", e.what()));
  }
}

int64_t NonNegative(const Json& j, const char* key) {
  const int64_t v = Field(j, key, [](const Json& x) { return x.AsInt64(); });
  if (v < 0) throw Error(StrCat("key \"", key, "\": ", v, " is negative"));
  return v;
}

std::string ReadSmallFile(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = fs::file_size(path, ec);
  if (ec) throw Error(StrCat("cannot read '", path, "': ", ec.message()));
  if (size > kMaxSidecarBytes) {
    throw Error(StrCat("'", path, "' is ", size, " bytes, more than a sidecar can be"));
  }
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  if (!in && !in.eof()) throw Error(StrCat("cannot read '", path, "'"));
  return os.str();
}

}  // namespace

// ------------------------------------------------------------------ public

std::string CheckpointDir(const std::string& run_dir) {
  return (fs::path(run_dir) / "checkpoints").string();
}

std::string CheckpointName(int64_t global_step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%09lld", static_cast<long long>(global_step));
  return buf;
}

std::string ConfigHash(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a 64 offset basis and prime
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ULL;
  }
  char buf[20];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

std::string WriteCheckpoint(const std::string& run_dir, const CheckpointState& state,
                            const std::vector<std::pair<std::string, Tensor>>& model_tensors,
                            const std::vector<std::pair<std::string, Tensor>>& optimizer_tensors,
                            int keep_last) {
  const fs::path dir = CheckpointDir(run_dir);
  const std::string name = CheckpointName(state.global_step);
  const std::string where = StrCat("checkpoint '", (dir / name).string(), "': ");
  if (state.global_step < 0 || state.epoch < 0 || state.batch_in_epoch < 0) {
    throw Error(StrCat(where, "negative counters (global_step ", state.global_step, ", epoch ",
                       state.epoch, ", batch_in_epoch ", state.batch_in_epoch, ")"));
  }
  for (size_t i = 0; i < state.metrics_rows.size(); ++i) {
    if (state.metrics_rows[i].size() != state.metrics_columns.size()) {
      throw Error(StrCat(where, "metrics row ", i, " has ", state.metrics_rows[i].size(),
                         " values for ", state.metrics_columns.size(), " columns"));
    }
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error(StrCat(where, "cannot create '", dir.string(), "': ", ec.message()));

  const fs::path data = dir / (name + kDataExt);
  const fs::path sidecar = dir / (name + kSidecarExt);
  // Rewriting a step: its old sidecar would not match the new data.
  if (fs::exists(sidecar, ec)) {
    if (!fs::remove(sidecar, ec) || ec) {
      throw Error(StrCat(where, "cannot remove the old sidecar: ", ec.message()));
    }
  }

  std::vector<std::pair<std::string, Tensor>> all = model_tensors;
  all.reserve(model_tensors.size() + optimizer_tensors.size());
  for (const auto& [n, t] : optimizer_tensors) all.emplace_back(kOptimizerTensorPrefix + n, t);
  SafetensorsWritten written;
  try {
    SaveSafetensors(data.string(), all,
                    {{"format", "pt"},
                     {"cnnflow.global_step", std::to_string(state.global_step)},
                     {"cnnflow.sidecar", name + kSidecarExt}},
                    &written);
  } catch (const Error& e) {
    throw Error(StrCat(where, e.what()));
  }
  const Json j =
      SidecarJson(state, name + kDataExt, written, model_tensors.size(), optimizer_tensors.size());
  try {
    WriteFileAtomically(sidecar.string(), WriteJson(j, 2) + "\n");
  } catch (const Error& e) {
    throw Error(StrCat(where, e.what()));
  }

  // Tidy up. Complete = sidecar parses and the data file has its size (the
  // CRC is left to load time: reading every file back here costs too much).
  const Listing listing = ListDir(dir);
  int kept = 1;  // this one
  for (auto it = listing.steps.rbegin(); it != listing.steps.rend(); ++it) {
    const int64_t step = it->first;
    if (step == state.global_step) continue;
    if (step > state.global_step) {
      RemoveCheckpoint(dir, step);
      continue;
    }
    bool complete = false;
    if (it->second.data && it->second.sidecar) {
      try {
        const Json s =
            ParseJson(ReadSmallFile((dir / (CheckpointName(step) + kSidecarExt)).string()));
        complete =
            s.At("data_bytes").AsUint64() == fs::file_size(dir / (CheckpointName(step) + kDataExt));
      } catch (const std::exception&) {
        complete = false;
      }
    }
    if (complete && (keep_last <= 0 || kept < keep_last)) {
      ++kept;
    } else {
      RemoveCheckpoint(dir, step);
    }
  }
  for (const auto& [file, e] : listing.temps) {
    if (e.pid != static_cast<long>(::getpid()) && ProcessGone(e.pid)) RemoveFile(dir / file);
  }
  return data.string();
}

namespace {

// What a sidecar says of its data file, and the run's state it records.
struct Sidecar {
  std::string data_file;
  uint64_t data_bytes = 0;
  std::string crc;
  size_t model_count = 0, optimizer_count = 0;
  std::string optimizer_prefix;
  CheckpointState state;
};

// The metrics.csv rows a sidecar carries, each as long as its columns.
void ReadMetrics(const Json& metrics, CheckpointState& s) {
  for (const Json& c : Field(metrics, "columns", [](const Json& x) { return x.items(); })) {
    s.metrics_columns.push_back(c.AsString());
  }
  const auto rows = Field(metrics, "rows", [](const Json& x) { return x.items(); });
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<double> row;
    for (const Json& v : rows[r].items()) row.push_back(MetricFromJson(v));
    if (row.size() != s.metrics_columns.size()) {
      throw Error(StrCat("metrics row ", r, " has ", row.size(), " values for ",
                         s.metrics_columns.size(), " columns"));
    }
    s.metrics_rows.push_back(std::move(row));
  }
}

// Every key of a sidecar, checked (an Error names the key).
Sidecar ParseSidecar(const Json& j) {
  if (!j.is_object()) throw Error(StrCat("expected an object, got ", JsonKindName(j.kind())));
  const std::string format = Field(j, "format", [](const Json& x) { return x.AsString(); });
  if (format != kFormat) {
    throw Error(StrCat("key \"format\" is \"", format, "\", expected \"", kFormat, "\""));
  }
  const int64_t version = Field(j, "version", [](const Json& x) { return x.AsInt64(); });
  if (version != kVersion) {
    throw Error(StrCat("version ", version, " (this cnnflow reads version ", kVersion, ")"));
  }
  Sidecar out;
  out.data_file = Field(j, "data_file", [](const Json& x) { return x.AsString(); });
  if (out.data_file.empty() || out.data_file.find('/') != std::string::npos) {
    throw Error(StrCat("key \"data_file\": \"", out.data_file, "\" is not a file name"));
  }
  out.data_bytes = Field(j, "data_bytes", [](const Json& x) { return x.AsUint64(); });
  out.crc = Field(j, "data_crc32", [](const Json& x) { return x.AsString(); });
  out.model_count = Field(j, "model_tensors", [](const Json& x) { return x.AsUint64(); });
  out.optimizer_count = Field(j, "optimizer_tensors", [](const Json& x) { return x.AsUint64(); });
  out.optimizer_prefix = Field(j, "optimizer_prefix", [](const Json& x) { return x.AsString(); });

  CheckpointState& s = out.state;
  s.epoch = NonNegative(j, "epoch");
  s.batch_in_epoch = NonNegative(j, "batch_in_epoch");
  s.global_step = NonNegative(j, "global_step");
  s.optimizer_step = NonNegative(j, "optimizer_step");
  s.lr_step = NonNegative(j, "lr_step");
  s.seed = Field(j, "seed", [](const Json& x) { return x.AsUint64(); });
  s.config_hash = Field(j, "config_hash", [](const Json& x) { return x.AsString(); });
  for (const auto& [k, v] : j.At("extra").members()) {
    try {
      s.extra[k] = v.AsString();
    } catch (const Error& e) {
      throw Error(StrCat("key \"extra\".\"", k, "\": ", e.what()));
    }
  }
  ReadMetrics(j.At("metrics"), s);
  return out;
}

}  // namespace

LoadedCheckpoint LoadCheckpoint(const std::string& sidecar_path) {
  Json j;
  try {
    j = ParseJson(ReadSmallFile(sidecar_path));
  } catch (const JsonError& e) {
    throw Error(StrCat("sidecar '", sidecar_path, "' is not valid JSON: ", e.what()));
  }
  Sidecar sidecar;
  try {
    sidecar = ParseSidecar(j);
  } catch (const Error& e) {
    throw Error(StrCat("sidecar '", sidecar_path, "': ", e.what()));
  }
  LoadedCheckpoint out;
  out.sidecar_path = sidecar_path;
  out.state = std::move(sidecar.state);
  out.data_path = (fs::path(sidecar_path).parent_path() / sidecar.data_file).string();

  // The data file: its size and CRC as the sidecar says, then its tensors.
  const std::string where = StrCat("data file '", out.data_path, "': ");
  std::error_code ec;
  const uintmax_t size = fs::file_size(out.data_path, ec);
  if (ec) throw Error(StrCat(where, "missing (", ec.message(), ")"));
  if (size != sidecar.data_bytes) {
    throw Error(StrCat("data file is ", size, " bytes, sidecar says ", sidecar.data_bytes, " (",
                       out.data_path, ")"));
  }
  const SafetensorsWritten actual = FileSizeAndCrc32(out.data_path);
  if (actual.bytes != sidecar.data_bytes || Hex32(actual.crc32) != sidecar.crc) {
    throw Error(StrCat("data file's CRC-32 is ", Hex32(actual.crc32), ", sidecar says ",
                       sidecar.crc, " (", out.data_path, ")"));
  }
  SafetensorsFile file = LoadSafetensors(out.data_path);
  const size_t models = sidecar.model_count;
  if (file.tensors.size() != models + sidecar.optimizer_count) {
    throw Error(StrCat(where, "holds ", file.tensors.size(), " tensors, sidecar says ", models,
                       " model + ", sidecar.optimizer_count, " optimizer"));
  }
  // Written model tensors first, then the optimizer's; the loader returns
  // them in data order, which is the written order.
  const std::string& prefix = sidecar.optimizer_prefix;
  for (size_t i = 0; i < file.tensors.size(); ++i) {
    auto& [n, t] = file.tensors[i];
    if (i < models) {
      out.model_tensors.emplace_back(std::move(n), std::move(t));
      continue;
    }
    if (n.rfind(prefix, 0) != 0) {
      throw Error(StrCat(where, "optimizer tensor '", n, "' lacks the prefix '", prefix, "'"));
    }
    out.optimizer_tensors.emplace_back(n.substr(prefix.size()), std::move(t));
  }
  return out;
}

std::optional<LoadedCheckpoint> FindLatestCheckpoint(const std::string& run_dir,
                                                     std::vector<std::string>* warnings) {
  const fs::path dir = CheckpointDir(run_dir);
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  const Listing listing = ListDir(dir);
  std::vector<std::string> notes;
  for (const auto& [file, e] : listing.temps) {
    notes.push_back(StrCat("ignored ", file, ": temporary file of a write that did not finish",
                           " (process ", e.pid,
                           ProcessGone(e.pid) ? ", gone)" : ", still running)"));
  }
  std::optional<LoadedCheckpoint> found;
  for (auto it = listing.steps.rbegin(); it != listing.steps.rend(); ++it) {
    const std::string name = CheckpointName(it->first);
    if (!it->second.sidecar) {
      notes.push_back(StrCat("skipped ", name, ": no sidecar ", name, kSidecarExt,
                             " (its write did not finish)"));
      continue;
    }
    try {
      found = LoadCheckpoint((dir / (name + kSidecarExt)).string());
    } catch (const Error& e) {
      notes.push_back(StrCat("skipped ", name, ": ", e.what()));
      continue;
    }
    if (found->state.global_step != it->first) {
      notes.push_back(
          StrCat("skipped ", name, ": its sidecar says global_step ", found->state.global_step));
      found.reset();
      continue;
    }
    break;
  }
  if (warnings) *warnings = notes;
  if (found) found->warnings = std::move(notes);
  return found;
}

}  // namespace cnnflow
