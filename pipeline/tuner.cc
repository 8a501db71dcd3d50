#include "pipeline/tuner.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>


namespace cnnflow {

namespace {

double CpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// The stages that train (cut out of the loader-only graph).
bool Trains(const std::string& stage) {
  return stage == "forward_backward" || stage == "pipeline_stage" || stage == "allreduce" ||
         stage == "optimizer";
}

// The train graph with its training nodes cut out (what fed them goes
// straight to what they fed) and the loader settings applied.
GraphSpec LoaderOnly(const GraphSpec& train, int64_t threads, int64_t depth) {
  GraphSpec g = train;
  g.nodes.clear();
  std::set<std::string> cut;
  for (NodeSpec n : train.nodes) {
    if (Trains(n.stage)) {
      cut.insert(n.name);
      continue;
    }
    if (n.stage == "load_batch") n.args.Set("threads", threads);
    if (n.stage == "prefetch") n.args.Set("depth", depth);
    g.nodes.push_back(std::move(n));
  }
  // The first nodes after `to` that are not cut.
  std::function<void(const std::string&, std::set<std::string>&)> kept_after =
      [&](const std::string& to, std::set<std::string>& out) {
        if (!cut.count(to)) {
          out.insert(to);
          return;
        }
        for (const auto& [a, b] : train.edges)
          if (a == to) kept_after(b, out);
      };
  g.edges.clear();
  for (const auto& [from, to] : train.edges) {
    if (cut.count(from)) continue;
    std::set<std::string> targets;
    kept_after(to, targets);
    for (const std::string& t : targets) g.edges.emplace_back(from, t);
  }
  return g;
}

}  // namespace

TuneReport TuneLoader(Trainer& trainer, const std::vector<int64_t>& load_threads,
                      const std::vector<int64_t>& prefetch, int64_t steps) {
  RunState& state = trainer.state();
  const RunConfig& config = trainer.config();
  const int64_t saved_steps = state.max_steps;
  state.max_steps = steps;
  const double batch_mb =
      static_cast<double>(config.batch * state.dataset("train").sample_shape().numel() * 4) / 1e6;
  auto run = [&](const GraphSpec& g) {
    const auto start = std::chrono::steady_clock::now();
    const double cpu0 = CpuSeconds();
    const PassMetrics m = trainer.RunPass(g, "train", 0);
    const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return std::make_pair(m.samples / wall, (CpuSeconds() - cpu0) / wall);
  };

  TuneReport report;
  for (int64_t t : load_threads) {
    for (int64_t d : prefetch) {
      TuneSetting s;
      s.load_threads = t;
      s.prefetch = d;
      std::tie(s.images_per_s, s.cpu_cores) = run(LoaderOnly(config.train_graph, t, d));
      s.prefetch_mb = batch_mb * static_cast<double>(d);
      report.settings.push_back(s);
    }
  }
  // The full step with the configured loader (this trains the model a
  // little: the tuner's trainer is thrown away afterwards).
  report.step_images_per_s = run(config.train_graph).first;
  state.max_steps = saved_steps;

  // The cheapest setting within 5% of the fastest: fewer threads, then
  // less memory.
  double fastest = 0;
  for (const auto& s : report.settings) fastest = std::max(fastest, s.images_per_s);
  for (size_t i = 0; i < report.settings.size(); ++i) {
    if (report.settings[i].images_per_s >= 0.95 * fastest) {
      report.best = i;
      break;
    }
  }
  const double load = report.settings[report.best].images_per_s;
  report.bottleneck =
      load < 1.2 * report.step_images_per_s
          ? StrCat("load: the loader alone (", static_cast<int64_t>(load),
                   " img/s) barely outruns the training step (",
                   static_cast<int64_t>(report.step_images_per_s),
                   " img/s with loading); more loader threads or a cheaper transform would help")
          : StrCat("step: the loader alone delivers ", static_cast<int64_t>(load), " img/s, ",
                   static_cast<int>(load / std::max(report.step_images_per_s, 1.0) * 10) / 10.0,
                   "x what training consumes (", static_cast<int64_t>(report.step_images_per_s),
                   " img/s); data loading is not what limits this run");
  return report;
}

std::string TuneReport::ToString() const {
  std::ostringstream os;
  char line[160];
  std::snprintf(line, sizeof line, "  %-12s %-9s %12s %10s %12s\n", "load_threads", "prefetch",
                "images/s", "CPU cores", "prefetch MB");
  os << line;
  for (size_t i = 0; i < settings.size(); ++i) {
    const TuneSetting& s = settings[i];
    std::snprintf(line, sizeof line, "  %-12lld %-9lld %12.0f %10.2f %12.1f%s\n",
                  static_cast<long long>(s.load_threads), static_cast<long long>(s.prefetch),
                  s.images_per_s, s.cpu_cores, s.prefetch_mb, i == best ? "   <- recommended" : "");
    os << line;
  }
  std::snprintf(line, sizeof line, "  training step with the configured loader: %.0f images/s\n",
                step_images_per_s);
  os << line << "bottleneck: " << bottleneck << "\n";
  const TuneSetting& b = settings[best];
  os << "use: --set graph.load_threads=" << b.load_threads << " --set graph.prefetch=" << b.prefetch
     << "\n";
  return os.str();
}

}  // namespace cnnflow
