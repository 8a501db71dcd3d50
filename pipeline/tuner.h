// Loader tuning (`cnnflow tune`): runs the config's train graph without its
// training step, across loader threads x prefetch depths, and compares each
// setting's images/s with the training step's own rate, so the user sees
// which stage bounds the run and what setting to choose.
#pragma once

#include <string>
#include <vector>

#include "pipeline/trainer.h"

namespace cnnflow {

struct TuneSetting {
  int64_t load_threads = 1;
  int64_t prefetch = 4;
  double images_per_s = 0;
  double cpu_cores = 0;       // CPU seconds per wall second while it ran
  double prefetch_mb = 0;     // the batches the limiter lets in flight, in MB
};

struct TuneReport {
  std::vector<TuneSetting> settings;
  double step_images_per_s = 0;  // the full train graph (loader + step)
  size_t best = 0;               // index of the recommended setting
  std::string bottleneck;        // "load" or "step", with the reason
  std::string ToString() const;
};

// Times `steps` batches per setting. The trainer's model is not changed.
TuneReport TuneLoader(Trainer& trainer, const std::vector<int64_t>& load_threads,
                      const std::vector<int64_t>& prefetch, int64_t steps);

}  // namespace cnnflow
