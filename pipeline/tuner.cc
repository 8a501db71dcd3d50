#include "pipeline/tuner.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <set>
#include <sstream>

namespace cnnflow {
namespace {

// g with `threads` decode threads and a prefetch of `depth` batches.
GraphSpec WithLoaderSettings(GraphSpec g, int64_t threads, int64_t depth) {
  const GraphPlan plan = g.Plan();
  for (const auto& [node, arg] : plan.load_threads_args) g.Find(node)->args.Set(arg, threads);
  for (const auto& [node, arg] : plan.prefetch_depth_args) g.Find(node)->args.Set(arg, depth);
  return g;
}

// The train graph with its training nodes cut out (what fed them goes
// straight to what they fed) and the loader settings applied.
GraphSpec LoaderOnly(const GraphSpec& train, int64_t threads, int64_t depth) {
  GraphSpec g = train;
  g.nodes.clear();
  const std::set<std::string> cut = train.Plan().training_nodes;
  for (NodeSpec n : train.nodes) {
    if (!cut.count(n.name)) g.nodes.push_back(std::move(n));
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
  return WithLoaderSettings(std::move(g), threads, depth);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

// How much faster than training the cheapest setting's loader alone must
// be to call the loader not the bottleneck outright.
constexpr double kLoaderHeadroom = 2.0;

void ChooseSetting(TuneReport& report) {
  const size_t n = report.settings.size();
  CNNFLOW_ENFORCE(n > 0, "no settings to choose from");
  report.fastest = 0;
  std::vector<double> spreads;
  for (size_t i = 0; i < n; ++i) {
    TuneSetting& s = report.settings[i];
    CNNFLOW_ENFORCE(
        s.train_runs.size() == report.settings[0].train_runs.size() && !s.train_runs.empty(),
        "every setting needs the same rounds");
    s.images_per_s = Median(s.train_runs);
    const auto [lo, hi] = std::minmax_element(s.train_runs.begin(), s.train_runs.end());
    s.spread = s.images_per_s > 0 ? (*hi - *lo) / s.images_per_s : 0;
    spreads.push_back(s.spread);
    if (s.images_per_s > report.settings[report.fastest].images_per_s) report.fastest = i;
  }
  // The typical spread of one setting's rounds (at least 2%), reported: on
  // a quiet machine a few percent, on a shared one more.
  report.noise = std::max(Median(spreads), 0.02);
  // Round by round against the fastest: each round measured every setting
  // within a short time, so what the machine did then cancels.
  const std::vector<double>& fastest = report.settings[report.fastest].train_runs;
  std::vector<double> scatters;
  for (size_t i = 0; i < n; ++i) {
    TuneSetting& s = report.settings[i];
    std::vector<double> ratios;
    for (size_t r = 0; r < fastest.size(); ++r) ratios.push_back(s.train_runs[r] / fastest[r]);
    s.vs_fastest = Median(ratios);
    const auto [lo, hi] = std::minmax_element(ratios.begin(), ratios.end());
    s.vs_fastest_scatter = (*hi - *lo) / 2;
    if (i != report.fastest) scatters.push_back(s.vs_fastest_scatter);
  }
  // As fast: a median ratio within `tolerance` of 1, or within the typical
  // scatter of the ratios (half their range, the median over the settings):
  // a gap the rounds cannot tell from noise is no reason for more threads.
  report.ratio_noise = scatters.empty() ? 0 : Median(scatters);
  const double bar = 1 - std::max(report.tolerance, report.ratio_noise);
  // A loader that alone delivers far more than the fastest setting trains
  // at cannot be what limits training, whatever the rounds' noise says.
  if (report.settings[0].loader_images_per_s >=
      kLoaderHeadroom * report.settings[report.fastest].images_per_s) {
    report.best = 0;
    return;
  }
  report.best = report.fastest;
  for (size_t i = 0; i < n; ++i) {
    if (report.settings[i].vs_fastest >= bar) {
      report.best = i;  // the first is the cheapest
      break;
    }
  }
}

TuneReport TuneLoader(Trainer& trainer, const std::vector<int64_t>& load_threads,
                      const std::vector<int64_t>& prefetch, int64_t steps, int rounds,
                      int64_t warmup) {
  CNNFLOW_ENFORCE(!load_threads.empty() && !prefetch.empty() && steps > 0 && rounds > 0,
                  "tune needs settings, steps and rounds");
  const RunControl& control = trainer.control();
  const RunConfig& config = trainer.config();
  if (warmup < 0) warmup = std::max<int64_t>(5, steps / 5);
  const double batch_mb =
      static_cast<double>(config.batch * trainer.context().dataset("train").sample_shape().numel() *
                          4) /
      1e6;

  struct Timing {
    double images_per_s = 0, loader_cores = 0;
  };
  // One run of g: images/s over the batches after the warm-up, and the
  // loader's CPU cores over the same wall time.
  auto run = [&](const GraphSpec& g) {
    double t0 = -1, t1 = 0;
    int64_t n0 = 0, n1 = 0, cpu0 = 0, cpu1 = 0;
    auto observe = [&](const BatchMessage& m, const PassMetrics& p) {
      if (m.sequence + 1 == warmup) {
        t0 = p.seconds;
        n0 = p.samples;
        cpu0 = control.loader_cpu_ns.load();
      }
      t1 = p.seconds;
      n1 = p.samples;
      cpu1 = control.loader_cpu_ns.load();
    };
    trainer.RunPass(g, {.pass = "train", .max_batches = warmup + steps, .observe = observe});
    CNNFLOW_ENFORCE(t0 >= 0 && t1 > t0, "tune: the data set has fewer than ", warmup + 1,
                    " batches; lower --steps");
    return Timing{static_cast<double>(n1 - n0) / (t1 - t0),
                  static_cast<double>(cpu1 - cpu0) * 1e-9 / (t1 - t0)};
  };

  TuneReport report;
  report.threads = config.threads;
  report.rounds = rounds;
  for (int64_t t : load_threads) {
    for (int64_t d : prefetch) {
      TuneSetting s;
      s.load_threads = t;
      s.prefetch = d;
      s.prefetch_mb = batch_mb * static_cast<double>(d);
      report.settings.push_back(s);
    }
  }
  const size_t n = report.settings.size();
  std::vector<std::vector<double>> train(n), loader(n), cores(n), alone_cores(n);
  for (int r = 0; r < rounds; ++r) {
    for (size_t k = 0; k < n; ++k) {
      const size_t i = r % 2 == 0 ? k : n - 1 - k;
      const TuneSetting& s = report.settings[i];
      const Timing trained =
          run(WithLoaderSettings(config.train_graph, s.load_threads, s.prefetch));
      train[i].push_back(trained.images_per_s);
      cores[i].push_back(trained.loader_cores);
      const Timing alone = run(LoaderOnly(config.train_graph, s.load_threads, s.prefetch));
      loader[i].push_back(alone.images_per_s);
      alone_cores[i].push_back(alone.loader_cores);
    }
  }

  for (size_t i = 0; i < n; ++i) {
    TuneSetting& s = report.settings[i];
    s.train_runs = train[i];
    s.loader_runs = loader[i];
    s.loader_images_per_s = Median(loader[i]);
    s.loader_cores = Median(cores[i]);
    s.loader_alone_cores = Median(alone_cores[i]);
  }
  ChooseSetting(report);
  const TuneSetting& b = report.settings[report.best];
  const TuneSetting& cheapest = report.settings[0];
  report.loader_bound = report.best != 0;
  if (!report.loader_bound) {
    report.verdict =
        StrCat("the loader is not the bottleneck: ", b.load_threads, " thread",
               b.load_threads > 1 ? "s" : "", ", prefetch ", b.prefetch, " (",
               static_cast<int64_t>(b.images_per_s), " img/s; the fastest setting measured ",
               static_cast<int64_t>(report.settings[report.fastest].images_per_s),
               "); training will not get faster from loader settings (the loader alone delivers ",
               static_cast<int64_t>(b.loader_images_per_s), " img/s, ",
               static_cast<int>(10 * b.loader_images_per_s / std::max(b.images_per_s, 1.0)) / 10.0,
               "x what training consumes)");
  } else {
    report.verdict =
        StrCat("the loader bounds this run: ", b.load_threads, " thread",
               b.load_threads > 1 ? "s" : "", ", prefetch ", b.prefetch, " trains at ",
               static_cast<int64_t>(b.images_per_s), " img/s against ",
               static_cast<int64_t>(cheapest.images_per_s), " with ", cheapest.load_threads,
               " thread", cheapest.load_threads > 1 ? "s" : "", ", prefetch ", cheapest.prefetch,
               " (", static_cast<int>(100 * b.images_per_s / cheapest.images_per_s + 0.5), "%)");
  }
  return report;
}

std::string TuneReport::ToString() const {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "  %-12s %-9s %11s %15s %8s %11s %13s %19s %13s\n",
                "load_threads", "prefetch", "prefetch MB", "train images/s", "spread", "vs fastest",
                "loader cores", "loader alone img/s", "(its cores)");
  os << line;
  for (size_t i = 0; i < settings.size(); ++i) {
    const TuneSetting& s = settings[i];
    std::snprintf(line, sizeof line,
                  "  %-12lld %-9lld %11.1f %15.0f %7.1f%% %10.0f%% %13.2f %19.0f %13.2f%s\n",
                  static_cast<long long>(s.load_threads), static_cast<long long>(s.prefetch),
                  s.prefetch_mb, s.images_per_s, 100 * s.spread, 100 * s.vs_fastest, s.loader_cores,
                  s.loader_images_per_s, s.loader_alone_cores,
                  i == best ? "   <- recommended" : "");
    os << line;
  }
  const TuneSetting& b = settings[best];
  std::snprintf(
      line, sizeof line,
      "medians of %d interleaved rounds (spread %.0f%%); recommended: the cheapest within "
      "%.0f%% of the fastest, round by round (%.0f%%: 5%% or the rounds' scatter)\n",
      rounds, 100 * noise, 100 * std::max(tolerance, ratio_noise),
      100 * std::max(tolerance, ratio_noise));
  os << line;
  std::snprintf(line, sizeof line,
                "threads: %lld in the run's budget; at the recommended setting the loader uses "
                "%.2f of them while training, the step the rest\n",
                static_cast<long long>(threads), b.loader_cores);
  os << line << verdict << "\n";
  os << "use: --set graph.load_threads=" << b.load_threads << " --set graph.prefetch=" << b.prefetch
     << "\n";
  return os.str();
}

}  // namespace cnnflow
