// Loader tuning (`cnnflow tune`): what should the loader settings be, and
// will they make training faster? Runs the config's whole train graph at
// each setting of loader threads x prefetch depth, in interleaved rounds
// (each round visits every setting, the order reversed every other round,
// so a drift of the machine or the run's own warm-up lands on all of them),
// timing only the batches after a warm-up. It recommends the cheapest
// setting (fewest threads, then least prefetch memory) that trains as fast
// as the fastest, compared round by round (each round's rate against the
// fastest setting's in the same round, so the machine's drift cancels): a
// median ratio within 5% of 1, or within the ratios' typical scatter,
// which cannot tell a smaller gap from noise; and the cheapest outright
// where its loader alone delivers twice what training takes. It says
// whether the loader bounds the run: beside each setting it also times the
// loader alone (the graph without its training nodes) and the CPU its
// decode tasks use.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pipeline/trainer.h"

namespace cnnflow {

struct TuneSetting {
  int64_t load_threads = 1;
  int64_t prefetch = 4;
  double prefetch_mb = 0;  // the batches the limiter lets in flight, in MB
  // Training end to end (loader + step), images/s: the median over the
  // rounds, and (max - min) / median.
  double images_per_s = 0;
  double spread = 0;
  // The median over the rounds of this setting's rate / the fastest's in
  // the same round, and half the range of those ratios.
  double vs_fastest = 1, vs_fastest_scatter = 0;
  double loader_images_per_s = 0;               // the loader alone (median)
  std::vector<double> train_runs, loader_runs;  // every round's images/s, in round order
  // CPU seconds per wall second of the loader's decode tasks (their own
  // threads' clocks) while training: its share of the thread budget.
  double loader_cores = 0;
  double loader_alone_cores = 0;  // the same, the loader alone (as fast as it goes)
};

struct TuneReport {
  std::vector<TuneSetting> settings;  // threads ascending, then prefetch ascending
  size_t best = 0;                    // the recommended setting
  size_t fastest = 0;                 // the highest median
  double noise = 0;                   // the rounds' typical spread (>= 2%), for the report
  double tolerance = 0.05;            // the recommendation trains within this of the fastest,
  double ratio_noise = 0;             // or within this: the ratios' typical scatter
  int64_t threads = 1;                // the run's thread budget
  int rounds = 0;
  bool loader_bound = false;
  std::string verdict;  // one line: what the user gains
  std::string ToString() const;
};

// From each setting's train_runs (every round's images/s, in round order,
// the same rounds for all): the medians and spreads, `fastest`, `noise`,
// each setting's vs_fastest and the recommendation `best`: the cheapest
// setting outright when its loader alone (loader_images_per_s) delivers at
// least twice what the fastest setting trains at, else the cheapest with
// vs_fastest >= 1 - max(tolerance, ratio_noise).
void ChooseSetting(TuneReport& report);

// Times `steps` batches after `warmup` per run, `rounds` runs per setting.
// It trains the trainer's model (throw the trainer away afterwards).
TuneReport TuneLoader(Trainer& trainer, const std::vector<int64_t>& load_threads,
                      const std::vector<int64_t>& prefetch, int64_t steps, int rounds = 3,
                      int64_t warmup = -1);

}  // namespace cnnflow
