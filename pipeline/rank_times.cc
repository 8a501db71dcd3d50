#include "pipeline/rank_times.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>

#include "ops/error.h"

namespace cnnflow {

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

double ComputeMs(const RankPhases& r) {
  return r.ms[kForward] + r.ms[kBackward] + r.ms[kOptimizer];
}

double StepMs(const RankPhases& r) {
  double sum = 0;
  for (double ms : r.ms) sum += ms;
  return sum;
}

// The median over the ranks but `skip` of what `of` reads from each.
template <typename Of>
double MedianOfOthers(const std::vector<RankPhases>& ranks, size_t skip, Of of) {
  std::vector<double> v;
  for (size_t j = 0; j < ranks.size(); ++j)
    if (j != skip) v.push_back(of(ranks[j]));
  return Median(std::move(v));
}

// A replica's counters by phase, in seconds.
// A GPU replica's phases as its GPU spent them (the host's are the times of
// issuing its kernels); a CPU replica's as its host did.
std::array<double, kStepPhases> Seconds(const ReplicaSet::Counters& c, bool gpu) {
  std::array<double, kStepPhases> s{};
  if (gpu) {
    s[kDataWait] = c.gpu_idle_seconds;
    s[kForward] = c.gpu_busy_seconds[kGpuForward];
    s[kBackward] = c.gpu_busy_seconds[kGpuBackward];
    s[kAllReduce] = c.gpu_busy_seconds[kGpuReduceWait];
    s[kOptimizer] = c.gpu_busy_seconds[kGpuOptimizer];
    return s;
  }
  s[kDataWait] = c.data_wait_seconds;
  s[kForward] = c.forward_seconds;
  s[kBackward] = c.backward_seconds;
  s[kAllReduce] = c.reduce_wait_seconds;
  s[kOptimizer] = c.optimizer_seconds;
  return s;
}

std::string Fixed(double v, int width) {
  char b[32];
  std::snprintf(b, sizeof b, "%*.2f", width, v);
  return b;
}

}  // namespace

const char* StepPhaseName(int phase) {
  static const char* const kNames[kStepPhases] = {"data", "forward", "backward", "all-reduce",
                                                  "optimizer"};
  return kNames[phase];
}

RankSpread SpreadOf(const std::vector<RankPhases>& ranks) {
  RankSpread s;
  if (ranks.empty()) return s;
  for (int p = 0; p < kStepPhases; ++p) {
    std::vector<double> v;
    for (const RankPhases& r : ranks) v.push_back(r.ms[p]);
    s[p].min = *std::min_element(v.begin(), v.end());
    s[p].max = *std::max_element(v.begin(), v.end());
    s[p].median = Median(std::move(v));
  }
  return s;
}

std::optional<Straggler> FindStraggler(const std::vector<RankPhases>& ranks) {
  std::optional<Straggler> found;
  double found_excess = 0;
  for (size_t i = 0; i < ranks.size() && ranks.size() >= 2; ++i) {
    const RankPhases& me = ranks[i];
    const double others_step = MedianOfOthers(ranks, i, StepMs);
    const double others_wait =
        MedianOfOthers(ranks, i, [](const RankPhases& r) { return r.ms[kAllReduce]; });
    const auto qualifies = [&](double mine, double theirs) {
      const double excess = mine - theirs;
      return excess > 0 && mine >= kStragglerRatio * theirs &&
             excess >= kStragglerShare * others_step &&
             others_wait - me.ms[kAllReduce] >= 0.5 * excess;
    };
    std::optional<Straggler> mine;
    const auto consider = [&](const std::string& phase, double ms, double theirs) {
      if (!qualifies(ms, theirs) || (mine && ms - theirs <= mine->ms - mine->others_ms)) return;
      mine = Straggler{me.rank, phase, ms, theirs, static_cast<int>(ranks.size())};
    };
    for (int p : {kDataWait, kForward, kBackward, kOptimizer}) {
      consider(StepPhaseName(p), me.ms[p],
               MedianOfOthers(ranks, i, [p](const RankPhases& r) { return r.ms[p]; }));
    }
    if (!mine) {
      consider("compute (forward+backward+optimizer)", ComputeMs(me),
               MedianOfOthers(ranks, i, ComputeMs));
    }
    if (mine && mine->ms - mine->others_ms > found_excess) {
      found_excess = mine->ms - mine->others_ms;
      found = mine;
    }
  }
  return found;
}

std::string Straggler::Line() const {
  char ratio[32], times[64];
  std::snprintf(ratio, sizeof ratio, "%.1fx", others_ms > 0 ? ms / others_ms : 0.0);
  std::snprintf(times, sizeof times, "%.1f vs %.1f ms per step", ms, others_ms);
  return StrCat("rank ", rank, " is the straggler: its ", phase, " takes ", ratio, " ",
                ranks == 2 ? std::string("the other rank's")
                           : StrCat("the median of the other ", ranks - 1, " ranks"),
                " (", times, ")");
}

std::optional<SlowStage> FindSlowStage(const std::vector<double>& busy_ms,
                                       const std::vector<std::vector<std::string>>& stages) {
  CNNFLOW_ENFORCE(busy_ms.size() == stages.size(), "FindSlowStage: ", busy_ms.size(),
                  " busy times for ", stages.size(), " stages");
  if (busy_ms.size() < 2) return std::nullopt;
  const size_t slow = std::max_element(busy_ms.begin(), busy_ms.end()) - busy_ms.begin();
  std::vector<double> others;
  for (size_t s = 0; s < busy_ms.size(); ++s)
    if (s != slow) others.push_back(busy_ms[s]);
  const double others_ms = Median(std::move(others));
  if (!(busy_ms[slow] >= kStragglerRatio * others_ms) || busy_ms[slow] <= 0) return std::nullopt;
  SlowStage out;
  out.stage = static_cast<int>(slow);
  if (!stages[slow].empty()) {
    out.first_layer = stages[slow].front();
    out.last_layer = stages[slow].back();
  }
  out.ms = busy_ms[slow];
  out.others_ms = others_ms;
  out.stages = static_cast<int>(busy_ms.size());
  return out;
}

std::string SlowStage::Line() const {
  char ratio[32], times[64];
  std::snprintf(ratio, sizeof ratio, "%.1fx", others_ms > 0 ? ms / others_ms : 0.0);
  std::snprintf(times, sizeof times, "%.1f vs %.1f ms per step", ms, others_ms);
  const std::string layers =
      first_layer == last_layer ? first_layer : StrCat(first_layer, " .. ", last_layer);
  return StrCat("stage ", stage, " (", layers, ") is the bottleneck: busy ", ratio, " ",
                stages == 2 ? std::string("the other stage's")
                            : StrCat("the median of the other ", stages - 1, " stages"),
                " (", times, "); move layers out of it in graph.pipeline");
}

std::string RankReport::Text() const {
  constexpr int kLabel = 40;
  std::string head = StrCat("step time per rank (ms/step, ", ranks.size(), " ranks)");
  head.resize(std::max<size_t>(head.size(), kLabel), ' ');
  std::vector<int> widths;
  for (int p = 0; p < kStepPhases; ++p) {
    widths.push_back(std::max<int>(8, static_cast<int>(std::strlen(StepPhaseName(p)))) + 2);
    head += std::string(widths[p] - std::strlen(StepPhaseName(p)), ' ') + StepPhaseName(p);
  }
  std::vector<std::string> lines = {head};
  const std::pair<const char*, double PhaseSpread::*> rows[] = {
      {"min", &PhaseSpread::min}, {"median", &PhaseSpread::median}, {"max", &PhaseSpread::max}};
  for (const auto& [name, field] : rows) {
    std::string row = StrCat("  ", name);
    row.resize(kLabel, ' ');
    for (int p = 0; p < kStepPhases; ++p) row += Fixed(spread[p].*field, widths[p]);
    lines.push_back(row);
  }
  if (straggler) lines.push_back(straggler->Line());
  std::string text;
  for (const std::string& line : lines) text += (text.empty() ? "" : "\n") + line;
  return text;
}

std::vector<std::pair<std::string, double>> RankScalars(const RankSpread& spread) {
  std::vector<std::pair<std::string, double>> s;
  for (int p = 0; p < kStepPhases; ++p) {
    std::string tag = StepPhaseName(p);
    tag.erase(std::remove(tag.begin(), tag.end(), '-'), tag.end());  // all-reduce -> allreduce
    s.emplace_back(StrCat("ranks/", tag, "_ms_median"), spread[p].median);
    s.emplace_back(StrCat("ranks/", tag, "_ms_max"), spread[p].max);
  }
  return s;
}

void RankTimes::Start(const ReplicaSet& replicas) {
  start_.clear();
  for (int r = 0; r < replicas.size(); ++r) start_.push_back(replicas.counters(r));
}

double MedianStepMs(const std::vector<RankPhases>& ranks) {
  if (ranks.empty()) return 0;
  std::vector<double> v;
  for (const RankPhases& r : ranks) v.push_back(StepMs(r));
  return Median(std::move(v));
}

double StallWarnSeconds(double configured_s, const std::vector<RankPhases>& ranks) {
  if (configured_s <= 0) return configured_s;
  return std::max(configured_s, kStallWarnSteps * MedianStepMs(ranks) / 1000);
}

std::optional<RankReport> RankTimes::Finish(const ReplicaSet& replicas, MpiWorld& world,
                                            double timeout_s) const {
  // The same answer on every process (they run one config), so either all
  // gather or none does.
  if (replicas.global_size() < 2 || static_cast<int>(start_.size()) != replicas.size()) {
    return std::nullopt;
  }
  // Per replica: its rank, its steps, and its seconds per phase, as bits.
  constexpr size_t kFields = 2 + kStepPhases;
  std::vector<uint64_t> mine;
  for (int r = 0; r < replicas.size(); ++r) {
    const ReplicaSet::Counters& now = replicas.counters(r);
    const bool gpu = replicas.device(r).is_cuda();
    const auto s1 = Seconds(now, gpu), s0 = Seconds(start_[r], gpu);
    mine.push_back(std::bit_cast<uint64_t>(static_cast<double>(replicas.global_offset() + r)));
    mine.push_back(std::bit_cast<uint64_t>(static_cast<double>(now.steps - start_[r].steps)));
    for (int p = 0; p < kStepPhases; ++p) mine.push_back(std::bit_cast<uint64_t>(s1[p] - s0[p]));
  }
  // Processes may carry different numbers of replicas (logical replicas
  // 3 + 3 + 2); AllGather takes as many from each: pad with rank -1.
  const int most = (replicas.global_size() + world.size() - 1) / world.size();
  for (int r = replicas.size(); r < most; ++r) {
    mine.push_back(std::bit_cast<uint64_t>(-1.0));
    mine.resize(mine.size() + kFields - 1, 0);
  }
  const std::vector<uint64_t> all = world.AllGather(mine, "per-rank step times", timeout_s);
  RankReport report;
  for (size_t k = 0; k + kFields <= all.size(); k += kFields) {
    if (std::bit_cast<double>(all[k]) < 0) continue;  // padding
    const double steps = std::bit_cast<double>(all[k + 1]);
    if (steps <= 0) return std::nullopt;  // a rank without steps this epoch: no per-step figure
    RankPhases r;
    r.rank = static_cast<int>(std::bit_cast<double>(all[k]));
    for (int p = 0; p < kStepPhases; ++p)
      r.ms[p] = 1000 * std::bit_cast<double>(all[k + 2 + p]) / steps;
    report.ranks.push_back(r);
  }
  std::sort(report.ranks.begin(), report.ranks.end(),
            [](const RankPhases& a, const RankPhases& b) { return a.rank < b.rank; });
  report.spread = SpreadOf(report.ranks);
  report.straggler = FindStraggler(report.ranks);
  return report;
}

}  // namespace cnnflow
