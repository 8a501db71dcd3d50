// `cnnflow predict CONFIG --weights W [--top K] [--set key=value ...] FILES...`:
// the top-k classes of each file, with its decode and forward latency
// (pipeline/predictor.h). Returns the exit code.
#pragma once

#include <string>
#include <vector>

namespace cnnflow {

inline constexpr const char* kPredictUsage =
    "usage: cnnflow predict CONFIG --weights FILE [--top K] [--set key=value ...] FILES...\n"
    "  the K (5) most likely classes of each image (JPEG, PNG) or .wav file, one forward a\n"
    "  file on graph.devices' first tensor-parallel group, with each file's latency\n";

int RunPredict(const std::vector<std::string>& args);

}  // namespace cnnflow
