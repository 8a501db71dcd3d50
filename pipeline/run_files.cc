#include "pipeline/run_files.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ops/io/file_write.h"
#include "ops/io/tf_events.h"

namespace cnnflow {

namespace fs = std::filesystem;

namespace {

// A row's test loss and accuracy when the run has no test set: written as
// empty fields, not as a loss and an accuracy of 0.
constexpr double kNoTest = -1;

std::string MetricsRow(const std::vector<double>& v) {
  char test[64] = ",";
  if (v[3] != kNoTest) std::snprintf(test, sizeof test, "%.6f,%.6f", v[3], v[4]);
  char row[320];
  std::snprintf(row, sizeof row, "%lld,%.6f,%.6f,%s,%.1f,%.3f,%.6g,%lld",
                static_cast<long long>(v[0]), v[1], v[2], test, v[5], v[6], v[7],
                static_cast<long long>(v[8]));
  return row;
}

// steps.csv: a field a row does not have is empty.
const std::vector<std::string> kStepsColumns = {
    "step",          "epoch", "train_loss",   "train_accuracy",  "test_loss",
    "test_accuracy", "lr",    "images_per_s", "data_wait_share", "allreduce_share"};

std::string JoinCsv(const std::vector<std::string>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + v[i];
  return s;
}

// A steps.csv row from scalars named "train/<column>" or "<column>".
std::string StepsRow(int64_t step, int64_t epoch,
                     const std::vector<std::pair<std::string, double>>& scalars) {
  std::vector<std::string> fields(kStepsColumns.size());
  fields[0] = std::to_string(step);
  fields[1] = std::to_string(epoch);
  for (const auto& [tag, v] : scalars) {
    // train/loss -> train_loss, train/accuracy -> train_accuracy, train/lr -> lr, ...
    std::string column = tag;
    if (tag == "train/loss" || tag == "train/accuracy") {
      column[5] = '_';
    } else if (tag.rfind("train/", 0) == 0) {
      column = tag.substr(6);
    }
    for (size_t i = 2; i < kStepsColumns.size(); ++i) {
      if (kStepsColumns[i] == column) {
        char b[32];
        std::snprintf(b, sizeof b, "%.7g", v);
        fields[i] = b;
      }
    }
  }
  return JoinCsv(fields);
}

// Drops the rows of steps after `step`; replaced in one rename.
void DropStepRowsAfter(const fs::path& csv, int64_t step) {
  std::ifstream in(csv);
  std::string text, line;
  if (std::getline(in, line)) text = line + "\n";  // the header
  while (std::getline(in, line)) {
    if (std::strtoll(line.c_str(), nullptr, 10) <= step) text += line + "\n";
  }
  in.close();
  WriteFileAtomically(csv.string(), text);
}

}  // namespace

const std::vector<std::string>& RunFiles::MetricsColumns() {
  static const std::vector<std::string> columns = {
      "epoch",   "train_loss", "train_accuracy", "test_loss", "test_accuracy", "images_per_s",
      "seconds", "lr",         "skipped_records"};
  return columns;
}

RunFiles::RunFiles(const std::string& dir, const std::string& config_text, bool autotune,
                   std::optional<int64_t> resumed_step,
                   std::vector<std::vector<double>> metrics_rows, const std::string& window)
    : dir_(dir), metrics_rows_(std::move(metrics_rows)) {
  const bool fresh = !resumed_step.has_value();
  const fs::path d = dir;
  fs::create_directories(d);
  if (fresh) WriteFileAtomically((d / "config.yaml").string(), config_text);
  if (autotune) {
    autotune_ = std::make_unique<AppendFile>((d / "autotune.csv").string(), fresh);
    if (fresh) {
      autotune_->Append(
          "batch,action,knob,from,to,images_per_s_before,images_per_s_after,reason\n");
    }
  }
  // metrics.csv: rebuilt from the checkpoint's rows in one step, so a
  // failure leaves the file as the last run left it.
  std::string rows = JoinCsv(MetricsColumns()) + "\n";
  for (const auto& r : metrics_rows_) rows += MetricsRow(r) + "\n";
  WriteFileAtomically((d / "metrics.csv").string(), rows);
  metrics_ = std::make_unique<AppendFile>((d / "metrics.csv").string(), /*truncate=*/false);
  events_ = std::make_unique<TfEventWriter>(dir);
  const fs::path steps = d / "steps.csv";
  const bool fresh_steps = fresh || !fs::exists(steps);
  if (!fresh_steps) DropStepRowsAfter(steps, *resumed_step);
  steps_ = std::make_unique<AppendFile>(steps.string(), fresh_steps);
  if (fresh_steps) steps_->Append(JoinCsv(kStepsColumns) + "\n");
  if (!window.empty()) {
    std::istringstream in(window);
    in >> window_.loss_sum >> window_.correct >> window_.samples;
    window_restored_ = true;
  }
}

RunFiles::~RunFiles() = default;

void RunFiles::StartEpoch(double busy, double reduce_wait) {
  if (!window_restored_) window_ = Window();
  window_restored_ = false;
  window_.busy = busy;
  window_.reduce_wait = reduce_wait;
}

void RunFiles::StartSegment() { window_.mark = 0; }

void RunFiles::EndSegment(double segment_seconds) {
  window_.seconds += segment_seconds - window_.mark;
  window_.mark = 0;
}

void RunFiles::AddBatch(double loss, int64_t correct, int64_t samples) {
  window_.loss_sum += loss * static_cast<double>(samples);
  window_.correct += correct;
  window_.samples += samples;
}

void RunFiles::StepScalars(int64_t step, int64_t epoch, double lr, double busy, double reduce_wait,
                           double segment_seconds) {
  Window& w = window_;
  const double seconds = w.seconds + (segment_seconds - w.mark);
  const auto samples = static_cast<double>(w.samples);
  if (samples <= 0) return;
  std::vector<std::pair<std::string, double>> s = {
      {"train/loss", w.loss_sum / samples},
      {"train/accuracy", static_cast<double>(w.correct) / samples},
      {"train/lr", lr},
      {"train/images_per_s", seconds > 0 ? samples / seconds : 0}};
  // The step's busy time against the wall time, as `cnnflow bench` reports it.
  if (busy >= 0 && w.busy >= 0 && seconds > 0) {
    s.emplace_back("train/data_wait_share", std::max(0.0, 1.0 - (busy - w.busy) / seconds));
    s.emplace_back("train/allreduce_share", (reduce_wait - w.reduce_wait) / seconds);
    w.busy = busy;
    w.reduce_wait = reduce_wait;
  }
  events_->Scalars(step, s);
  steps_->Append(StepsRow(step, epoch, s) + "\n");
  w.seconds = 0;
  w.mark = segment_seconds;
  w.loss_sum = 0;
  w.correct = 0;
  w.samples = 0;
}

std::string RunFiles::WindowState() const {
  std::ostringstream w;
  w.precision(17);
  w << window_.loss_sum << " " << window_.correct << " " << window_.samples;
  return w.str();
}

void RunFiles::Epoch(const EpochRecord& r) {
  const PassMetrics& train = r.train;
  const std::vector<double> row = {
      static_cast<double>(r.epoch),
      train.mean_loss(),
      train.accuracy(),
      r.test ? r.test->mean_loss() : kNoTest,
      r.test ? r.test->accuracy() : kNoTest,
      train.seconds > 0 ? train.samples / train.seconds : 0,
      train.seconds,
      r.lr,
      static_cast<double>(train.skipped + (r.test ? r.test->skipped : 0))};
  metrics_rows_.push_back(row);
  metrics_->Append(MetricsRow(row) + "\n");
  std::vector<std::pair<std::string, double>> s = {{"epoch/train_loss", row[1]},
                                                   {"epoch/train_accuracy", row[2]}};
  if (r.test) {
    s.emplace_back("epoch/test_loss", row[3]);
    s.emplace_back("epoch/test_accuracy", row[4]);
  }
  s.emplace_back("epoch/lr", row[7]);
  s.emplace_back("epoch/images_per_s", row[5]);
  if (r.data_wait_share >= 0) s.emplace_back("epoch/data_wait_share", r.data_wait_share);
  if (r.allreduce_share >= 0) s.emplace_back("epoch/allreduce_share", r.allreduce_share);
  if (r.ranks) {
    for (auto& scalar : RankScalars(*r.ranks)) s.push_back(std::move(scalar));
  }
  events_->Scalars(r.epoch, s);
  if (r.test) {
    steps_->Append(
        StepsRow(r.global_step, r.epoch, {{"test_loss", row[3]}, {"test_accuracy", row[4]}}) +
        "\n");
  }
}

void RunFiles::Autotune(const AutotuneDecision& d) {
  if (!autotune_) return;
  std::ostringstream row;
  row << d.batch << "," << d.action << "," << d.knob << "," << d.from << "," << d.to << ","
      << d.rate_before << "," << d.rate_after << ",\"" << d.reason << "\"\n";
  autotune_->Append(row.str());
}

}  // namespace cnnflow
