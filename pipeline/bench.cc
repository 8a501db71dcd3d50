#include "pipeline/bench.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "pipeline/trainer.h"

namespace cnnflow {

std::vector<BenchRow> RunScalingBench(const BenchOptions& o) {
  std::vector<BenchRow> rows;
  // The device kind (cpu or cuda) is the config's; the bench varies the
  // count: devices from the config's first on, or, where the config lists
  // one GPU several times ([cuda:0, cuda:0]), that GPU as many times (its
  // lanes: what replicas cost on one GPU).
  const std::vector<Device> listed = LoadRunConfig(o.config, o.overrides).devices;
  const Device first = listed[0];
  const char* kind = first.is_cuda() ? "cuda" : "cpu";
  const bool one_gpu = listed.size() > 1 && OneGpuOnly(listed);
  for (int d : o.devices) {
    CNNFLOW_ENFORCE(d >= 1, "device counts must be >= 1, got ", d);
    std::string list;
    for (int i = 0; i < d; ++i)
      list += StrCat(i ? ", " : "", kind, ":", first.index + (one_gpu ? 0 : i));
    std::vector<std::string> sets = o.overrides;
    sets.push_back("graph.devices=[" + list + "]");
    sets.push_back("train.accumulate=1");
    Trainer trainer(LoadRunConfig(o.config, sets));
    const GraphSpec& graph = trainer.config().train_graph;
    const int processes = trainer.context().process_count;
    // Warm-up: pools, caches, thread start-up, first-touch of the buffers.
    trainer.RunPass(graph, {.pass = "train", .epoch = 0, .max_batches = o.warmup});
    trainer.replicas().ResetCounters();
    const int64_t replayed_before = trainer.replicas().cuda_graph(0).replayed_steps;
    const auto begin = std::chrono::steady_clock::now();
    const PassMetrics m =
        trainer.RunPass(graph, {.pass = "train", .epoch = 1, .max_batches = o.steps});
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    const ReplicaSet::Counters& c = trainer.replicas().counters(0);
    BenchRow r;
    r.devices = d;
    r.processes = processes;
    r.steps = m.batches;
    r.batch = trainer.config().batch * d * processes;
    r.images_per_s = static_cast<double>(m.samples) / wall;
    r.allreduce_share = c.reduce_wait_seconds / wall;
    // A GPU runs ahead of its host: what counts is the GPU idle between steps.
    r.data_wait_share =
        first.is_cuda() ? c.gpu_idle_seconds / wall
                        : std::max(0.0, 1.0 - (c.compute_seconds() + c.reduce_wait_seconds) / wall);
    if (const ReplicaSet::CudaGraphStatus g = trainer.replicas().cuda_graph(0); g.requested) {
      r.note = g.why_not.empty() ? StrCat("CUDA graphs: ", g.replayed_steps - replayed_before,
                                          " of the ", m.batches, " timed steps replayed")
                                 : StrCat("CUDA graphs: uncaptured: ", g.why_not);
    }
    rows.push_back(r);
  }
  const BenchRow& base = rows.front();
  for (BenchRow& r : rows) {
    r.speedup = r.images_per_s / base.images_per_s;
    r.efficiency =
        r.speedup * (base.devices * base.processes) / static_cast<double>(r.devices * r.processes);
  }
  return rows;
}

namespace {

// Images/s of `steps` training steps after `warmup`.
double TimeSteps(Trainer& trainer, int64_t warmup, int64_t steps) {
  const GraphSpec& graph = trainer.config().train_graph;
  trainer.RunPass(graph, {.pass = "train", .epoch = 0, .max_batches = warmup});
  const auto begin = std::chrono::steady_clock::now();
  const PassMetrics m = trainer.RunPass(graph, {.pass = "train", .epoch = 1, .max_batches = steps});
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return static_cast<double>(m.samples) / wall;
}

}  // namespace

PipelineBench RunPipelineBench(const BenchOptions& o) {
  PipelineBench b;
  // The unsplit model on the pipeline's first device (on GPUs: the GPU its
  // stages share, or the first of them).
  b.single_device = LoadRunConfig(o.config, o.overrides).devices[0].ToString();
  {
    std::vector<std::string> sets = o.overrides;
    for (const std::string& s :
         {std::string("graph.pipeline={}"), StrCat("graph.devices=[", b.single_device, "]"),
          std::string("graph.template=graphs/data_parallel.yaml")})
      sets.push_back(s);
    Trainer single(LoadRunConfig(o.config, sets));
    b.single_images_per_s = TimeSteps(single, o.warmup, o.steps);
  }
  Trainer pipe(LoadRunConfig(o.config, o.overrides));
  CNNFLOW_ENFORCE(pipe.pipeline() != nullptr, o.config, " has no graph.pipeline");
  b.pipeline_images_per_s = TimeSteps(pipe, o.warmup, o.steps);  // stats: the timed pass
  b.bubble = pipe.pipeline()->bubble();
  b.theoretical_bubble = pipe.pipeline()->theoretical_bubble();
  b.stages = pipe.pipeline()->num_stages();
  b.microbatches = pipe.config().pipeline_options.microbatches;
  b.schedule = PipelineScheduleName(pipe.config().pipeline_options.schedule);
  return b;
}

namespace {

// Images per second to three significant digits: 5.23, 48.7, 4163.
std::string Rate(double v) {
  const int decimals = v > 0 ? std::max(0, 2 - static_cast<int>(std::floor(std::log10(v)))) : 0;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, v);
  return buf;
}

}  // namespace

std::string PipelineBench::ToString() const {
  std::ostringstream os;
  char line[200];
  std::snprintf(line, sizeof line, "  one device (%s, all threads): %8s images/s\n",
                single_device.c_str(), Rate(single_images_per_s).c_str());
  os << line;
  std::snprintf(line, sizeof line,
                "  pipeline (%d stages, %d micro-batches, %s): %8s images/s (%.2fx)\n", stages,
                microbatches, schedule.c_str(), Rate(pipeline_images_per_s).c_str(),
                pipeline_images_per_s / single_images_per_s);
  os << line;
  os << "  idle share per stage (measured):";
  for (size_t s = 0; s < bubble.size(); ++s) {
    std::snprintf(line, sizeof line, "%s stage %zu %.0f%%", s ? "," : "", s, 100 * bubble[s]);
    os << line;
  }
  std::snprintf(line, sizeof line, "\n  theoretical bubble (S-1)/(M+S-1): %.0f%%\n",
                100 * theoretical_bubble);
  os << line;
  return os.str();
}

std::string BenchTable(const std::vector<BenchRow>& rows) {
  std::ostringstream os;
  char line[200];
  std::snprintf(line, sizeof line, "%9s %9s %6s %7s %10s %8s %10s %10s %10s\n", "processes",
                "replicas", "steps", "batch", "images/s", "speedup", "efficiency", "allreduce",
                "data wait");
  os << line;
  for (const BenchRow& r : rows) {
    std::snprintf(line, sizeof line, "%9d %9d %6lld %7lld %10s %7.2fx %9.0f%% %9.1f%% %9.1f%%\n",
                  r.processes, r.devices, static_cast<long long>(r.steps),
                  static_cast<long long>(r.batch), Rate(r.images_per_s).c_str(), r.speedup,
                  100 * r.efficiency, 100 * r.allreduce_share, 100 * r.data_wait_share);
    os << line;
  }
  for (const BenchRow& r : rows)
    if (!r.note.empty())
      os << "  " << r.devices << (r.devices == 1 ? " replica: " : " replicas: ") << r.note << "\n";
  return os.str();
}

std::string BenchCsv(const std::vector<BenchRow>& rows) {
  std::ostringstream os;
  os << "processes,replicas,steps,global_batch,images_per_s,speedup,efficiency,allreduce_share,"
        "data_wait_share\n";
  for (const BenchRow& r : rows) {
    os << r.processes << "," << r.devices << "," << r.steps << "," << r.batch << ","
       << r.images_per_s << "," << r.speedup << "," << r.efficiency << "," << r.allreduce_share
       << "," << r.data_wait_share << "\n";
  }
  return os.str();
}

}  // namespace cnnflow
