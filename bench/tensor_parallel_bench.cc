// tensor_parallel_bench: inference latency of one wide layer split over two
// CPU "devices" (TensorParallelShard, ops/parallel/tensor_parallel.h)
// against the unsplit layer, the case tensor parallelism is for (latency at
// small batch). On one machine a CPU device is a share of its cores, so the
// figures to read are the scaling (2 devices of 1 thread against 1 device
// of 1 thread) and the price of splitting (against 1 device that holds both
// threads).
//
//   1x1:    the unsplit layer in an arena of 1 thread
//   1x2:    the unsplit layer in an arena of 2 threads
//   column: 2 members (own thread, own arena of 1), output channels split,
//           then the all-gather
//   row:    2 members, input channels split, then the all-reduce
//   spatial: 2 members, output rows split (each reads its input rows and a
//           halo), then the all-gather
//   halves-alone: each member's half of the layer (K/2 output channels) on
//           its own thread, no collective, no copy: what the two cores give
//           when nothing is shared, the limit the splits are measured
//           against
//
// Every round runs every setting once, alternating; the median of --reps
// rounds after one warm-up round (which also makes the kernel picks).
//
// Under `mpiexec -n 2` the group spans the two processes instead, one
// member (one thread) each, and only the split settings run (mpi-column,
// mpi-row; rank 0 prints): a TP group across processes or nodes.
//
// With --config FILE (a config with graph.tensor_parallel, e.g.
// bench/configs/resnet18_224_tensor_parallel.yaml) it times the whole model
// instead, through ReplicaSet as training and `cnnflow predict` run it:
//   infer  1x1, 1x2, tp2 (Infer on the group: 2 members of 1 thread);
//   train  1x1, 1x2, dp2 (2 data-parallel replicas of 1 thread, half the
//          batch each), tp2 (the group of 2 on the whole batch): a step's
//          forward, backward, all-reduce and optimizer, as images/s.
//
// With --device cuda:K as well, every replica and member is a lane of that
// GPU (ops/device.h); a forward or a step is timed to the end of its GPU
// work (1x2 is then the same as 1x1, and is left out).
//
// Usage: tensor_parallel_bench [--reps R] [--batch 1,8] [--channels C] [--size S]
//                              [--config FILE --train-batch B [--trace 1] [--device cuda:0]]
// One line per setting: setting=... batch=... ms=... (median) runs=...
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ops/collectives/collective.h"
#include "ops/collectives/collective_mpi.h"
#include "ops/cpu/isa.h"
#include "ops/layer.h"
#include "ops/parallel/data_parallel.h"
#include "ops/parallel/member_threads.h"
#include "ops/parallel/tensor_parallel.h"
#include "ops/random.h"
#include "ops/trace.h"
#include "ops/train/optimizer.h"
#include "pipeline/run_config.h"

namespace cnnflow {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
}

std::vector<int64_t> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  size_t i = 0;
  while (i < s.size()) {
    const size_t j = s.find(',', i);
    out.push_back(std::stoll(s.substr(i, j - i)));
    i = j == std::string::npos ? s.size() : j + 1;
  }
  return out;
}

std::string CpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "?";
}

double Ms(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Each setting once a round (reversed every other round), after a warm-up
// round; prints the medians (when `print`), with the ratios to the first
// `bases` settings' (1x1 and 1x2: the scaling and the price of splitting).
void TimeSettings(const std::string& what, int64_t n, int reps,
                  const std::vector<std::pair<std::string, std::function<void()>>>& settings,
                  int64_t images = 0, size_t bases = 2, bool print = true) {
  std::vector<std::vector<double>> ms(settings.size());
  for (int rep = 0; rep <= reps; ++rep) {
    for (size_t k = 0; k < settings.size(); ++k) {
      const size_t i = rep % 2 ? settings.size() - 1 - k : k;
      const double t = Ms(settings[i].second);
      if (rep > 0) ms[i].push_back(t);
    }
  }
  for (size_t i = 0; i < settings.size() && print; ++i) {
    std::string runs;
    for (double t : ms[i]) {
      char v[32];
      std::snprintf(v, sizeof v, "%s%.2f", runs.empty() ? "" : ",", t);
      runs += v;
    }
    const double m = Median(ms[i]);
    std::printf("%s setting=%s batch=%lld ms=%.2f", what.c_str(), settings[i].first.c_str(),
                static_cast<long long>(n), m);
    if (images > 0) std::printf(" img_per_s=%.1f", images / m * 1e3);
    for (size_t b = 0; b < bases && b < settings.size(); ++b) {
      std::printf(" vs_%s=%.2fx", settings[b].first.c_str(), Median(ms[b]) / m);
    }
    std::printf(" runs=%s\n", runs.c_str());
  }
  std::fflush(stdout);
}

// --config: the whole model (see the top of the file).
int RunModel(const std::string& path, int reps, const std::vector<int64_t>& batches,
             int64_t train_batch, bool trace, Device device) {
  const RunConfig c = LoadRunConfig(path);
  CNNFLOW_ENFORCE(c.data_parallel.tensor_parallel == 2, path,
                  ": needs graph.tensor_parallel.size 2");
  std::printf(
      "# tensor_parallel_bench --config %s: %zu layers, %zu split; cpu %s, ISA %s, %u "
      "hardware threads\n",
      path.c_str(), c.layers.size(), c.data_parallel.split_layers.size(), CpuModel().c_str(),
      cpu::IsaName(cpu::MaxIsa()), std::thread::hardware_concurrency());
  const bool gpu = device.is_cuda();
  if (gpu)
    std::printf("# on %s, a lane per replica:\n%s", device.ToString().c_str(),
                DescribeCuda().c_str());
  auto make = [&](int replicas, int tp) {
    DataParallelOptions o = c.data_parallel;  // the config's math (graph.tf32, ...)
    o.replicas = replicas;
    o.threads_per_replica = 1;
    o.tensor_parallel = tp;
    if (tp == 1) o.split_layers.clear();
    o.timeout_s = 600;
    o.devices.assign(replicas, device);
    return std::make_unique<ReplicaSet>(c.layers, c.input_shape, c.seed, c.init, c.optimizer, o,
                                        MpiWorld::Get());
  };
  auto one = make(1, 1), dp = make(2, 1), tp = make(2, 2);
  tbb::task_arena arena1(1), arena2(2);
  Rng rng(3);
  auto batch = [&](int64_t n) {
    Tensor x = Tensor::Empty(c.input_shape.WithBatch(n));
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<float>()[i] = static_cast<float>(rng.Uniform(-1, 1));
    return x;
  };
  ForwardContext infer;
  infer.training = false;
  infer.keep_activations = false;
  // Every lane of the GPU done (a GPU's work is asynchronous).
  auto done = [&](ReplicaSet& set) {
    for (int r = 0; r < set.size(); ++r) {
      const GpuLaneScope lane(set.lane(r));
      SynchronizeDevice(set.device(r));
    }
  };
  for (int64_t n : batches) {
    const Tensor x = batch(n).To(device);
    std::vector<std::pair<std::string, std::function<void()>>> settings = {
        {"1x1", [&] { arena1.execute([&] { one->Infer(x, infer); }); }},
        {"1x2", [&] { arena2.execute([&] { one->Infer(x, infer); }); }},
        {"tp2", [&] { tp->Infer(x, infer); }}};
    if (gpu) {
      settings = {{"1x1", [&] { one->Infer(x, infer), done(*one); }},
                  {"tp2", [&] { tp->Infer(x, infer), done(*tp); }}};
    }
    TimeSettings("infer", n, reps, settings);
    if (trace) {  // where tp2's time goes, by span (ops/trace.h)
      for (auto* set : {one.get(), tp.get()}) {
        Tracer::Start();
        for (int i = 0; i < 3; ++i) arena1.execute([&] { set->Infer(x, infer); });
        Tracer::Stop();
        std::printf("# trace of 3 forwards, %s:\n%s\n", set == tp.get() ? "tp2" : "1x1",
                    Tracer::Summary().c_str());
      }
    }
  }
  // Training: every replica on a thread of its own, as forward_backward runs them.
  const Tensor x = batch(train_batch);
  std::vector<int64_t> labels(train_batch), ids(train_batch);
  for (int64_t i = 0; i < train_batch; ++i)
    labels[i] = static_cast<int64_t>(rng.NextU64() % 1000), ids[i] = i;
  int64_t step = 0;
  auto train = [&](ReplicaSet& set, tbb::task_arena* arena) {
    const int groups = set.data_parallel(), members = set.tensor_parallel();
    auto run = [&](int r) {
      const int g = r / members;
      const int64_t b = train_batch * g / groups, e = train_batch * (g + 1) / groups;
      ForwardContext ctx{true, 1, step, ids.data() + b};
      set.ForwardBackward(r, x.Slice(b, e), labels.data() + b, ctx,
                          1.0 / (static_cast<double>(train_batch) * members), 0, true);
      set.Step(r, 0.01);
    };
    if (arena != nullptr) {
      arena->execute([&] { run(0); });
    } else {
      std::vector<std::thread> threads;
      for (int r = 0; r < set.size(); ++r) threads.emplace_back(run, r);
      for (auto& t : threads) t.join();
    }
    if (gpu) done(set);
    ++step;
  };
  std::vector<std::pair<std::string, std::function<void()>>> settings = {
      {"1x1", [&] { train(*one, &arena1); }},
      {"1x2", [&] { train(*one, &arena2); }},
      {"dp2", [&] { train(*dp, nullptr); }},
      {"tp2", [&] { train(*tp, nullptr); }}};
  if (gpu) settings.erase(settings.begin() + 1);
  TimeSettings("train", train_batch, reps, settings, train_batch);
  return 0;
}

int Main(int argc, char** argv) {
  int reps = 7;
  std::vector<int64_t> batches{1, 8};
  int64_t channels = 256, size = 64, train_batch = 8;
  std::string config;
  Device device = Device::Cpu();
  bool trace = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--reps")
      reps = std::stoi(v);
    else if (a == "--batch")
      batches = ParseList(v);
    else if (a == "--channels")
      channels = std::stoll(v);
    else if (a == "--size")
      size = std::stoll(v);
    else if (a == "--config")
      config = v;
    else if (a == "--trace")
      trace = v == "1";
    else if (a == "--train-batch")
      train_batch = std::stoll(v);
    else if (a == "--device")
      device = Device::Parse(v);
    else {
      std::fprintf(
          stderr,
          "usage: tensor_parallel_bench [--reps R] [--batch 1,8] [--channels C] [--size S] "
          "[--config FILE --train-batch B [--device cuda:K]]\n");
      return 2;
    }
  }
  if (!config.empty()) return RunModel(config, reps, batches, train_batch, trace, device);
  std::printf(
      "# tensor_parallel_bench: conv2d %lld->%lld 3x3 pad 1 on %lldx%lld, forward (inference); "
      "cpu %s, ISA %s, %u hardware threads\n",
      static_cast<long long>(channels), static_cast<long long>(channels),
      static_cast<long long>(size), static_cast<long long>(size), CpuModel().c_str(),
      cpu::IsaName(cpu::MaxIsa()), std::thread::hardware_concurrency());
  Args args;
  args.Set("out", channels);
  args.Set("kernel", int64_t{3});
  args.Set("pad", int64_t{1});
  const LayerType* type = LayerRegistry::Get().Find("conv2d");
  args.FillDefaults(type->schema);
  const Shape in{channels, size, size};
  auto full = type->create("wide", args);
  const Shape out = full->Build({in}, DType::kF32);
  Rng rng(1);
  full->ResetParameters(rng);
  ForwardContext ctx;
  ctx.training = false;

  MpiWorld& world = MpiWorld::Get();
  const bool mpi = world.active() && world.size() == 2;
  if (world.active() && !mpi) {
    std::fprintf(stderr, "tensor_parallel_bench: run it on its own or with mpiexec -n 2\n");
    return 2;
  }
  // In-process: 2 members in this process; under MPI: 1 here, 1 there.
  const int members = mpi ? 1 : 2;
  std::unique_ptr<Collective> group;
  if (mpi) {
    group = std::make_unique<HierarchicalAllReduce>(1, world, 60);
  } else {
    group = std::make_unique<LocalGroup>(2, 60, "tp bench");
  }
  std::vector<std::unique_ptr<TensorParallelShard>> column, row, spatial;
  for (int r = 0; r < members; ++r) {
    column.push_back(std::make_unique<TensorParallelShard>("wide", "conv2d", args, in,
                                                           TensorSplit::kColumn, *group, r));
    row.push_back(std::make_unique<TensorParallelShard>("wide", "conv2d", args, in,
                                                        TensorSplit::kRow, *group, r));
    spatial.push_back(std::make_unique<TensorParallelShard>("wide", "conv2d", args, in,
                                                            TensorSplit::kSpatial, *group, r));
    column[r]->LoadFull(full->parameters());
    row[r]->LoadFull(full->parameters());
    spatial[r]->LoadFull(full->parameters());
  }
  // The hardware's limit for the column split: each member's half of the
  // layer on its own thread, with no collective and no copy.
  Args half_args = args;
  half_args.Set("out", channels / 2);
  std::vector<std::unique_ptr<Layer>> halves;
  for (int r = 0; r < members; ++r) {
    halves.push_back(type->create("half", half_args));
    halves.back()->Build({in}, DType::kF32);
    halves.back()->ResetParameters(rng);
  }
  tbb::task_arena one(1), two(2);
  MemberThreads threads(members);
  std::vector<std::unique_ptr<tbb::task_arena>> arenas;
  for (int r = 0; r < members; ++r) arenas.push_back(std::make_unique<tbb::task_arena>(1));
  for (int64_t n : batches) {
    Tensor x = Tensor::Empty(in.WithBatch(n));
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data<float>()[i] = static_cast<float>(rng.Uniform(-1, 1));
    Tensor y = Tensor::Empty(out.WithBatch(n));
    std::vector<Tensor> ys{Tensor::Empty(out.WithBatch(n)), Tensor::Empty(out.WithBatch(n))};
    const Shape half_out = Shape({channels / 2, size, size}).WithBatch(n);
    std::vector<Tensor> half_ys{Tensor::Empty(half_out), Tensor::Empty(half_out)};
    auto split = [&](std::vector<std::unique_ptr<TensorParallelShard>>& shards) {
      threads.Run([&](int r) { arenas[r]->execute([&] { shards[r]->Forward(x, ys[r], ctx); }); });
    };
    std::vector<std::pair<std::string, std::function<void()>>> settings{
        {"1x1", [&] { one.execute([&] { full->Forward({&x}, y, ctx); }); }},
        {"1x2", [&] { two.execute([&] { full->Forward({&x}, y, ctx); }); }},
        {"column", [&] { split(column); }},
        {"row", [&] { split(row); }},
        {"spatial", [&] { split(spatial); }},
        {"halves-alone",
         [&] {
           threads.Run([&](int r) {
             arenas[r]->execute([&] { halves[r]->Forward({&x}, half_ys[r], ctx); });
           });
         }},
    };
    if (mpi) {  // the processes time the split settings only, together
      settings = {{"mpi-column", [&] { split(column); }},
                  {"mpi-row", [&] { split(row); }},
                  {"mpi-spatial", [&] { split(spatial); }}};
    }
    // Under MPI the processes time the split settings together; rank 0 prints.
    TimeSettings("layer", n, reps, settings, 0, mpi ? 0 : 2, !mpi || world.rank() == 0);
  }
  return 0;
}

}  // namespace
}  // namespace cnnflow

int main(int argc, char** argv) { return cnnflow::Main(argc, argv); }
