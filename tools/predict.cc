#include "tools/predict.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "pipeline/predictor.h"
#include "pipeline/run_config.h"
#include "tools/command_line.h"

namespace cnnflow {

int RunPredict(const std::vector<std::string>& args) {
  std::string config, weights;
  std::vector<std::string> sets, files;
  int top = 5;
  try {
    CommandLine cmd(args);
    while (cmd.Next()) {
      if (cmd.Is("--weights")) {
        weights = cmd.Value();
      } else if (cmd.Is("--set")) {
        sets.push_back(cmd.Value());
      } else if (cmd.Is("--top")) {
        top = static_cast<int>(cmd.Count());
      } else if (cmd.IsOption()) {
        cmd.Reject();
      } else if (config.empty()) {
        config = cmd.arg();
      } else {
        files.push_back(cmd.arg());
      }
    }
    if (config.empty() || weights.empty() || files.empty()) {
      throw ConfigError("needs CONFIG, --weights FILE and at least one file");
    }
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "cnnflow predict: %s\n\n%s", e.what(), kPredictUsage);
    return 2;
  }
  try {
    Predictor predictor(LoadRunConfig(config, sets), weights);
    std::printf("# %s, tensor parallel over %d device(s); one file a forward (batch 1)\n",
                predictor.device().ToString().c_str(), predictor.tensor_parallel());
    std::vector<double> forward_ms;
    for (const std::string& f : files) {
      const Prediction p = predictor.Predict(f, top);
      std::printf("%s:", f.c_str());
      for (const auto& [c, prob] : p.top) std::printf(" %d (%.3f)", c, prob);
      std::printf("   decode %.2f ms, forward %.2f ms\n", p.decode_ms, p.forward_ms);
      forward_ms.push_back(p.forward_ms);
    }
    std::sort(forward_ms.begin(), forward_ms.end());
    std::printf("# %zu file(s), forward latency median %.2f ms, min %.2f ms\n", forward_ms.size(),
                forward_ms[forward_ms.size() / 2], forward_ms.front());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cnnflow predict: error: %s\n", e.what());
    return 1;
  }
}

}  // namespace cnnflow
