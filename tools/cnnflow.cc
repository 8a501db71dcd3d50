// The cnnflow command line: train, eval, tune, bench, validate, graph, convert, stages.
#include <pthread.h>
#include <semaphore.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <new>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "loaders/source_registry.h"
#include "onnx/converter.h"
#include "ops/collectives/collective_mpi.h"
#include "ops/io/file_write.h"
#include "ops/io/safetensors.h"
#include "ops/layer.h"
#include "ops/trace.h"
#include "ops/train/optimizer.h"
#include "pipeline/bench.h"
#include "pipeline/run_config.h"
#include "pipeline/trainer.h"
#include "pipeline/tuner.h"
#include "pipeline/validate_report.h"
#include "pipeline/yaml_util.h"
#include "stages/resident_data.h"
#include "stages/stage.h"
#include "tools/command_line.h"
#include "tools/convert.h"
#include "tools/export_onnx.h"
#include "tools/import_onnx.h"
#include "tools/launch.h"
#include "tools/models.h"
#include "tools/plot.h"
#include "tools/predict.h"
#include "tools/signals.h"

namespace cnnflow {
namespace {

constexpr const char* kUsage = R"(usage: cnnflow COMMAND [ARGS]

commands:
  train CONFIG [--set key=value ...] [--out RUN_DIR] [--resume RUN_DIR] [--max-restarts N]
        train the model of CONFIG; writes a run folder (config, metrics.csv, weights,
        checkpoints/); --resume continues a run from its newest valid checkpoint.
        --max-restarts N (with --out): if the process fails, run it again from the newest
        checkpoint, at most N times (one process; under mpirun: cnnflow launch).
        Under mpirun/srun, every process trains its shard (rank 0 writes the files).
        --trace FILE [--trace-steps N]: profile training steps [20, 20 + N) (N: 50), write
        them to FILE as a Chrome trace (chrome://tracing, ui.perfetto.dev) and print where
        the time went by category (forward, backward, allreduce, optimizer, load, ...)
        --dump-batches DIR: write each training batch as the model got it to
        DIR/batch-<epoch>-<index>.safetensors (inputs f32, labels i64; process 0's under
        mpirun): a debug dump that cnnflow.Loader's batches are checked against
  launch [--max-restarts N] [-n RANKS] [--mpirun PATH] -- COMMAND...
        gang restart: run COMMAND (cnnflow train ... --out RUN_DIR, or mpirun around it;
        -n RANKS: `mpirun -n RANKS COMMAND`); when any rank fails, relaunch every rank from
        the newest valid checkpoint of RUN_DIR, at most N times (3), each restart logged;
        a job stopped by Ctrl-C (exit 130) is not restarted; `cnnflow launch -h`
  eval CONFIG --weights FILE [--ema] [--set key=value ...]
        evaluate weights (model.safetensors of a run) on the config's test set;
        --ema: its weight average (the ema stage's "ema.*" tensors)
  predict CONFIG --weights FILE [--top K] [--set key=value ...] FILES...
        the K (5) most likely classes of each image or .wav file, with its latency
        (batch 1, on graph.devices' first tensor-parallel group)
  tune CONFIG [--steps N] [--rounds R] [--write] [--set key=value ...]
        train end to end at each load threads x prefetch depth, R interleaved rounds (3) of
        N timed batches (100) after a warm-up; recommend the cheapest setting within noise
        of the fastest, and say whether the loader bounds the run (the loader alone and its
        CPU beside); --write puts the setting into CONFIG
  bench CONFIG [--max-steps S] [--devices 1,2,...] [--warmup W] [--csv FILE]
        [--plot FILE.png|svg] [--set ...]
        data-parallel scaling: S timed steps per replica count at a fixed per-replica
        batch; images/s, speedup, efficiency, all-reduce and data-wait shares (under
        mpirun: across the processes too); --plot draws them against the device count
  export RUN_DIR|CONFIG [--weights FILE] -o MODEL.onnx [--ema] [--check N FILE]
        the model and its weights as ONNX (opset 17), checked by the ONNX checker;
        `cnnflow export -h` lists the options
  import MODEL.onnx -o DIR [--mean m,m,m --std s,s,s]
        a network exported from PyTorch (torch.onnx) as DIR/model.yaml (a run config)
        and DIR/model.safetensors (its weights by PyTorch's names); `cnnflow import -h`
  plot RUN_DIR... -o FILE.png|FILE.svg
        loss and accuracy, train and test, against epochs and steps, runs overlaid
  validate CONFIG [--set key=value ...]
        parse, build and shape-check; print the model and the graphs (one node per
        device for the per-device stages); no training
  graph CONFIG -o FILE.dot|FILE.svg|FILE.png [--set key=value ...]
        draw the train and eval graphs as they run on graph.devices (Graphviz; .svg
        and .png run `dot`, from Debian's graphviz package)
  convert --from folder|idx SRC --to LMDB_DIR [options]
        write a data set as an LMDB of records (cnnflow or Caffe Datum layout);
        `cnnflow convert -h` lists the options
  devices
        the GPUs this build and machine offer (CUDA driver, cuDNN, cuBLAS, NCCL
        versions; each GPU's name, memory and compute capability), or why there are none
  models [NAME|CONFIG] [--set option=value ...]
        the model library (model: {library: NAME, with: {...}}): every network's
        parameters, GFLOPs and options; with NAME (or a config), its layers written
        out flat; `cnnflow models -h` for --check
  stages
        the registered stage types, layer types, data sources and optimizers,
        with their documented parameters

--set overrides a config value by its dotted path: --set train.epochs=1
cnnflow COMMAND --help: that command's usage; cnnflow --version: the version
)";

// The block of kUsage that documents `command` (its line "  COMMAND ..."
// and the indented lines under it); "" when kUsage has none.
std::string UsageBlock(const std::string& command) {
  std::istringstream in(kUsage);
  std::string block;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    const bool heading = line.size() > 2 && line[0] == ' ' && line[1] == ' ' && line[2] != ' ';
    if (heading) {
      if (inside) break;
      inside = line.compare(2, command.size(), command) == 0 &&
               (line.size() == 2 + command.size() || line[2 + command.size()] == ' ');
    } else if (inside && (line.empty() || line[0] != ' ')) {
      break;
    }
    if (inside) block += line + "\n";
  }
  return block;
}

// `cnnflow COMMAND --help`: "usage: cnnflow COMMAND ARGS" and its
// description; the whole usage for no command or an unknown one.
std::string CommandUsage(const std::string& command) {
  const std::string block = command.empty() ? "" : UsageBlock(command);
  if (block.empty()) return kUsage;
  const size_t eol = block.find('\n');
  return StrCat(
      "usage: cnnflow ", block.substr(2, eol - 2), "\n", block.substr(eol + 1),
      block.find("--set") == std::string::npos
          ? ""
          : "\n--set overrides a config value by its dotted path: --set train.epochs=1\n");
}

struct Options {
  std::string command, config, weights, out, resume, csv, trace, plot, dump_batches;
  int64_t trace_steps = 50;
  std::vector<int> devices = {1, 2};
  int64_t warmup = 10;
  int64_t steps = 100;
  int64_t rounds = 3;
  bool write = false;
  bool ema = false;
  std::vector<std::string> sets;
};

Options Parse(int argc, char** argv) {
  Options o;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) throw ConfigError("no command given");
  o.command = args[0];
  CommandLine cmd(std::vector<std::string>(args.begin() + 1, args.end()));
  while (cmd.Next()) {
    if (cmd.Is("--set")) {
      o.sets.push_back(cmd.Value());
    } else if (cmd.Is("--weights")) {
      o.weights = cmd.Value();
    } else if (cmd.Is("--rounds")) {
      o.rounds = cmd.Count();
    } else if (cmd.Is("--steps", "--max-steps")) {
      o.steps = cmd.Count();
    } else if (cmd.Is("--warmup")) {
      o.warmup = cmd.Count();
    } else if (cmd.Is("--csv")) {
      o.csv = cmd.Value();
    } else if (cmd.Is("--plot")) {
      o.plot = cmd.Value();
    } else if (cmd.Is("--devices")) {
      o.devices.clear();
      for (int64_t d : cmd.CountList()) o.devices.push_back(static_cast<int>(d));
    } else if (cmd.Is("--trace")) {
      o.trace = cmd.Value();
    } else if (cmd.Is("--dump-batches")) {
      o.dump_batches = cmd.Value();
    } else if (cmd.Is("--trace-steps")) {
      o.trace_steps = cmd.Count();
    } else if (cmd.Is("--write")) {
      o.write = true;
    } else if (cmd.Is("--ema")) {
      o.ema = true;
    } else if (cmd.Is("--out", "-o")) {
      o.out = cmd.Value();
    } else if (cmd.Is("--resume")) {
      o.resume = cmd.Value();
    } else if (cmd.Is("-h", "--help")) {
      continue;  // Main answers it (here only after an unknown command)
    } else if (!cmd.IsOption() && o.config.empty()) {
      o.config = cmd.arg();
    } else {
      cmd.Reject();
    }
  }
  if (!o.dump_batches.empty() && o.command != "train") {
    throw ConfigError(
        StrCat("--dump-batches dumps `cnnflow train`'s batches, not `cnnflow ", o.command, "`'s"));
  }
  if (!o.trace.empty() && o.command != "train") {
    throw ConfigError(StrCat("--trace profiles `cnnflow train`, not `cnnflow ", o.command, "`"));
  }
  return o;
}

void PrintSchema(const std::string& name, const Schema& s) {
  std::printf("  %s\n      %s\n", name.c_str(), s.doc().c_str());
  for (const auto& p : s.params()) {
    std::string def =
        p.default_value ? "default " + ParamValueToString(*p.default_value) : "required";
    if (!p.choices.empty())
      def += "; one of: " + [&] {
        std::string c;
        for (const auto& x : p.choices) c += (c.empty() ? "" : ", ") + x;
        return c;
      }();
    std::printf("      %-18s %-24s %s (%s)\n", p.name.c_str(), ParamTypeName(p.type), p.doc.c_str(),
                def.c_str());
  }
}

int Stages() {
  std::printf("config sections (configs/*.yaml):\n");
  PrintSchema("(top level)", TopLevelSchema());
  PrintSchema("model", ModelSchema());
  PrintSchema("train", TrainSchema());
  PrintSchema("graph", GraphSectionSchema());
  std::printf("\nstage types (graphs/*.yaml nodes):\n");
  for (const auto& n : StageRegistry::Get().Names())
    PrintSchema(n, StageRegistry::Get().Find(n)->schema);
  std::printf("\nlayer types (model.layers):\n");
  for (const auto& n : LayerRegistry::Get().Names())
    PrintSchema(n, LayerRegistry::Get().Find(n)->schema);
  std::printf("\ndata sources (data.train, data.test):\n");
  for (const auto& n : SourceRegistry::Get().Names())
    PrintSchema(n, SourceRegistry::Get().Find(n)->schema);
  std::printf("\noptimizers (train.optimizer):\n");
  for (const auto& n : OptimizerTypes()) PrintSchema(n, OptimizerSchema(n));
  std::printf("\nlearning-rate schedule (train.schedule):\n");
  PrintSchema("schedule", LrScheduleSchema());
  std::printf("\nONNX ops (cnnflow import maps each to the layer its line names):\n");
  for (const auto& n : onnx_io::OnnxImportRegistry::Get().Names())
    PrintSchema(n, onnx_io::OnnxImportRegistry::Get().Find(n)->schema);
  std::printf("\nONNX export by layer type (cnnflow export writes the nodes its line names):\n");
  for (const auto& n : onnx_io::OnnxExportRegistry::Get().Names()) {
    const onnx_io::OnnxExport* e = onnx_io::OnnxExportRegistry::Get().Find(n);
    PrintSchema(n, e->convert ? e->schema : Schema(StrCat("not exportable: ", e->schema.doc())));
  }
  return 0;
}

// Ctrl-C / SIGTERM / SIGUSR1: finish the step, checkpoint, exit 130.
// SIGUSR1 is the stop of a launcher outside mpirun (`cnnflow launch`
// growing the job, or a scheduler's `--signal=USR1`): Open MPI's mpirun
// passes SIGUSR1 on to every rank and waits for them, where a SIGTERM to it
// is followed by a SIGKILL to the ranks 1 s later (odls_base_sigkill_timeout),
// too soon for a step and a checkpoint of any size. The signals are
// blocked in every thread the run creates (the mask is set before any of
// them starts), so a signal handler never interrupts a kernel, an
// allocator or a collective. One watcher thread keeps them unblocked: the
// handler only counts and posts a semaphore, and the watcher asks the
// trainer to stop. A second signal ends the process at once (exit 128 +
// the signal: 130 for Ctrl-C): checkpoints are written under a temporary
// name and renamed, so one cut short leaves only a temporary file, which
// --resume ignores. The watcher stays alive for that second signal: were
// it to end, every thread would block the signal and it would wait,
// pending, until the step and the checkpoint were done. (Threads that
// libraries start as they load, OpenBLAS's, keep the signals unblocked and
// may run the handler too: it is async-signal-safe, and SA_RESTART resumes
// what it interrupts.)
std::atomic<int> g_signals{0};
sem_t g_signal_sem;

extern "C" void OnSignal(int sig) {
  if (g_signals.fetch_add(1) > 0) {
    constexpr char kMsg[] = "\ncnnflow: second signal: quitting at once\n";
    [[maybe_unused]] const ssize_t n = write(STDERR_FILENO, kMsg, sizeof kMsg - 1);
    _exit(128 + sig);
  }
  sem_post(&g_signal_sem);
}

void BlockStopSignals() {
  sem_init(&g_signal_sem, 0, 0);
  HandleSignals(OnSignal, {SIGINT, SIGTERM, SIGUSR1});
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

// The run a stop request goes to; null before and after it. A signal can
// come after Train() is done with the Trainer (mpirun SIGTERMs the ranks
// still exiting when one exits non-zero, e.g. 130): the watcher must then
// find nothing to stop, not a destroyed Trainer.
std::mutex g_stop_mu;
Trainer* g_stop_target = nullptr;  // guarded by g_stop_mu

// Points stop requests at `trainer` for this object's lifetime (declare it
// after the Trainer, so that it ends first).
class StopTarget {
 public:
  explicit StopTarget(Trainer& trainer) {
    const std::lock_guard<std::mutex> lock(g_stop_mu);
    g_stop_target = &trainer;
  }
  ~StopTarget() {
    const std::lock_guard<std::mutex> lock(g_stop_mu);
    g_stop_target = nullptr;
  }
  StopTarget(const StopTarget&) = delete;
  StopTarget& operator=(const StopTarget&) = delete;
};

void WatchSignals() {
  std::thread([] {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
    while (sem_wait(&g_signal_sem) != 0) {
    }
    {
      const std::lock_guard<std::mutex> lock(g_stop_mu);
      if (g_stop_target != nullptr) {
        std::fprintf(stderr,
                     "\ncnnflow: stopping: finishing the step and saving a checkpoint "
                     "(signal again to quit at once)\n");
        g_stop_target->RequestStop();
      }
    }
    // Keep the signals unblocked in this thread: the next one ends the
    // process in OnSignal.
    for (;;) pause();
  }).detach();
}

int Train(const Options& o) {
  // Before any thread of the run exists (TBB's, MPI's, the replicas'), so
  // that they inherit the mask (see WatchSignals).
  BlockStopSignals();
  MpiWorld::Get();
  Trainer trainer(LoadRunConfig(o.config, o.sets));
  const bool rank0 = trainer.context().process_rank == 0;
  Progress progress = Progress::ForStderr();
  if (rank0) trainer.set_progress(&progress);
  if (!o.resume.empty()) trainer.Resume(o.resume);
  const StopTarget stop_target(trainer);
  WatchSignals();
  // Past the first steps (allocations, caches, autotune's first moves).
  constexpr int64_t kTraceWarmupSteps = 20;
  if (!o.trace.empty()) Tracer::TraceSteps(kTraceWarmupSteps, kTraceWarmupSteps + o.trace_steps);
  if (!o.dump_batches.empty() && rank0) {
    std::filesystem::create_directories(o.dump_batches);
    trainer.set_batch_observer([&o](const BatchMessage& m, const PassMetrics&) {
      const auto n = static_cast<int64_t>(m.labels.size());
      SaveSafetensors(
          StrCat(o.dump_batches, "/batch-", m.epoch, "-", m.index, ".safetensors"),
          {{"inputs", m.inputs}, {"labels", LabelTensor(m.labels.data(), n, Device::Cpu())}});
    });
  }
  EpochReport r = trainer.Train(o.out);
  if (!o.trace.empty()) {
    Tracer::Stop();  // a run shorter than the window ends its trace here
    if (rank0) {
      Tracer::WriteChromeTrace(o.trace);
      std::printf("profile of training steps %lld..%lld (written to %s):\n%s",
                  static_cast<long long>(kTraceWarmupSteps),
                  static_cast<long long>(kTraceWarmupSteps + o.trace_steps - 1), o.trace.c_str(),
                  Tracer::Summary().c_str());
    }
  }
  if (trainer.control().stop_requested.load()) {
    if (rank0) {
      std::printf(
          "stopped by a signal in epoch %lld after %lld steps; checkpoint in %s "
          "(continue with --resume %s)\n",
          static_cast<long long>(r.epoch), static_cast<long long>(trainer.global_step()),
          trainer.run_dir().c_str(), trainer.run_dir().c_str());
    }
    return 130;
  }
  if (rank0) {
    if (r.test.samples > 0) {
      std::printf(
          "done after epoch %lld: test accuracy %.2f%% of %lld samples, test loss %.4f; run folder "
          "%s\n",
          static_cast<long long>(r.epoch), 100 * r.test.accuracy(),
          static_cast<long long>(r.test.samples), r.test.mean_loss(), trainer.run_dir().c_str());
    } else {
      std::printf(
          "done after epoch %lld: train accuracy %.2f%%, train loss %.4f (no test set); "
          "run folder %s\n",
          static_cast<long long>(r.epoch), 100 * r.train.accuracy(), r.train.mean_loss(),
          trainer.run_dir().c_str());
    }
  }
  return 0;
}

int Eval(const Options& o) {
  if (o.weights.empty()) throw ConfigError("eval needs --weights FILE (a run's model.safetensors)");
  Trainer trainer(LoadRunConfig(o.config, o.sets));
  trainer.LoadWeights(o.weights, o.ema ? kEmaPrefix : "");
  Progress progress = Progress::ForStderr();
  trainer.set_progress(&progress);
  PassMetrics m = trainer.Evaluate();
  // Under mpirun every rank evaluated its shard and holds the whole's
  // counts; rank 0 reports them.
  if (MpiWorld::Get().rank() != 0) return 0;
  std::printf("test accuracy %.2f%% (%lld of %lld samples), test loss %.10f (%.0f img/s)\n",
              100 * m.accuracy(), static_cast<long long>(m.correct),
              static_cast<long long>(m.samples), m.mean_loss(), m.samples_per_second());
  return 0;
}

int Tune(const Options& o) {
  Trainer trainer(LoadRunConfig(o.config, o.sets));
  std::vector<int64_t> threads;
  for (int64_t t = 1; t <= trainer.config().threads; ++t) threads.push_back(t);
  std::printf("tuning the loader of %s: %lld timed batches of %lld per run, %lld rounds\n",
              o.config.c_str(), static_cast<long long>(o.steps),
              static_cast<long long>(trainer.config().batch), static_cast<long long>(o.rounds));
  const TuneReport report =
      TuneLoader(trainer, threads, {1, 2, 4, 8}, o.steps, static_cast<int>(o.rounds));
  std::printf("%s", report.ToString().c_str());
  if (o.write) {
    const TuneSetting& best = report.settings[report.best];
    std::ifstream in(o.config);
    std::stringstream text;
    text << in.rdbuf();
    std::string edited = SetYamlScalar(text.str(), "graph.load_threads",
                                       std::to_string(best.load_threads), o.config);
    edited = SetYamlScalar(edited, "graph.prefetch", std::to_string(best.prefetch), o.config);
    // Replaced in one step: a crash or a full disk leaves the old config or the new one.
    WriteFileAtomically(o.config, edited);
    std::printf("wrote graph.load_threads: %lld and graph.prefetch: %lld into %s\n",
                static_cast<long long>(best.load_threads), static_cast<long long>(best.prefetch),
                o.config.c_str());
  }
  return 0;
}

int Bench(const Options& o) {
  MpiWorld& world = MpiWorld::Get();
  BenchOptions b;
  b.config = o.config;
  b.overrides = o.sets;
  b.devices = o.devices;
  b.steps = o.steps;
  b.warmup = o.warmup;
  if (LoadRunConfig(o.config, o.sets).pipeline) {
    if (!o.plot.empty())
      throw ConfigError("--plot draws data-parallel scaling; this config is a pipeline");
    const PipelineBench p = RunPipelineBench(b);
    if (world.rank() == 0) {
      std::printf("%s: %lld timed steps after %lld warm-up\n%s", o.config.c_str(),
                  static_cast<long long>(o.steps), static_cast<long long>(o.warmup),
                  p.ToString().c_str());
    }
    return 0;
  }
  const std::vector<BenchRow> rows = RunScalingBench(b);
  if (world.rank() != 0) return 0;
  std::printf("%s: %lld timed steps after %lld warm-up, %lld samples per replica per step\n%s",
              o.config.c_str(), static_cast<long long>(o.steps), static_cast<long long>(o.warmup),
              static_cast<long long>(rows[0].batch / rows[0].devices / rows[0].processes),
              BenchTable(rows).c_str());
  std::printf(
      "every row shares the config's thread budget among its replicas; allreduce: waiting "
      "for gradient reductions after backward; data wait: the step idle between batches\n");
  if (!o.csv.empty()) {
    WriteFileAtomically(o.csv, BenchCsv(rows));
    std::printf("wrote %s\n", o.csv.c_str());
  }
  if (!o.plot.empty()) {
    PlotScaling(rows, o.plot, o.config);
    std::printf("wrote %s\n", o.plot.c_str());
  }
  return 0;
}

int Validate(const Options& o) {
  RunConfig config = LoadRunConfig(o.config, o.sets);
  // A GPU config checked where there is no GPU (a login node): the model,
  // shapes and graph are checked on the CPU instead.
  std::string note;
  const RunConfig as_written = config;  // its GPUs' memory is predicted all the same
  if (config.devices[0].is_cuda() && config.devices[0].index >= CudaDeviceCount()) {
    note = StrCat("note: ", config.devices[0].ToString(), " is not here (", CudaDeviceCount(),
                  " GPUs found): checked on the CPU in fp32, a CPU device per listed GPU\n");
    // A device per listing: a pipeline keeps its stages, a tensor-parallel
    // group its members.
    for (size_t i = 0; i < config.devices.size(); ++i)
      config.devices[i] = Device::Cpu(static_cast<int>(i));
    config.threads = std::max<int>(config.threads, static_cast<int>(config.devices.size()));
    config.data_parallel.compute = DType::kF32;
    config.pipeline_options.compute.reset();
  }
  Trainer trainer(std::move(config));
  // The resident set the trainer made, or (checked on the CPU) would make.
  const RunContext& run = trainer.context();
  const int64_t resident = run.resident   ? static_cast<int64_t>(run.resident->bytes())
                           : note.empty() ? 0
                                          : PredictResidentBytes(as_written, run.dataset("train"));
  std::printf("%s: ok\n%s%s%s%s%s", o.config.c_str(), note.c_str(), trainer.Describe().c_str(),
              DescribeGpuFusion(as_written, trainer.model()).c_str(),
              DescribeCudaGraph(as_written, trainer.model()).c_str(),
              DescribeGpuMemory(EstimateGpuMemory(as_written, trainer.model(), resident)).c_str());
  return 0;
}

int Graph(const Options& o) {
  if (o.out.empty()) throw ConfigError("cnnflow graph needs -o FILE.dot, FILE.svg or FILE.png");
  // .dot as it is; .svg and .png drawn by Graphviz's dot (-Tsvg, -Tpng).
  const std::string ext = std::filesystem::path(o.out).extension().string();
  const bool dot = ext == ".dot";
  if (!dot && ext != ".svg" && ext != ".png") {
    throw ConfigError(StrCat("-o ", o.out, ": the file must end in .dot, .svg or .png"));
  }
  const RunConfig config = LoadRunConfig(o.config, o.sets);
  std::vector<std::string> devices;
  for (const Device& d : config.devices) devices.push_back(d.ToString());
  const std::string text =
      StrCat("digraph \"", config.name, "\" {\n  rankdir=LR;\n  node [shape=box];\n",
             config.train_graph.ToDot(devices), config.eval_graph.ToDot(devices), "}\n");
  // Written beside the target and renamed: a failed run leaves no torn file.
  if (dot) {
    WriteFileAtomically(o.out, text);
  } else {
    const std::string tmp = o.out + ".tmp";
    const std::string dot_file = o.out + ".tmp.dot";
    WriteFileAtomically(dot_file, text);
    const std::string format = "-T" + ext.substr(1);
    const std::vector<std::string> args = {"dot", format, dot_file, "-o", tmp};
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    pid_t pid = 0;
    int status = 0;
    const int err = posix_spawnp(&pid, "dot", nullptr, nullptr, argv.data(), environ);
    const bool ok = err == 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
                    WEXITSTATUS(status) == 0;
    std::remove(dot_file.c_str());
    if (!ok) {
      std::remove(tmp.c_str());
      throw Error(err != 0 ? StrCat("cannot run Graphviz's `dot` (", std::strerror(err),
                                    "): apt-get install graphviz, or write -o FILE.dot")
                           : StrCat("`dot ", format, "` failed on the graphs of ", o.config));
    }
    if (std::rename(tmp.c_str(), o.out.c_str()) != 0) {
      throw Error(StrCat("cannot rename ", tmp, " to ", o.out, ": ", std::strerror(errno)));
    }
  }
  std::printf("wrote %s: the train and eval graphs of %s on %zu device(s)\n", o.out.c_str(),
              o.config.c_str(), devices.size());
  return 0;
}

int Main(int argc, char** argv) {
  const std::string first = argc >= 2 ? argv[1] : "";
  if (first == "--version" || first == "-V" || first == "version") {
    return std::printf("cnnflow %s\n", CNNFLOW_VERSION), 0;
  }
  // Commands with their own arguments (and their own --help), each in its own file.
  if (first == "convert") return RunConvert(std::vector<std::string>(argv + 2, argv + argc));
  if (first == "plot") return RunPlot(std::vector<std::string>(argv + 2, argv + argc));
  if (first == "export") return RunExport(std::vector<std::string>(argv + 2, argv + argc));
  if (first == "import") return RunImport(std::vector<std::string>(argv + 2, argv + argc));
  if (first == "launch") return RunLaunch(std::vector<std::string>(argv + 2, argv + argc));
  if (first == "models") return RunModels(std::vector<std::string>(argv + 2, argv + argc));
  // --help / -h anywhere (and `help [COMMAND]`): the command's usage (or
  // the whole usage), on stdout, and success.
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h" || (i == 1 && a == "help")) {
      const std::string command = first == "help" ? (argc >= 3 ? argv[2] : "") : first;
      if (command == "convert") return RunConvert({"--help"});
      if (command.empty() || command[0] == '-' || !UsageBlock(command).empty()) {
        return std::printf("%s", CommandUsage(command == "help" ? "" : command).c_str()), 0;
      }
      if (first != "help") break;  // an unknown command: the error below
      std::fprintf(stderr, "cnnflow: unknown command '%s'\n\n%s", command.c_str(), kUsage);
      return 2;
    }
  }
  if (argc >= 2 && std::string(argv[1]) == "predict") {
    return RunPredict(std::vector<std::string>(argv + 2, argv + argc));
  }
  if (first == "train") {
    const std::vector<std::string> rest(argv + 2, argv + argc);
    for (const std::string& a : rest) {
      if (a == "--max-restarts" || a.rfind("--max-restarts=", 0) == 0)
        return RunTrainWithRestarts(rest);
    }
  }
  Options o;
  try {
    o = Parse(argc, argv);
  } catch (const ConfigError& e) {
    std::fprintf(stderr, "cnnflow: %s\n\n%s", e.what(), CommandUsage(first).c_str());
    return 2;
  }
  if (o.command == "stages") return Stages();
  if (o.command == "devices") {
    std::printf("cpu:K: host threads (threads: in the config); %s", DescribeCuda().c_str());
    return 0;
  }
  if (o.command != "train" && o.command != "eval" && o.command != "validate" &&
      o.command != "tune" && o.command != "bench" && o.command != "graph") {
    std::fprintf(stderr, "cnnflow: unknown command '%s'\n\n%s", o.command.c_str(), kUsage);
    return 2;
  }
  if (o.config.empty()) {
    std::fprintf(stderr, "cnnflow %s: needs a CONFIG file\n\n%s", o.command.c_str(),
                 CommandUsage(o.command).c_str());
    return 2;
  }
  try {
    if (o.command == "train") return Train(o);
    if (o.command == "eval") return Eval(o);
    if (o.command == "tune") return Tune(o);
    if (o.command == "bench") return Bench(o);
    if (o.command == "graph") return Graph(o);
    return Validate(o);
  } catch (const std::bad_alloc&) {
    // An allocation outside the tensor pools and the layers (those name
    // themselves, ops/device.cc and ops/model.cc).
    std::fprintf(stderr,
                 "\ncnnflow %s: error: out of memory (std::bad_alloc); use a smaller batch "
                 "(train.batch) or fewer replicas per process\n",
                 o.command.c_str());
    TellLauncherOfFailure("out of memory (std::bad_alloc)");
    return 1;
  } catch (const std::exception& e) {
    // In an MPI job every rank reports its own error, naming itself.
    const MpiWorld& world = MpiWorld::Get();
    const std::string rank =
        world.active() ? StrCat("rank ", world.rank(), " of ", world.size(), ": ") : "";
    std::fprintf(stderr, "\ncnnflow %s: %serror: %s\n", o.command.c_str(), rank.c_str(), e.what());
    TellLauncherOfFailure(StrCat(rank, e.what()));
    return 1;
  }
}

}  // namespace
}  // namespace cnnflow

int main(int argc, char** argv) { return cnnflow::Main(argc, argv); }
