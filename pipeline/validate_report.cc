#include "pipeline/validate_report.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <sstream>
#include <vector>

#include "loaders/augment.h"
#include "loaders/dataset.h"
#include "ops/device.h"
#include "ops/layers/batch_norm.h"
#include "ops/layers/conv2d.h"
#include "ops/layers/dropout.h"
#include "ops/layers/linear.h"
#include "ops/model.h"
#include "ops/parallel/data_parallel.h"
#include "ops/parallel/pipeline_model.h"
#include "ops/parallel/tensor_parallel.h"
#include "ops/train/optimizer.h"

namespace cnnflow {
namespace {

// The machine's physical memory (MemTotal of /proc/meminfo), 0 when unknown.
double MachineMemoryMb() {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<double>(pages) * static_cast<double>(page) / 1e6 : 0;
}

// The tensor-parallel part: per device FLOPs and bytes, and whether the
// split can pay at this machine's measured rates.
std::string DescribeTensorParallel(const RunConfig& config, ReplicaSet& replicas) {
  const int tp = replicas.tensor_parallel();
  Model& m = replicas.model(0);
  const int64_t n = config.batch;  // a group's rows a step
  std::ostringstream os;
  char line[256];
  std::snprintf(
      line, sizeof line,
      "tensor parallel: groups of %d devices, %d data-parallel replica(s); per device and "
      "training step (batch %lld, forward + backward ~ 3x forward):\n",
      tp, replicas.data_parallel(), static_cast<long long>(n));
  os << line;
  std::snprintf(line, sizeof line, "  %-12s %-7s %-18s %16s %18s\n", "layer", "split",
                "collectives", "GFLOPs/device", "MB sent/device");
  os << line;
  double device_flops = 0, bytes = 0, largest = 0;
  for (int i = 0; i < m.num_layers(); ++i) {
    const Layer& l = m.layer(i);
    const auto* s = dynamic_cast<const TensorParallelLayer*>(&l);
    if (s == nullptr) {
      device_flops += 3.0 * static_cast<double>(l.ForwardFlops(n));
      continue;
    }
    const TensorParallelShard& shard = s->shard();
    const double f = 3.0 * static_cast<double>(s->MemberFlops(n));
    const double b =
        static_cast<double>(s->CommunicatedBytes(n, false) + s->CommunicatedBytes(n, true));
    device_flops += f;
    bytes += b;
    largest =
        std::max<double>(largest, static_cast<double>(std::max(s->CommunicatedBytes(n, false),
                                                               s->CommunicatedBytes(n, true))));
    // Column and spatial: y all-gathered (unless a row layer reads it), dx
    // summed; row: y summed, dx all-gathered (unless it feeds a column
    // layer's backward).
    const bool row = shard.split() == TensorSplit::kRow;
    const std::string collectives = !row ? (shard.local_output() ? "dx sum" : "y gather, dx sum")
                                         : (shard.local_input() ? "y sum" : "y sum, dx gather");
    std::snprintf(line, sizeof line, "  %-12s %-7s %-18s %16.3f %18.2f\n", l.name().c_str(),
                  TensorSplitName(shard.split()), collectives.c_str(), f / 1e9, b / 1e6);
    os << line;
  }
  const double whole = 3.0 * static_cast<double>(m.ForwardFlops(n));
  std::snprintf(line, sizeof line,
                "  per device: %.3f GFLOPs of the model's %.3f (%.0f%%), %.2f MB through the "
                "group's collectives a step\n",
                device_flops / 1e9, whole / 1e9, 100 * device_flops / whole, bytes / 1e6);
  os << line;
  // Whether it can pay: the collectives' time at this machine's measured
  // all-reduce bandwidth against the compute at its measured GEMM rate.
  const TensorParallelCost cost = MeasureTensorParallelCost(
      tp, static_cast<int64_t>(largest),
      std::max(1, config.threads / static_cast<int>(config.devices.size())));
  const double comm_ms = bytes / (cost.allreduce_gb_per_s * 1e9) * 1e3;
  const double compute_ms = device_flops / (cost.gflops_per_device * 1e9) * 1e3;
  std::snprintf(line, sizeof line,
                "  measured here: all-reduce among %d at %.2f GB/s -> ~%.1f ms a step; compute at "
                "%.1f GFLOP/s a device -> ~%.1f ms a step\n",
                tp, cost.allreduce_gb_per_s, comm_ms, cost.gflops_per_device, compute_ms);
  os << line;
  if (comm_ms > compute_ms) {
    os << "  warning: tensor parallelism cannot pay here: its communication (~"
       << static_cast<int>(comm_ms) << " ms a step) exceeds the compute it splits (~"
       << static_cast<int>(compute_ms) << " ms); split wider layers, or fewer\n";
  }
  return os.str();
}

}  // namespace

MemoryEstimate EstimateMemory(const RunConfig& config, const Model& m, int data_parallel,
                              bool pipeline) {
  MemoryEstimate e;
  // A batch holds train.batch rows for each data-parallel replica; the T
  // members of a tensor-parallel group share theirs.
  e.batch_mb = static_cast<double>(config.batch * data_parallel * m.input_shape().numel()) *
               sizeof(float) / 1e6;
  const GraphPlan plan = config.train_graph.Plan();
  e.prefetch_depth = plan.prefetch_depth;
  if (plan.prefetch_memory_mb > 0) {
    e.prefetch_depth = std::min<int64_t>(
        e.prefetch_depth, static_cast<int64_t>(plan.prefetch_memory_mb / e.batch_mb));
  }
  e.prefetch_mb = static_cast<double>(e.prefetch_depth) * e.batch_mb;
  double acts = 0;
  for (int i = 0; i < m.num_layers(); ++i) acts += static_cast<double>(m.output_shape(i).numel());
  e.activations_mb = acts * static_cast<double>(config.batch) * sizeof(float) / 1e6;
  e.state_mb = static_cast<double>(m.NumParameters()) * sizeof(float) * 4 / 1e6;
  // On the host: the prefetched batches, and the replicas that run on CPUs.
  int cpu_replicas = 0;
  for (const Device& d : config.devices) cpu_replicas += d.is_cuda() ? 0 : 1;
  if (pipeline) cpu_replicas = cpu_replicas > 0 ? 1 : 0;  // one model, its layers split
  e.host_mb = e.prefetch_mb + cpu_replicas * (e.activations_mb + e.state_mb);
  return e;
}

// GPU memory (docs/gpus.md#memory). What a GPU replica allocates from its
// lane's pool, read off the code that allocates it:
//  - Model::Forward keeps every layer's output between steps, in the
//    compute dtype (a relu fused into an add or a channels-last batchnorm
//    has none: GpuFusedLayers); with mixed precision, the input cast too.
//  - ReplicaSet: each trainable gradient is a view into an f32 bucket;
//    frozen parameters keep their own. The optimizer's state is made at the
//    first step (SGD with momentum: 1 tensor a parameter; Adam, AdamW: 2).
//  - ops/cuda/conv_cudnn.cc: the weight in the compute dtype (mixed
//    precision) or KRSC (channels-last), and the bias in half; an NHWC copy
//    of an NCHW input (the first conv under channels_last); in backward a
//    weight-gradient scratch and, mixed with a bias, an f32 copy of dy.
//    The workspace is the context's, grown to each algorithm search's
//    budget (the hungriest algorithm's need, at most 1 GiB) and kept.
//  - linear_cublas.cc: the weight in half (mixed); batch_norm_cudnn.cc: five
//    per-channel f32 tensors; the dropout: its mask.
//  - Model::Backward: each layer's input gradients are made as it runs and
//    freed once the layer that wrote that input has run; the loss's
//    gradient (dlogits) lives through the whole backward.
//  - The batches: forward_backward stages each batch into a slot of its own
//    (as many as the prefetch holds); data.device_resident holds the uint8
//    set on the GPU (lane 0's pool) and makes each replica's rows there.
namespace {

// The pool's block for a request of `bytes` (ops/device.cc, RoundToSizeClass:
// powers of two up to 1 MiB, then whole MiB): the pool counts its peak in
// blocks.
double Block(double bytes) {
  if (bytes <= 0) return 0;
  constexpr double kMiB = 1 << 20;
  if (bytes <= kMiB) {
    double c = kAlignment;
    while (c < bytes) c *= 2;
    return c;
  }
  return std::ceil(bytes / kMiB) * kMiB;
}

// The most workspace a cuDNN algorithm search takes (kMaxSearchWorkspace,
// ops/cuda/conv_cudnn.cc).
constexpr double kMaxSearchWorkspace = static_cast<double>(size_t{1} << 30);

// The state tensors the optimizer makes for a parameter (SGD with momentum
// 1, Adam and AdamW 2, SGD without momentum none): asked of the optimizer
// itself, on a host value it steps once.
int StatesPerParameter(const OptimizerSpec& spec) {
  Parameter p{.name = "p",
              .value = Tensor::Zeros(Shape({1}), DType::kF32),
              .grad = Tensor::Zeros(Shape({1}), DType::kF32)};
  const std::unique_ptr<Optimizer> o = MakeOptimizer(spec.type, spec.args, {{"p", &p}});
  o->Step(0);
  return static_cast<int>(o->StateTensors().size());
}

// What a GPU model fuses (Model's fusion on cuda devices), whatever device
// `m` was built on: by layer, a relu run inside the layer it reads (an
// add's, or a channels-last batchnorm's, when the relu is its only reader),
// and a channels-last batchnorm an add finishes (its only reader, the
// add's first such input: Layer::FuseProducer).
struct GpuFused {
  std::vector<char> relu, batchnorm;
};
GpuFused GpuFusedLayers(const Model& m, bool channels_last) {
  const int num = m.num_layers();
  std::vector<int> readers(num, 0);
  for (int i = 0; i < num; ++i)
    for (int j : m.input_indices(i))
      if (j >= 0) ++readers[j];
  auto type = [&](int i) { return std::string(m.layer(i).type()); };
  auto nhwc_bn = [&](int j) {
    return type(j) == "batchnorm" && channels_last && m.output_shape(j).rank() == 3;
  };
  GpuFused f{std::vector<char>(num, 0), std::vector<char>(num, 0)};
  for (int i = 0; i < num; ++i) {
    const std::vector<int>& in = m.input_indices(i);
    if (type(i) != "relu" || in.size() != 1 || in[0] < 0 || readers[in[0]] != 1) continue;
    f.relu[i] = type(in[0]) == "add" || nhwc_bn(in[0]);
  }
  for (int i = 0; i < num; ++i) {
    if (type(i) != "add") continue;
    for (int j : m.input_indices(i)) {
      if (j >= 0 && readers[j] == 1 && nhwc_bn(j)) {
        f.batchnorm[j] = 1;
        break;
      }
    }
  }
  return f;
}

// Model::Backward's widest point, layer by layer from the last: the
// gradients made and not yet consumed (each freed once the layer that
// wrote its activation has run), plus the running layer's new input
// gradients and `scratch`. The last layer's gradient (dlogits) is the
// caller's. needs[i]: backward runs layer i; fused[i]: its gradient passes
// to its input as it is; grad_bytes(j): activation j's gradient.
double BackwardPeak(const Model& m, const std::vector<char>& needs, const std::vector<char>& fused,
                    const std::vector<double>& scratch,
                    const std::function<double(int)>& grad_bytes) {
  const int num = m.num_layers();
  std::vector<double> grad(num, 0);  // held now; 0: none
  grad[num - 1] = -1;                // dlogits: held, not counted here
  double live = 0, peak = 0;
  for (int i = num - 1; i >= 0; --i) {
    if (grad[i] == 0 || !needs[i]) continue;
    if (fused[i]) {
      grad[m.input_indices(i)[0]] = grad[i];
      grad[i] = 0;
      continue;
    }
    double made = 0;
    for (int j : m.input_indices(i))
      if (j >= 0 && needs[j]) made += grad_bytes(j);
    peak = std::max(peak, live + made + scratch[i]);
    for (int j : m.input_indices(i)) {
      if (j < 0 || !needs[j] || grad[j] != 0) continue;  // a second gradient adds into the first
      grad[j] = grad_bytes(j);
      live += grad[j];
    }
    if (grad[i] > 0) live -= grad[i];
    grad[i] = 0;
  }
  return peak;
}

struct ReplicaBytes {
  double state = 0, copies = 0, activations = 0, backward = 0, workspace = 0, input = 0;
};

// One GPU replica's bytes at batch n.
ReplicaBytes EstimateReplica(const RunConfig& config, Model& m, int64_t n) {
  const DType compute = config.data_parallel.compute;
  const double s = static_cast<double>(DTypeSize(compute));
  const bool mixed = compute != DType::kF32;
  const bool channels_last = config.data_parallel.memory_format == MemoryFormat::kChannelsLast;
  const double rows = static_cast<double>(n);
  ReplicaBytes b;
  const double states = static_cast<double>(StatesPerParameter(config.optimizer));
  for (const Bucket& bucket : LayoutBuckets(m, config.data_parallel.bucket_mb))
    b.state += Block(static_cast<double>(bucket.numel) * sizeof(float));

  const int num = m.num_layers();
  // Activation j (-1: the model input) at batch n, in `elem`-byte values.
  auto act_bytes = [&](int j, double elem) {
    const Shape& shape = j < 0 ? m.input_shape() : m.output_shape(j);
    return Block(rows * static_cast<double>(shape.numel()) * elem);
  };
  // Which layers backward runs (Model::Backward's `needs`: the data needs no gradient).
  std::vector<char> needs(num, 0);
  for (int i = 0; i < num; ++i) {
    const Layer& l = m.layer(i);
    for (const Parameter& p : l.parameters()) {
      const double bytes = Block(static_cast<double>(p.value.numel()) * sizeof(float));
      b.state += bytes * (p.trainable ? 1 + states : 2);  // a frozen one keeps its own gradient
      needs[i] |= p.needs_grad();
    }
    for (const Buffer& buf : l.buffers()) b.state += Block(static_cast<double>(buf.value.nbytes()));
    for (int j : m.input_indices(i)) needs[i] |= j >= 0 && needs[j];
  }
  // What each layer holds besides its output, and its backward's scratch.
  const std::vector<char> fused = config.data_parallel.fuse_activations
                                      ? GpuFusedLayers(m, channels_last).relu
                                      : std::vector<char>(num, 0);
  std::vector<double> scratch(num, 0);
  double widest = 0;  // the largest im2col matrix: the search's hungriest algorithm
  for (int i = 0; i < num; ++i) {
    const Layer& l = m.layer(i);
    const std::vector<int>& in = m.input_indices(i);
    if (!fused[i]) b.activations += act_bytes(i, s);
    if (const auto* conv = dynamic_cast<const Conv2d*>(&l)) {
      const Conv2dGeometry& g = conv->geometry();
      const double w = static_cast<double>(l.parameters()[0].value.numel());
      const bool nhwc = channels_last && m.output_shape(i).rank() == 3;
      if (mixed || nhwc) {
        b.copies += Block(w * s);
        scratch[i] += Block(w * s);  // the weight gradient, half or KRSC
      }
      if (mixed && conv->has_bias()) {
        b.copies += Block(static_cast<double>(g.out_channels) * s);
        scratch[i] += act_bytes(i, sizeof(float));  // dy in f32 for the bias gradient
      }
      if (nhwc && !in.empty() && in[0] < 0) b.activations += act_bytes(-1, s);  // x to NHWC
      widest = std::max(widest, rows * static_cast<double>(g.col_rows() * g.groups) *
                                    static_cast<double>(g.out_plane()) * s);
    } else if (const auto* bn = dynamic_cast<const BatchNormLayer*>(&l)) {
      const double c = static_cast<double>(bn->channels()) * sizeof(float);
      b.copies += 4 * Block(c) + Block(2 * c);
      if (in.size() == 1 && (in[0] < 0 || !needs[in[0]])) scratch[i] += act_bytes(i, s);  // dx
    } else if (mixed && dynamic_cast<const LinearLayer*>(&l) != nullptr) {
      b.copies += Block(static_cast<double>(l.parameters()[0].value.numel()) * s);
    } else if (dynamic_cast<const DropoutLayer*>(&l) != nullptr) {
      b.activations += act_bytes(i, s);  // the mask
    }
  }
  if (mixed) b.activations += act_bytes(-1, s);  // the batch cast to the compute dtype
  b.workspace = std::min(Block(widest), kMaxSearchWorkspace);

  // The loss's gradient (dlogits) and scratch (a row's loss and hit), then
  // backward's widest point.
  const double loss = act_bytes(num - 1, s) + Block(64 + rows * (sizeof(double) + sizeof(int)));
  b.backward =
      loss + BackwardPeak(m, needs, fused, scratch, [&](int j) { return act_bytes(j, s); });
  return b;
}

}  // namespace

int64_t PredictResidentBytes(const RunConfig& config, const Dataset& train) {
  if (!config.device_resident || !config.devices[0].is_cuda()) return 0;
  const AugmentOptions* augment = train.train_augment();
  if (augment == nullptr || train.sample_shape().rank() != 3 ||
      !CropFlipUnsupported(*augment).empty())
    return 0;
  for (const NodeSpec& node : config.train_graph.nodes)
    if (node.stage == "mixup" || node.stage == "cutmix") return 0;  // as Trainer::HoldDataOnGpus
  return train.size() * train.sample_shape().numel();
}

std::vector<GpuMemoryEstimate> EstimateGpuMemory(const RunConfig& config, Model& m,
                                                 int64_t resident_bytes) {
  std::vector<GpuMemoryEstimate> out;
  if (config.pipeline || config.data_parallel.tensor_parallel > 1 || !config.devices[0].is_cuda())
    return out;
  const GraphPlan plan = config.train_graph.Plan();
  const int64_t n = plan.replica_batch > 0 ? plan.replica_batch : config.batch;
  const ReplicaBytes r = EstimateReplica(config, m, n);
  // Each staged batch: the f32 rows and the labels in one block.
  auto align = [](double bytes) { return std::ceil(bytes / kAlignment) * kAlignment; };
  const double rows_bytes = static_cast<double>(n * m.input_shape().numel()) * sizeof(float);
  const double labels = align(static_cast<double>(n) * sizeof(int64_t));
  const double staged = resident_bytes > 0
                            ? Block(rows_bytes) + Block(labels)
                            : static_cast<double>(std::max<int64_t>(plan.prefetch_depth, 1)) *
                                  Block(align(rows_bytes) + labels);
  // The weight average (an ema node): a copy of the parameters and buffers
  // with replica 0.
  double average = 0;
  if (plan.weight_average) {
    for (int i = 0; i < m.num_layers(); ++i) {
      for (const Parameter& p : m.layer(i).parameters())
        average += Block(static_cast<double>(p.value.nbytes()));
      for (const Buffer& buf : m.layer(i).buffers())
        average += Block(static_cast<double>(buf.value.nbytes()));
    }
  }
  constexpr double kMb = 1e6;
  for (const Device& d : config.devices) {
    auto it = std::find_if(out.begin(), out.end(),
                           [&](const GpuMemoryEstimate& e) { return e.device == d; });
    const bool first = it == out.end();
    if (first) {
      out.push_back({.device = d});
      it = out.end() - 1;
    }
    GpuMemoryEstimate& e = *it;
    if (first && out.size() == 1) e.state_mb += average / kMb;  // replica 0's GPU, lane 0
    e.replicas += 1;
    e.state_mb += r.state / kMb;
    e.copies_mb += r.copies / kMb;
    e.activations_mb += r.activations / kMb;
    e.backward_mb += r.backward / kMb;
    e.workspace_mb += r.workspace / kMb;
    e.input_mb += (staged + (first ? Block(static_cast<double>(resident_bytes)) : 0)) / kMb;
  }
  for (GpuMemoryEstimate& e : out) {
    e.peak_mb =
        e.state_mb + e.copies_mb + e.activations_mb + e.backward_mb + e.workspace_mb + e.input_mb;
  }
  return out;
}

std::vector<GpuPoolUse> MeasureGpuPools(const std::vector<GpuLane>& lanes) {
  std::vector<GpuPoolUse> gpus;
  for (const GpuLane& l : lanes) {
    if (!l.device.is_cuda()) continue;
    auto it = std::find_if(gpus.begin(), gpus.end(),
                           [&](const GpuPoolUse& g) { return g.device == l.device; });
    if (it == gpus.end()) it = gpus.insert(gpus.end(), GpuPoolUse{.device = l.device});
    const GpuLaneScope scope(l.lane);
    MemoryPool& pool = PoolFor(l.device);
    it->peak_in_use += pool.peak_bytes_in_use();
    it->held += pool.bytes_reserved();
  }
  return gpus;
}

void ResetGpuPoolPeaks(const std::vector<GpuLane>& lanes) {
  for (const GpuLane& l : lanes) {
    if (!l.device.is_cuda()) continue;
    const GpuLaneScope scope(l.lane);
    PoolFor(l.device).ResetPeak();
  }
}

std::string DescribeGpuFusion(const RunConfig& config, const Model& m) {
  if (!config.devices[0].is_cuda()) return "";
  if (!config.data_parallel.fuse_activations)
    return "GPU fusion: off (graph.fuse_activations: false)\n";
  const bool channels_last = config.data_parallel.memory_format == MemoryFormat::kChannelsLast;
  const GpuFused f = GpuFusedLayers(m, channels_last);
  int relus = 0, bns = 0, fused = 0, finished = 0;
  for (int i = 0; i < m.num_layers(); ++i) {
    const std::string type = m.layer(i).type();
    relus += type == "relu";
    bns += type == "batchnorm";
    fused += f.relu[i];
    finished += f.batchnorm[i];
  }
  if (relus == 0 && bns == 0) return "";
  return StrCat(
      "GPU fusion: ", fused, " of ", relus, " relus run inside the add or batchnorm they read, ",
      finished, " of ", bns, " batchnorms are finished by their add",
      channels_last ? "" : " (batchnorms take part under graph.channels_last: true)", "\n");
}

namespace {

// Why graph.cuda_graph captures nothing of this config ("" when it may).
std::string CudaGraphRefusal(const RunConfig& config, const Model& m) {
  if (!config.devices[0].is_cuda()) return "no effect on CPU devices";
  if (config.pipeline) return "pipelines run uncaptured (it captures data-parallel replicas)";
  const int replicas = config.logical_replicas > 0 ? config.logical_replicas
                                                   : static_cast<int>(config.devices.size());
  const std::string why = StepGraph::WhyNot(m, replicas, config.data_parallel.tensor_parallel,
                                            config.data_parallel.compute);
  return why.empty() ? "" : StrCat("the steps run uncaptured: ", why);
}

}  // namespace

std::string DescribeCudaGraph(const RunConfig& config, const Model& m) {
  if (!config.data_parallel.cuda_graph) return "";
  const std::string why = CudaGraphRefusal(config, m);
  return StrCat("CUDA graphs: ",
                why.empty()
                    ? "each replica's step captured once a shape has run twice, then "
                      "replayed (forward, backward and the optimizer's update: three launches a "
                      "step)"
                    : why,
                "\n");
}

std::string DescribeCudaGraphRun(const RunConfig& config, const ReplicaSet* replicas) {
  if (!config.data_parallel.cuda_graph || replicas == nullptr) return "";
  const ReplicaSet::CudaGraphStatus s = replicas->cuda_graph(0);
  if (!s.requested) return "";
  if (!s.why_not.empty()) {
    return StrCat("CUDA graphs: ", s.replayed_steps,
                  " steps replayed, then uncaptured: ", s.why_not);
  }
  return StrCat("CUDA graphs: ", s.replayed_steps, " steps and ", s.replayed_updates,
                " updates replayed from ", s.captures, s.captures == 1 ? " capture" : " captures",
                " (the others: warm-up and batches of other shapes)");
}

std::string DescribeGpuMemory(const std::vector<GpuMemoryEstimate>& estimates) {
  std::string out;
  char line[512];
  for (const GpuMemoryEstimate& e : estimates) {
    std::snprintf(line, sizeof line,
                  "GPU memory: %s peak ~%.0f MB predicted (%s%.0f MB parameters + gradients + "
                  "optimizer state, activations %.0f MB, backward %.0f MB, weight copies %.0f MB, "
                  "cuDNN workspace ~%.0f MB, input %.0f MB)\n",
                  e.device.ToString().c_str(), e.peak_mb,
                  e.replicas > 1 ? StrCat(e.replicas, " replicas: ").c_str() : "", e.state_mb,
                  e.activations_mb, e.backward_mb, e.copies_mb, e.workspace_mb, e.input_mb);
    out += line;
  }
  return out;
}

// Which tensors each of train.param_groups picks (the first group that
// picks a tensor has it), so a user sees a glob's reach before training.
std::string DescribeParamGroups(const RunConfig& config, Model& m) {
  const std::vector<ParamGroup>& groups = config.optimizer.groups;
  if (groups.empty()) return "";
  std::vector<std::vector<std::string>> picked(groups.size() + 1);  // the last: no group
  for (const NamedParameter& p : m.NamedParameters()) {
    if (!p.param->trainable) continue;
    size_t g = 0;
    while (g < groups.size() && !groups[g].Picks(p)) ++g;
    picked[g].push_back(p.name);
  }
  const double wd =
      config.optimizer.args.Has("weight_decay") ? config.optimizer.args.Float("weight_decay") : 0.0;
  std::ostringstream os;
  os << "parameter groups (" << config.optimizer.type << "):\n";
  for (size_t g = 0; g <= groups.size(); ++g) {
    const bool rest = g == groups.size();
    os << "  " << (rest ? std::string("the rest") : StrCat("group ", g)) << ": " << picked[g].size()
       << " tensors, lr x" << (rest ? 1.0 : groups[g].lr_scale) << ", weight decay "
       << (!rest && groups[g].weight_decay ? *groups[g].weight_decay : wd)
       << (!rest && groups[g].until_step > 0 ? StrCat(", until step ", groups[g].until_step) : "");
    for (size_t i = 0; i < picked[g].size() && i < 4; ++i) os << (i ? ", " : " (") << picked[g][i];
    if (!picked[g].empty()) os << (picked[g].size() > 4 ? ", ...)" : ")");
    os << "\n";
  }
  for (const std::string& note : CheckParamGroups(groups, m.NamedParameters()))
    os << "  note: " << note << "\n";
  return os.str();
}

// The frozen tensors (train.freeze, a layer's trainable: false) and the
// batchnorm layers that hold their running statistics (train.frozen_bn: eval).
std::string DescribeFrozen(Model& m) {
  std::vector<std::string> frozen;
  int64_t values = 0, total = 0;
  for (const NamedParameter& p : m.NamedParameters()) {
    total += p.param->value.numel();
    if (p.param->trainable) continue;
    frozen.push_back(p.name);
    values += p.param->value.numel();
  }
  if (frozen.empty()) return "";
  std::ostringstream os;
  os << "frozen (train.freeze, trainable: false): " << frozen.size() << " tensors, " << values
     << " of " << total << " values";
  for (size_t i = 0; i < frozen.size() && i < 6; ++i) os << (i ? ", " : " (") << frozen[i];
  os << (frozen.size() > 6 ? ", ...)" : ")") << "\n";
  std::vector<std::string> held;
  for (int i = 0; i < m.num_layers(); ++i) {
    if (const auto* bn = dynamic_cast<const BatchNormLayer*>(&m.layer(i));
        bn != nullptr && bn->hold_running_stats()) {
      held.push_back(bn->name());
    }
  }
  if (!held.empty()) {
    os << "  batchnorm in eval mode (train.frozen_bn: eval): " << held.size() << " layers";
    for (size_t i = 0; i < held.size() && i < 6; ++i) os << (i ? ", " : " (") << held[i];
    os << (held.size() > 6 ? ", ...)" : ")") << "\n";
  }
  return os.str();
}

std::string ValidateReport(const RunConfig& config, Model& m, ReplicaSet* replicas,
                           PipelineModel* pipeline, int64_t steps_per_epoch) {
  std::ostringstream os;
  os << "model (input " << m.input_shape() << "):\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-12s %-15s %-14s %-18s %12s %14s\n", "layer", "type",
                "inputs", "output", "parameters", "MFLOPs/sample");
  os << line;
  for (int i = 0; i < m.num_layers(); ++i) {
    Layer& l = m.layer(i);
    int64_t params = 0;
    for (auto& p : l.parameters()) params += p.value.numel();
    std::string ins;
    for (const auto& n : m.inputs_of(i)) ins += (ins.empty() ? "" : ",") + n;
    std::snprintf(line, sizeof line, "  %-12s %-15s %-14s %-18s %12lld %14.3f\n", l.name().c_str(),
                  l.type(), ins.c_str(), m.output_shape(i).ToString().c_str(),
                  static_cast<long long>(params), l.ForwardFlops(1) / 1e6);
    os << line;
  }
  os << "  total parameters: " << m.NumParameters() << ", forward " << m.ForwardFlops(1) / 1e6
     << " MFLOPs per sample\n";
  if (replicas != nullptr && replicas->tensor_parallel() > 1)
    os << DescribeTensorParallel(config, *replicas);
  if (pipeline) {
    os << "pipeline: " << pipeline->num_stages() << " stages, "
       << config.pipeline_options.microbatches << " micro-batches, schedule "
       << PipelineScheduleName(config.pipeline_options.schedule) << "\n";
    std::map<std::string, int> index;
    for (int i = 0; i < m.num_layers(); ++i) index[m.layer(i).name()] = i;
    double lo = 1e300, hi = 0;
    int lo_s = 0, hi_s = 0;
    for (int s = 0; s < pipeline->num_stages(); ++s) {
      int64_t params = 0;
      double flops = 0;
      for (const std::string& name : pipeline->stage_layers(s)) {
        Layer& l = m.layer(index[name]);
        for (auto& p : l.parameters()) params += p.value.numel();
        flops += static_cast<double>(l.ForwardFlops(1));
      }
      if (flops < lo) lo = flops, lo_s = s;
      if (flops > hi) hi = flops, hi_s = s;
      std::snprintf(
          line, sizeof line, "  stage %d on %-6s %-40s %10lld params %10.3f MFLOPs/sample\n", s,
          config.devices[s].ToString().c_str(),
          (pipeline->stage_layers(s).front() + ".." + pipeline->stage_layers(s).back()).c_str(),
          static_cast<long long>(params), flops / 1e6);
      os << line;
    }
    if (lo > 0 && hi / lo > 1.5) {
      os << "  warning: unbalanced cut: stage " << hi_s << " has "
         << static_cast<int>(hi / lo * 10) / 10.0 << "x the forward FLOPs of stage " << lo_s
         << "; the pipeline runs at the pace of its slowest stage"
         << (config.pipeline_options.stages.empty()
                 ? " (this is already the most even cut of these layers)\n"
                 : " (graph.pipeline.stages: auto finds the most even cut)\n");
    }
  }
  std::vector<std::string> devices;
  for (const Device& d : config.devices) devices.push_back(d.ToString());
  os << "train graph (" << config.train_graph.file << "; per-device nodes expanded):\n"
     << config.train_graph.ToString(devices);
  os << "eval graph:\n" << config.eval_graph.ToString(devices);
  os << "threads: " << config.threads << ", devices:";
  for (const auto& d : config.devices) os << " " << d.ToString();
  os << ", steps per epoch: " << steps_per_epoch << "\n";
  if (m.bf16_layers() > 0) {
    os << "precision: bf16 on the CPU: " << m.bf16_layers()
       << " convolution and linear layers multiply in bf16; all else f32\n";
  }
  os << DescribeFrozen(m);
  os << DescribeParamGroups(config, m);

  // Memory known before the run: the prefetched input batches (bounded by
  // the prefetch stage) and, per replica, activations and parameter state.
  const MemoryEstimate e = EstimateMemory(
      config, m, replicas != nullptr ? replicas->data_parallel() : 1, pipeline != nullptr);
  std::snprintf(line, sizeof line, "memory: prefetched batches <= %.1f MB (%lld x %.2f MB)",
                e.prefetch_mb, static_cast<long long>(e.prefetch_depth), e.batch_mb);
  os << line;
  std::snprintf(line, sizeof line,
                "; per replica: activations ~%.1f MB (batch %lld), parameters + gradients + "
                "optimizer state ~%.1f MB\n",
                e.activations_mb, static_cast<long long>(config.batch), e.state_mb);
  os << line;
  const double machine_mb = MachineMemoryMb();
  if (machine_mb > 0 && e.host_mb > machine_mb) {
    std::snprintf(line, sizeof line,
                  "warning: the run needs ~%.0f MB of host memory, more than this machine's %.0f "
                  "MB (MemTotal): lower train.batch, graph.prefetch or the replicas\n",
                  e.host_mb, machine_mb);
    os << line;
  }
  return os.str();
}

}  // namespace cnnflow
