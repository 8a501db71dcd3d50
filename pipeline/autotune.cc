#include "pipeline/autotune.h"

#include <algorithm>
#include <cmath>
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
  have_last_ = false;
}

std::optional<Autotuner::Window> Autotuner::EndWindow() {
  if (window_batches_ < opt_.window_batches || window_seconds_ < opt_.window_seconds ||
      window_seconds_ <= 0) {
    return {};
  }
  const Window w{static_cast<double>(window_samples_) / window_seconds_,
                 window_busy_known_ ? std::max(0.0, 1 - window_busy_ / window_seconds_) : -1};
  window_batches_ = window_samples_ = 0;
  window_seconds_ = window_busy_ = 0;
  window_busy_known_ = true;
  return w;
}

int64_t Autotuner::Target(const TunableKnob& k, bool up) const {
  const int64_t t =
      k.doubling ? (up ? k.value * 2 : k.value / 2) : (up ? k.value + 1 : k.value - 1);
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
    // What A says of the step: waiting for data, a move down can only lose;
    // never waiting, a move up can only cost.
    if (baseline_wait_ >= 0 && !m.up && baseline_wait_ > opt_.wait_bound) continue;
    if (baseline_wait_ >= 0 && m.up && baseline_wait_ < opt_.idle_bound) continue;
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
    char why[200];
    std::snprintf(why, sizeof why, "A %.0f images/s%s; %s", baseline_, WaitText().c_str(),
                  m.up ? "kept if B gains 5% and twice the A-A' noise"
                       : "kept if B loses under 3% less the A-A' noise");
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

std::string Autotuner::WaitText() const {
  if (baseline_wait_ < 0) return "";
  char text[64];
  std::snprintf(text, sizeof text, ", the step waiting for data %.0f%% of it",
                100 * baseline_wait_);
  return text;
}

std::vector<AutotuneDecision> Autotuner::Observe(std::vector<TunableKnob>& knobs, int64_t samples,
                                                 double seconds, double step_busy_seconds) {
  std::vector<AutotuneDecision> out;
  ++batches_;
  if (phase_ == Phase::kSettled || knobs.empty()) return out;
  for (const TunableKnob& k : knobs) values_.emplace(k.name, k.value);
  // Moves come only after a window.
  const std::optional<Window> window = CountBatch(samples, seconds, step_busy_seconds);
  if (!window) return out;
  if (phase_ == Phase::kTrial) {  // B: back to A for the control window
    EndTrial(knobs, window->rate);
    return out;
  }
  // A': judge B against A and A'; a kept move starts a fresh A.
  if (phase_ == Phase::kReturn && JudgeTrial(knobs, window->rate, out)) return out;
  baseline_ = window->rate;  // A, or A' as the next trial's A
  baseline_wait_ = window->wait;
  if (!NextMove(knobs, out)) out.push_back(Settle(knobs));
  return out;
}

std::optional<Autotuner::Window> Autotuner::CountBatch(int64_t samples, double seconds,
                                                       double step_busy_seconds) {
  // This batch's samples and seconds (the pass's totals are cumulative).
  const bool first = !have_last_;
  const int64_t batch_samples = samples - last_samples_;
  const double batch_seconds = seconds - last_seconds_;
  const bool busy_known = step_busy_seconds >= 0 && last_busy_ >= 0;
  const double batch_busy = step_busy_seconds - last_busy_;
  have_last_ = true;
  last_samples_ = samples;
  last_seconds_ = seconds;
  last_busy_ = step_busy_seconds;
  if (first) return {};  // its time includes the pass's start
  if (skip_ > 0) {
    --skip_;
    return {};
  }
  ++window_batches_;
  window_samples_ += batch_samples;
  window_seconds_ += batch_seconds;
  window_busy_ += batch_busy;
  window_busy_known_ &= busy_known;
  return EndWindow();
}

void Autotuner::EndTrial(std::vector<TunableKnob>& knobs, double rate) {
  trial_rate_ = rate;
  TunableKnob& k = knobs[trial_->knob];
  trial_to_ = k.value;
  k.value = k.set(trial_from_);
  values_[k.name] = k.value;
  phase_ = Phase::kReturn;
  skip_ = opt_.settle_batches;
}

bool Autotuner::JudgeTrial(std::vector<TunableKnob>& knobs, double a2,
                           std::vector<AutotuneDecision>& out) {
  TunableKnob& k = knobs[trial_->knob];
  const double ref = (baseline_ + a2) / 2;
  const double change = ref > 0 ? trial_rate_ / ref - 1 : 0;
  const double noise = ref > 0 ? std::abs(baseline_ - a2) / ref : 0;
  const double need = std::max(opt_.gain, 2 * noise);
  // A move down must lose under `tolerance` even counting the noise.
  const bool keep = trial_->up ? change >= need : change >= noise - opt_.tolerance;
  AutotuneDecision d;
  d.batch = batches_;
  d.knob = k.name;
  d.from = trial_from_;
  d.to = trial_to_;
  d.rate_before = ref;
  d.rate_after = trial_rate_;
  char why[240];
  std::snprintf(why, sizeof why,
                "A %.0f, B %.0f, A' %.0f images/s: %+.1f%% against A and A' "
                "(which differ by %.1f%%)%s",
                baseline_, trial_rate_, a2, 100 * change, 100 * noise,
                keep ? ""
                     : (trial_->up ? StrCat(", under the +", static_cast<int>(100 * need + 0.5),
                                            "% a move up must gain")
                                         .c_str()
                                   : ", more than the 3% (less the noise) a move down may lose"));
  d.reason = why;
  d.action = keep ? "keep" : "revert";
  out.push_back(d);
  const Move tried = *trial_;
  trial_.reset();
  if (!keep) return false;
  k.value = k.set(trial_to_);
  values_[k.name] = k.value;
  last_kept_ = tried;
  tried_in_round_ = 0;
  phase_ = Phase::kBaseline;  // a fresh A at the new setting
  skip_ = opt_.settle_batches;
  return true;
}

AutotuneDecision Autotuner::Settle(const std::vector<TunableKnob>& knobs) {
  phase_ = Phase::kSettled;
  AutotuneDecision d;
  d.batch = batches_;
  d.action = "settled";
  d.rate_before = d.rate_after = baseline_;
  std::string v;
  for (const TunableKnob& k : knobs) v += StrCat(v.empty() ? "" : ", ", k.name, " = ", k.value);
  char rate_text[64];
  std::snprintf(rate_text, sizeof rate_text, " at %.0f images/s", baseline_);
  d.reason = v + rate_text + WaitText() + (moves_ >= opt_.max_moves ? " (move limit reached)" : "");
  return d;
}

}  // namespace cnnflow
