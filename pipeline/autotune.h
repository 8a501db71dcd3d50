// Autotuning of the loader during training (`graph.autotune: true`): hill
// climbing on measured throughput over the knobs the running graph offers
// (decode concurrency, prefetch depth), each within its bounds (the run's
// thread budget, the prefetch memory budget).
//
// One move at a time, as an A/B/A trial: measure a window at the current
// setting (A), move one knob (threads +-1, depth x2 or /2) and measure (B),
// move back and measure again (A'), each window after the pipeline has
// settled. B is judged against the mean of A and A', so a drift of the run
// (its warm-up, the machine's load) that would lift any later window cancels
// out, and |A - A'| is the noise of this trial. A move up is kept only if
// it gains `gain` and twice that noise (it costs threads or memory); a move
// down is kept if it loses less than `tolerance` less that noise (it frees
// them, so it also steps down a loader that the step does not need).
// Where the step's busy time is known (CPU replicas), the A window also
// says whether the step waited for data: a move down is not tried while it
// waits (over `wait_bound` of the window: fewer loader resources can only
// slow it), a move up not while it never waits (under `idle_bound`: the
// loader is ahead, and a decode thread would take a core from the step).
// Every move is logged with A, B and A'; when no move is kept in a full
// round, the tuner settles and stops moving.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "stages/pass_state.h"

namespace cnnflow {

struct AutotuneDecision {
  int64_t batch = 0;  // batches seen (over the whole run) when decided
  std::string knob;   // empty for "settled"
  int64_t from = 0, to = 0;
  double rate_before = 0, rate_after = 0;  // images/s
  std::string action;                      // "try", "keep", "revert", "settled"
  std::string reason;
  std::string ToString() const;
};

struct AutotuneOptions {
  int64_t window_batches = 16;  // a window is at least this many batches
  double window_seconds = 1.0;  // and at least this long (noise)
  int64_t settle_batches = 4;   // skipped after a move and at a pass's start
  double gain = 0.05;
  double tolerance = 0.03;
  double wait_bound = 0.05;  // of a window: the step waits for data
  double idle_bound = 0.02;  // the step never waits
  int64_t max_moves = 24;    // settle after this many tries in any case
};

class Autotuner {
 public:
  explicit Autotuner(AutotuneOptions opt = {}) : opt_(opt) {}

  // A new pass starts (its graph offers fresh knobs): its first batches
  // are warm-up and not measured; a window in progress goes on.
  void StartPass();
  // After each batch: the pass's knobs, its cumulative samples and
  // seconds, and the step's cumulative busy seconds (BatchMessage::
  // step_busy_seconds; negative: unknown). Returns the decisions taken now
  // (usually none).
  std::vector<AutotuneDecision> Observe(std::vector<TunableKnob>& knobs, int64_t samples,
                                        double seconds, double step_busy_seconds = -1);
  bool settled() const { return phase_ == Phase::kSettled; }
  // The knob values in force, by name (carried into later passes).
  const std::map<std::string, int64_t>& values() const { return values_; }

 private:
  enum class Phase { kBaseline, kTrial, kReturn, kSettled };  // windows A, B, A'
  struct Move {
    size_t knob;
    bool up;
  };
  struct Window {
    double rate;  // images/s
    double wait;  // share of the window the step waited for data; < 0: unknown
  };
  // Observe's steps: this batch counted into the window (the window when
  // it is complete); B ended, back to A's setting for A'; B judged against
  // A and A' (true: kept); no move left.
  std::optional<Window> CountBatch(int64_t samples, double seconds, double step_busy_seconds);
  void EndTrial(std::vector<TunableKnob>& knobs, double rate);
  bool JudgeTrial(std::vector<TunableKnob>& knobs, double a2, std::vector<AutotuneDecision>& out);
  AutotuneDecision Settle(const std::vector<TunableKnob>& knobs);
  std::optional<Window> EndWindow();  // when the window is complete; then a new one starts
  bool NextMove(std::vector<TunableKnob>& knobs, std::vector<AutotuneDecision>& out);
  int64_t Target(const TunableKnob& k, bool up) const;
  std::string WaitText() const;  // ", the step waiting for data N% of it", or ""

  AutotuneOptions opt_;
  Phase phase_ = Phase::kBaseline;
  int64_t batches_ = 0;  // over the run
  int64_t skip_ = 0;     // batches still to skip before measuring
  // The window being measured: batches, samples and seconds at one
  // setting, summed batch by batch, so a window may span passes (the time
  // between them, evaluation included, counts nowhere).
  int64_t window_batches_ = 0, window_samples_ = 0;
  double window_seconds_ = 0, window_busy_ = 0;
  bool window_busy_known_ = true;
  bool have_last_ = false;  // a batch of this pass was seen
  int64_t last_samples_ = 0;
  double last_seconds_ = 0, last_busy_ = -1;
  double baseline_ = 0;        // A
  double baseline_wait_ = -1;  // A's data-wait share (< 0: unknown)
  double trial_rate_ = 0;      // B
  size_t next_candidate_ = 0;  // index into the round's moves
  size_t tried_in_round_ = 0;
  int64_t moves_ = 0;
  std::optional<Move> trial_, last_kept_;
  int64_t trial_from_ = 0, trial_to_ = 0;
  std::map<std::string, int64_t> values_;
};

}  // namespace cnnflow
