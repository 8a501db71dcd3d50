#include "pipeline/checkpoint_control.h"

#include <map>
#include <optional>
#include <sstream>

#include "ops/io/weights_file.h"
#include "pipeline/checkpoint.h"
#include "pipeline/run_files.h"
#include "pipeline/yaml_util.h"

namespace cnnflow {

namespace {

// A pass's totals as a checkpoint's text field, and back.
std::string TotalsText(const PassMetrics& m) {
  std::ostringstream p;
  p.precision(17);
  p << m.loss_sum << " " << m.correct << " " << m.samples << " " << m.batches << " " << m.skipped
    << " " << m.seconds;
  return p.str();
}

PassMetrics ParseTotals(const std::string& text) {
  PassMetrics m;
  std::istringstream in(text);
  in >> m.loss_sum >> m.correct >> m.samples >> m.batches >> m.skipped >> m.seconds;
  return m;
}

// Every scalar or sequence of a YAML tree under its dotted key.
void Flatten(const YAML::Node& node, const std::string& key,
             std::map<std::string, std::string>& out) {
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string k = kv.first.as<std::string>();
      Flatten(kv.second, key.empty() ? k : key + "." + k, out);
    }
    return;
  }
  YAML::Emitter e;
  e << YAML::Flow << node;
  out[key] = e.c_str();
}

// "graph.logical_replicas is 8 there, 6 here" for the keys whose values
// differ between two runs' identities (the first few).
std::string DifferingKeys(const std::string& there, const std::string& here) {
  std::map<std::string, std::string> a, b;
  try {
    Flatten(YAML::Load(there), "", a);
    Flatten(YAML::Load(here), "", b);
  } catch (const YAML::Exception&) {
    return "";
  }
  std::vector<std::string> diffs;
  auto value = [](const std::map<std::string, std::string>& m, const std::string& k) {
    auto it = m.find(k);
    return it == m.end() ? std::string("unset") : it->second;
  };
  std::map<std::string, std::string> keys = a;
  keys.insert(b.begin(), b.end());
  for (const auto& [k, unused] : keys) {
    if (value(a, k) != value(b, k))
      diffs.push_back(StrCat(k, " is ", value(a, k), " there, ", value(b, k), " here"));
  }
  if (diffs.size() > 4) {
    const size_t more = diffs.size() - 3;
    diffs.resize(3);
    diffs.push_back(StrCat("and ", more, " more"));
  }
  std::string out;
  for (const std::string& d : diffs) out += (out.empty() ? "" : "; ") + d;
  return out;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> TrainedTensors::Exported() const {
  std::vector<std::pair<std::string, Tensor>> out = models[0]->StateTensors();
  if (ema) out.insert(out.end(), ema->tensors().begin(), ema->tensors().end());
  return out;
}

CheckpointControl::CheckpointControl(std::string identity, uint64_t seed, int keep)
    : identity_(std::move(identity)),
      config_hash_(ConfigHash(identity_)),
      seed_(seed),
      keep_(keep) {}

TrainPosition CheckpointControl::Resume(const std::string& run_dir, const TrainedTensors& tensors,
                                        const std::function<void(const std::string&)>& say) {
  std::vector<std::string> warnings;
  std::optional<LoadedCheckpoint> ck = FindLatestCheckpoint(run_dir, &warnings);
  for (const auto& w : warnings) say("resume: " + w);
  if (!ck) {
    throw Error(StrCat(run_dir, ": no valid checkpoint to resume from",
                       warnings.empty() ? "" : " (" + JoinNames(warnings) + ")"));
  }
  const CheckpointState& st = ck->state;
  if (st.config_hash != config_hash_) {
    auto it = st.extra.find("identity");
    const std::string changed =
        it == st.extra.end() ? std::string() : DifferingKeys(it->second, identity_);
    throw ConfigError(StrCat(
        ck->sidecar_path, ": was written by a different run",
        changed.empty() ? StrCat(" (hash ", st.config_hash, ", this one is ", config_hash_, ")")
                        : StrCat(": ", changed),
        "; resume with the same config and --set options (see ", run_dir,
        "/config.yaml; the layout, graph.devices, threads and the number of processes, may "
        "change)"));
  }
  for (Model* m : tensors.models) {
    CopyNamedTensors(ck->model_tensors, m->StateTensors(), ck->data_path);
  }
  if (tensors.ema) {
    auto it = st.extra.find("ema_updates");
    if (it == st.extra.end()) {
      throw Error(
          StrCat(ck->sidecar_path, ": has no weight average, but this graph has an ema node"));
    }
    tensors.ema->Load(ck->model_tensors, std::stoll(it->second), ck->data_path);
  }
  for (Optimizer* opt : tensors.optimizers) {
    opt->LoadStateTensors(ck->optimizer_tensors);
    opt->set_step_count(st.optimizer_step);
  }
  TrainPosition at;
  at.epoch = st.epoch;
  at.batch_in_epoch = st.batch_in_epoch;
  at.global_step = st.global_step;
  at.batches_done = std::stoll(st.extra.at("batches_done"));
  at.metrics_rows = st.metrics_rows;
  if (auto it = st.extra.find("partial_train"); it != st.extra.end()) {
    at.partial_train = ParseTotals(it->second);
  }
  if (auto it = st.extra.find("log_window"); it != st.extra.end()) at.log_window = it->second;
  run_dir_ = run_dir;
  checkpointed_step_ = st.global_step;
  say(StrCat("resuming ", ck->data_path, ": epoch ", st.epoch + 1, ", batch ", st.batch_in_epoch,
             ", step ", st.global_step));
  return at;
}

void CheckpointControl::Save(const std::string& run_dir, const TrainPosition& at,
                             const TrainedTensors& tensors) {
  CheckpointState st;
  st.epoch = at.epoch;
  st.batch_in_epoch = at.batch_in_epoch;
  st.global_step = at.global_step;
  st.optimizer_step = tensors.optimizers[0]->step_count();
  st.lr_step = at.global_step;
  st.seed = seed_;
  st.config_hash = config_hash_;
  st.extra["identity"] = identity_;
  st.extra["batches_done"] = std::to_string(at.batches_done);
  st.extra["partial_train"] = TotalsText(at.partial_train);
  st.extra["log_window"] = at.log_window;
  st.metrics_columns = RunFiles::MetricsColumns();
  st.metrics_rows = at.metrics_rows;
  std::vector<std::pair<std::string, Tensor>> optimizer_state;
  for (Optimizer* opt : tensors.optimizers) {
    for (auto& t : opt->StateTensors()) optimizer_state.push_back(t);
    if (tensors.optimizers_identical) break;
  }
  if (tensors.ema) st.extra["ema_updates"] = std::to_string(tensors.ema->updates());
  // A failed write (a full disk) leaves the earlier ones as they were
  // (pipeline/checkpoint.h).
  Guard([&] { WriteCheckpoint(run_dir, st, tensors.Exported(), optimizer_state, keep_); });
  run_dir_ = run_dir;
  checkpointed_step_ = at.global_step;
}

std::string CheckpointControl::ResumeAdvice() const {
  if (checkpointed_step_ < 0) return "no checkpoint had been written yet: the run must start again";
  return StrCat("the checkpoints written before it are intact: --resume ", run_dir_,
                " continues from the newest (step ", checkpointed_step_, ")");
}

void CheckpointControl::Guard(const std::function<void()>& write) const {
  try {
    write();
  } catch (const Error& e) {
    throw Error(StrCat(e.what(), "; ", ResumeAdvice()));
  }
}

std::string InitFromWeights(const std::string& weights, bool strict,
                            const std::vector<std::string>& skip,
                            const std::vector<Model*>& models) {
  StateDictRules rules;
  rules.strict = strict;
  rules.skip = skip;
  const SafetensorsFile file = LoadWeightsFile(weights);
  const StateDictMatch m = MatchStateDict(file.tensors, models[0]->StateTensors(), rules);
  std::string report;
  if (!m.mismatches.empty()) {
    if (strict) {
      throw ConfigError(StrCat("train.init: ", weights,
                               " does not fit the model (strict: true; "
                               "strict: false loads what fits, skip: [glob] leaves tensors "
                               "at their fresh initialisation):",
                               ListMismatches(m)));
    }
    report =
        StrCat("train.init: ", weights, ": ", m.mismatches.size(),
               " tensors left at their fresh initialisation or ignored:", ListMismatches(m), "\n");
  }
  CopyStateDict(m, models, weights);  // what fits, into every replica and pipeline stage
  return report + StrCat("train.init: ", m.tensors.size(), " tensors from ", weights);
}

}  // namespace cnnflow
