// Pictures, drawn with cairo (PNG or SVG by the file's extension):
//   cnnflow plot RUN_DIR... -o curves.png|svg
//       loss and accuracy, train and test, against epochs (metrics.csv) and
//       steps (steps.csv), every run overlaid in its own colour;
//   cnnflow bench ... --plot scaling.png|svg
//       images/s, speedup and efficiency against the device count, beside
//       the ideal (linear) scaling.
#pragma once

#include <string>
#include <vector>

#include "pipeline/bench.h"

namespace cnnflow {

// `cnnflow plot ARGS`: returns the exit status (2: wrong arguments, 1: a
// run that cannot be read).
int RunPlot(const std::vector<std::string>& args);

// The scaling figure of `rows` (as RunScalingBench returns them) into
// `path`; `title` names the config.
void PlotScaling(const std::vector<BenchRow>& rows, const std::string& path,
                 const std::string& title);

}  // namespace cnnflow
