#include "pipeline/autotune.h"

#include <algorithm>
#include <cstdio>

namespace cnnflow {

std::string AutotuneDecision::ToString() const {
  char buf[512];
  if (action == "settled") {
    std::snprintf(buf, sizeof buf, "autotune: settled after %lld batches: %s",
                  static_cast<long long>(batch), reason.c_str());
  } else if (action == "try") {
    std::snprintf(buf, sizeof buf, "autotune: batch %lld: try %s %lld -> %lld (%s)",
                  static_cast<long long>(batch), knob.c_str(), static_cast<long long>(from),
                  static_cast<long long>(to), reason.c_str());
  } else {
    std::snprintf(buf, sizeof buf, "autotune: batch %lld: %s %s = %lld (%s)",
                  static_cast<long long>(batch), action.c_str(), knob.c_str(),
                  static_cast<long long>(action == "keep" ? to : from), reason.c_str());
  }
  return buf;
}

void Autotuner::StartPass() {
  skip_ = opt_.settle_batches;
  window_open_ = false;
}

std::optional<double> Autotuner::WindowRate(int64_t samples, double seconds) {
  const double dt = seconds - window_start_seconds_;
  if (window_batches_ < opt_.window_batches || dt < opt_.window_seconds || dt <= 0) return {};
  return static_cast<double>(samples - window_start_samples_) / dt;
}

int64_t Autotuner::Target(const TunableKnob& k, bool up) const {
  const int64_t t = k.doubling ? (up ? k.value * 2 : k.value / 2) : (up ? k.value + 1 : k.value - 1);
  return std::clamp(t, k.min, k.max);
}

bool Autotuner::NextMove(std::vector<TunableKnob>& knobs, std::vector<AutotuneDecision>& out) {
  const size_t candidates = 2 * knobs.size();
  while (tried_in_round_ < candidates) {
    const Move m{(next_candidate_ / 2) % knobs.size(), next_candidate_ % 2 == 0};
    next_candidate_ = (next_candidate_ + 1) % candidates;
    ++tried_in_round_;
    TunableKnob& k = knobs[m.knob];
    const int64_t target = Target(k, m.up);
    if (target == k.value) continue;  // at its bound
    if (last_kept_ && last_kept_->knob == m.knob && last_kept_->up != m.up) continue;  // undo
    if (moves_ >= opt_.max_moves) return false;
    ++moves_;
    AutotuneDecision d;
    d.batch = batches_;
    d.knob = k.name;
    d.from = k.value;
    d.rate_before = baseline_;
    trial_from_ = k.value;
    k.value = k.set(target);
    d.to = k.value;
    char why[160];
    std::snprintf(why, sizeof why, "baseline %.0f images/s; %s", baseline_,
                  m.up ? "kept if it gains 5%" : "kept if it loses under 3%");
    d.action = "try";
    d.reason = why;
    out.push_back(d);
    values_[k.name] = k.value;
    trial_ = m;
    phase_ = Phase::kTrial;
    skip_ = opt_.settle_batches;
    return true;
  }
  return false;
}

std::vector<AutotuneDecision> Autotuner::Observe(std::vector<TunableKnob>& knobs, int64_t samples,
                                                 double seconds) {
  std::vector<AutotuneDecision> out;
  ++batches_;
  if (phase_ == Phase::kSettled || knobs.empty()) return out;
  for (const TunableKnob& k : knobs) values_.emplace(k.name, k.value);
  if (skip_ > 0) {
    --skip_;
    return out;
  }
  if (!window_open_) {
    window_open_ = true;
    window_batches_ = 0;
    window_start_samples_ = samples;
    window_start_seconds_ = seconds;
    return out;
  }
  ++window_batches_;
  const std::optional<double> rate = WindowRate(samples, seconds);
  if (!rate) return out;
  window_open_ = false;

  if (phase_ == Phase::kTrial) {
    TunableKnob& k = knobs[trial_->knob];
    const double change = baseline_ > 0 ? *rate / baseline_ - 1 : 0;
    const bool keep = trial_->up ? change >= opt_.gain : change >= -opt_.tolerance;
    AutotuneDecision d;
    d.batch = batches_;
    d.knob = k.name;
    d.from = trial_from_;
    d.to = k.value;
    d.rate_before = baseline_;
    d.rate_after = *rate;
    char why[200];
    std::snprintf(why, sizeof why, "%.0f -> %.0f images/s, %+.1f%%%s", baseline_, *rate,
                  100 * change,
                  keep ? "" : (trial_->up ? ", under the +5% a move up must gain"
                                          : ", more than the 3% a move down may lose"));
    d.reason = why;
    if (keep) {
      d.action = "keep";
      baseline_ = *rate;
      last_kept_ = trial_;
      tried_in_round_ = 0;
    } else {
      d.action = "revert";
      k.value = k.set(trial_from_);
    }
    values_[k.name] = k.value;
    out.push_back(d);
    trial_.reset();
  } else {
    baseline_ = *rate;
  }
  if (!NextMove(knobs, out)) {
    phase_ = Phase::kSettled;
    AutotuneDecision d;
    d.batch = batches_;
    d.action = "settled";
    d.rate_before = d.rate_after = baseline_;
    std::string v;
    for (const TunableKnob& k : knobs) v += StrCat(v.empty() ? "" : ", ", k.name, " = ", k.value);
    char rate_text[64];
    std::snprintf(rate_text, sizeof rate_text, " at %.0f images/s", baseline_);
    d.reason = v + rate_text + (moves_ >= opt_.max_moves ? " (move limit reached)" : "");
    out.push_back(d);
  }
  return out;
}

}  // namespace cnnflow
