#include "tools/predict.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "pipeline/predictor.h"
#include "pipeline/run_config.h"

namespace cnnflow {

int RunPredict(const std::vector<std::string>& args) {
  std::string config, weights;
  std::vector<std::string> sets, files;
  int top = 5;
  try {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      auto value = [&]() -> const std::string& {
        if (i + 1 >= args.size()) throw ConfigError(StrCat(a, " needs a value"));
        return args[++i];
      };
      if (a == "--weights") {
        weights = value();
      } else if (a == "--set") {
        sets.push_back(value());
      } else if (a == "--top") {
        const std::string& v = value();
        char* end = nullptr;
        top = static_cast<int>(std::strtol(v.c_str(), &end, 10));
        if (v.empty() || *end != '\0' || top < 1) {
          throw ConfigError(StrCat("--top needs a positive count, got '", v, "'"));
        }
      } else if (a.rfind("--", 0) == 0) {
        throw ConfigError(StrCat("unknown option '", a, "'"));
      } else if (config.empty()) {
        config = a;
      } else {
        files.push_back(a);
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
