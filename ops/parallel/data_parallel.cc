#include "ops/parallel/data_parallel.h"

#include <cmath>
#include <optional>

#include "ops/cpu/parallel.h"
#include "ops/cuda/lane_group.h"
#include "ops/device_ops.h"
#include "ops/loss.h"
#include "ops/stream_event.h"
#include "ops/test_fault.h"
#include "ops/trace.h"

namespace cnnflow {

void CheckLossFinite(double loss, int64_t step) {
  if (!std::isfinite(loss)) {
    throw Error(
        StrCat("loss is ", loss, " at step ", step, ": lower the learning rate or check the data"));
  }
}

std::vector<Bucket> LayoutBuckets(Model& model, double bucket_mb) {
  const auto params = model.NamedParameters();
  // Layer of each parameter, in NamedParameters order (layer order).
  std::vector<int> layer_of;
  for (int i = 0; i < model.num_layers(); ++i)
    for (size_t k = 0; k < model.layer(i).parameters().size(); ++k) layer_of.push_back(i);
  const auto limit = static_cast<int64_t>(bucket_mb * 1e6 / sizeof(float));
  std::vector<Bucket> buckets;
  Bucket cur;
  std::string first, last;
  auto close = [&] {
    if (cur.params.empty()) return;
    cur.tag = StrCat("bucket ", buckets.size(), " (", first, "..", last, ")");
    buckets.push_back(std::move(cur));
    cur = Bucket();
  };
  for (int i = static_cast<int>(params.size()) - 1; i >= 0; --i) {
    if (!params[i].param->trainable) continue;  // frozen: no gradient to reduce (as DDP)
    const int64_t n = params[i].param->value.numel();
    if (!cur.params.empty() && cur.numel + n > limit) close();
    if (cur.params.empty()) first = params[i].name;
    last = params[i].name;
    cur.params.push_back(i);
    cur.numel += n;
    if (cur.layers.empty() || cur.layers.back() != layer_of[i]) cur.layers.push_back(layer_of[i]);
  }
  close();
  return buckets;
}

struct ReplicaSet::Replica {
  int rank = 0;
  Device device;
  // Its GPU lane (ops/device.h): which of the replicas on its GPU it is. Its
  // work runs in a GpuLaneScope of it: its own stream, handles and pool.
  int lane = 0;
  std::unique_ptr<Model> model;
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<tbb::task_arena> arena;
  std::vector<Tensor> bucket_grads;             // flat, one per bucket
  std::vector<std::vector<int>> layer_buckets;  // layer -> buckets it fills
  std::vector<int> layers_left;                 // per bucket, this backward
  StepTimeline timeline;
  Counters counters;
  double idle_since = -1;              // the end of its last work (negative: none yet)
  std::unique_ptr<LossScaler> scaler;  // f16 only
  std::unique_ptr<IdleMeter> idle;     // GPU only
  // graph.cuda_graph where its steps can be captured; else why not.
  std::unique_ptr<StepGraph> graph;
  std::string graph_why_not;
  // SyncBN's all-reduce, through the communication thread like every
  // collective of this replica (so the order is the same on every replica).
  std::function<void(float*, int64_t)> sync_sum;
  // The communication thread and its queue.
  std::thread comm;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool busy = false;
  bool stop = false;
  std::exception_ptr error;

  // Stops and joins the communication thread, also when the ReplicaSet's
  // constructor throws (a failed initial broadcast): a joinable std::thread
  // destroyed would std::terminate and hide the error.
  ~Replica() {
    if (!comm.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv.notify_all();
    comm.join();
  }
};

ReplicaSet::ReplicaSet(const std::vector<LayerSpec>& layers, const Shape& input_shape,
                       uint64_t seed, InitScheme init, const OptimizerSpec& optimizer,
                       const DataParallelOptions& options, MpiWorld& world)
    : options_(options), start_(std::chrono::steady_clock::now()) {
  CNNFLOW_ENFORCE(options.replicas >= 1, "replicas must be >= 1, got ", options.replicas);
  if (options_.devices.empty()) options_.devices.assign(options.replicas, Device::Cpu());
  CNNFLOW_ENFORCE(static_cast<int>(options_.devices.size()) == options.replicas, "replicas ",
                  options.replicas, " but ", options_.devices.size(), " devices");
  const bool gpu = options_.devices[0].is_cuda();
  for (const Device& d : options_.devices) {
    CNNFLOW_ENFORCE(d.is_cuda() == gpu, "replicas on CPUs and GPUs at once are not supported");
  }
  const int tp = options.tensor_parallel;
  if (tp > 1) MakeTensorParallelGroups(world);
  collective_ = MakeReplicaCollective(options_.devices, world, options.timeout_s);
  multi_process_ = world.active() && world.size() > 1;
  for (int r = 0; r < options.replicas; ++r) {
    auto rep = std::make_unique<Replica>();
    rep->rank = r;
    rep->device = options_.devices[r];
    for (int j = 0; j < r; ++j) rep->lane += options_.devices[j] == rep->device ? 1 : 0;
    const GpuLaneScope lane(rep->lane);
    TensorParallelPlacement placement;
    if (tp > 1) {
      placement.layers = options.split_layers;
      placement.group = tp_groups_[r / tp_local_].get();
      placement.rank = r % tp_local_;
    }
    SetGpuMath(rep->device, options.gpu_math);  // before the model's first step
    rep->model = Model::Build(layers, input_shape,
                              {.seed = seed,
                               .init = init,
                               .device = rep->device,
                               .compute = options.compute,
                               .fuse_activations = options.fuse_activations,
                               .memory_format = options.memory_format,
                               .splitter = tp > 1 ? &placement : nullptr});
    if (options.compute == DType::kF16)
      rep->scaler = std::make_unique<LossScaler>(options.loss_scaler);
    rep->idle = MakeIdleMeter(rep->device);
    if (options.replicas > 1) {
      rep->arena = cpu::MakeComputeArena(options.threads_per_replica, options.flush_denormals);
    }
    replicas_.push_back(std::move(rep));
  }
  buckets_ = LayoutBuckets(*replicas_[0]->model, options.bucket_mb);
  for (auto& rep : replicas_) {
    const GpuLaneScope lane(rep->lane);  // its buckets and optimizer state in its lane's pool
    BindGradientBuckets(*rep);
    rep->optimizer = MakeOptimizer(optimizer, rep->model->NamedParameters());
    if (options.cuda_graph && rep->device.is_cuda()) {
      rep->graph_why_not =
          StepGraph::WhyNot(*rep->model, global_size(), options.tensor_parallel, options.compute);
      if (rep->graph_why_not.empty())
        rep->graph = std::make_unique<StepGraph>(*rep->model, rep->device);
    }
    if (collective_ != nullptr && !collective_->enqueues()) {
      rep->comm = std::thread([this, r = rep.get()] {
        const GpuLaneScope lane(r->lane);
        CommLoop(*r);
      });
    }
    rep->sync_sum = [this, r = rep->rank](float* data, int64_t count) {
      Issue(r, [this, r, data, count] { collective_->AllReduceSum(r, data, count, "sync_bn", 1); });
      Complete(r);
    };
  }
  MaybeInjectTestFault(kTestFaultAtStart);  // CNNFLOW_TEST_FAULT step=start
  if (collective_ != nullptr) BroadcastInitialState();
}

// On GPUs, groups inside this process: the members of a group on one GPU
// (lanes of it, summing with a kernel of ours) or each on its own GPU
// (NCCL among them).
void ReplicaSet::MakeGpuTensorParallelGroups(MpiWorld& world) {
  const int tp = options_.tensor_parallel;
  if (options_.replicas % tp != 0 || world.active()) {
    throw ConfigError(StrCat("graph.tensor_parallel on GPUs: a group's ", tp,
                             " members are GPUs of one process so far (list a multiple of ", tp,
                             " GPUs in graph.devices", world.active() ? ", without mpirun" : "",
                             ")"));
  }
  tp_local_ = tp;
  for (int g = 0; g < options_.replicas / tp; ++g) {
    std::vector<int> gpus;
    for (int m = 0; m < tp; ++m) gpus.push_back(options_.devices[g * tp + m].index);
    const bool one_gpu = std::all_of(gpus.begin(), gpus.end(), [&](int d) { return d == gpus[0]; });
    // Member m's lane: the GPU's listings before it (one GPU only: its replica index).
    tp_groups_.push_back(one_gpu ? MakeLaneGroup(gpus[0], tp, options_.timeout_s, g * tp)
                                 : MakeGpuCollective(gpus, world, options_.timeout_s));
  }
}

// A group of T members inside this process (T divides the replicas), or
// one that spans T / replicas processes.
void ReplicaSet::MakeTensorParallelGroups(MpiWorld& world) {
  const DataParallelOptions& options = options_;
  const int tp = options.tensor_parallel;
  if (options.split_layers.empty()) {
    throw ConfigError("graph.tensor_parallel names no layers to split");
  }
  if (options_.devices[0].is_cuda()) {
    MakeGpuTensorParallelGroups(world);
  } else if (options.replicas % tp == 0) {
    tp_local_ = tp;
    for (int g = 0; g < options.replicas / tp; ++g) {
      tp_groups_.push_back(std::make_unique<LocalGroup>(
          tp, options.timeout_s,
          StrCat("tensor-parallel group ", g, " (replicas ", g * tp, "..", g * tp + tp - 1, ")")));
    }
  } else if (tp % options.replicas == 0) {
    // Spans processes. Every process runs the same config (the trainer
    // checks its hash), so every one has `replicas` devices.
    const int processes = tp / options.replicas;
    const int world_size = world.active() ? world.size() : 1;
    if (world_size % processes != 0) {
      throw ConfigError(StrCat("graph.tensor_parallel.size ", tp, " over ", options.replicas,
                               " device(s) a process makes groups of ", processes,
                               " processes, but this job has ", world_size,
                               " process(es): launch a multiple of ", processes, " (mpirun -n ",
                               processes, "), or list ", tp, " devices in graph.devices"));
    }
    tp_local_ = options.replicas;
    const int group = world.rank() / processes;
    tp_world_ = world.Split(group, StrCat("tensor-parallel group ", group));
    tp_groups_.push_back(
        std::make_unique<HierarchicalAllReduce>(options.replicas, *tp_world_, options.timeout_s));
    tp_first_member_ = tp_groups_[0]->global_offset();
  } else {
    throw ConfigError(StrCat("graph.tensor_parallel.size ", tp,
                             " neither divides nor is a multiple of the ", options.replicas,
                             " devices of graph.devices"));
  }
  if (tp_local_ > 1) tp_threads_ = std::make_unique<MemberThreads>(tp_local_);
}

// Each gradient becomes a view into its bucket's flat buffer, which the
// bucket's reduction sums in place.
void ReplicaSet::BindGradientBuckets(Replica& rep) {
  auto params = rep.model->NamedParameters();
  rep.layer_buckets.assign(rep.model->num_layers(), {});
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Tensor flat = Tensor::Zeros(Shape({buckets_[b].numel}), DType::kF32, rep.device);
    int64_t offset = 0;
    for (int i : buckets_[b].params) {
      Parameter& p = *params[i].param;
      const int64_t n = p.value.numel();
      p.grad = flat.Slice(offset, offset + n).Reshape(p.value.shape());
      offset += n;
    }
    for (int l : buckets_[b].layers) rep.layer_buckets[l].push_back(static_cast<int>(b));
    rep.bucket_grads.push_back(flat);
  }
  rep.layers_left.assign(buckets_.size(), 0);
  rep.timeline.reduce_begin.assign(buckets_.size(), 0);
  rep.timeline.reduce_end.assign(buckets_.size(), 0);
}

// The same seed built the same parameters; the broadcast makes sure, and
// covers processes started with different seeds. Each replica from a
// thread of its own, as in training (a collective may wait on the host for
// its peers).
void ReplicaSet::BroadcastInitialState() {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(replicas_.size());
  for (auto& rep : replicas_) {
    threads.emplace_back([this, &errors, r = rep->rank] {
      const GpuLaneScope lane(replicas_[r]->lane);
      try {
        for (auto& [name, t] : replicas_[r]->model->StateTensors()) {
          Issue(r, [this, r, name = name, t = t]() mutable {
            collective_->Broadcast(r, t.data<float>(), t.numel(), "initial " + name);
          });
        }
        Complete(r);
      } catch (...) {
        errors[r] = std::current_exception();
        collective_->Abort("a replica failed its initial broadcast");
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

ReplicaSet::~ReplicaSet() {
  bool busy = false;
  for (auto& rep : replicas_) {
    std::lock_guard<std::mutex> lock(rep->mu);
    busy |= rep->busy || !rep->queue.empty();
  }
  if (busy && collective_ != nullptr) collective_->Abort("the replicas are shutting down");
  if (collective_ != nullptr && collective_->enqueues()) {
    // Collectives still in flight (a failed step) must not outlive their buffers.
    try {
      for (auto& rep : replicas_) {
        const GpuLaneScope lane(rep->lane);
        collective_->Wait(rep->rank);
      }
    } catch (const std::exception&) {
      collective_->Abort("the replicas are shutting down");
    }
  }
  // replicas_, the last member, goes first: each Replica joins its
  // communication thread while collective_ still exists.
}

int ReplicaSet::global_size() const {
  return collective_ != nullptr ? collective_->global_size() : size();
}

int ReplicaSet::global_offset() const {
  return collective_ != nullptr ? collective_->global_offset() : 0;
}

Device ReplicaSet::device(int r) const { return replicas_[r]->device; }
int ReplicaSet::lane(int r) const { return replicas_[r]->lane; }

double ReplicaSet::loss_scale(int r) const {
  return replicas_[r]->scaler ? replicas_[r]->scaler->scale() : 1.0;
}

Model& ReplicaSet::model(int r) { return *replicas_[r]->model; }
Optimizer& ReplicaSet::optimizer(int r) { return *replicas_[r]->optimizer; }
ReplicaSet::CudaGraphStatus ReplicaSet::cuda_graph(int r) const {
  const Replica& rep = *replicas_[r];
  CudaGraphStatus s;
  s.requested = options_.cuda_graph && rep.device.is_cuda();
  s.why_not = rep.graph_why_not;
  if (rep.graph) {
    s.replayed_steps = rep.graph->replayed_steps();
    s.replayed_updates = rep.graph->replayed_updates();
    s.captures = rep.graph->captures();
    s.why_not = rep.graph->why_not();
  }
  return s;
}

const StepTimeline& ReplicaSet::timeline(int r) const { return replicas_[r]->timeline; }
const ReplicaSet::Counters& ReplicaSet::counters(int r) const { return replicas_[r]->counters; }
void ReplicaSet::ResetCounters() {
  for (auto& rep : replicas_) {
    rep->counters = Counters();
    if (rep->idle) rep->idle->Reset();
  }
}

void ReplicaSet::StartPass() {
  // Between passes the host writes every replica's tensors from lane 0 (a
  // checkpoint's weights, the EMA's copy, an init from data): a GPU listed
  // twice has its other lanes' streams start after that work.
  for (auto& rep : replicas_) {
    if (rep->lane > 0) SynchronizeDevice(rep->device);
  }
  const double now = Now();
  for (auto& rep : replicas_) rep->idle_since = now;
}

double ReplicaSet::Now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

void ReplicaSet::CommLoop(Replica& rep) {
  for (;;) {
    std::function<void()> fn;
    {
      std::unique_lock<std::mutex> lock(rep.mu);
      rep.cv.wait(lock, [&] { return rep.stop || !rep.queue.empty(); });
      if (rep.queue.empty()) return;  // stop
      fn = std::move(rep.queue.front());
      rep.queue.pop_front();
      rep.busy = true;
    }
    try {
      if (!rep.error) fn();  // after an error, the rest is dropped
    } catch (...) {
      std::lock_guard<std::mutex> lock(rep.mu);
      rep.error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(rep.mu);
      rep.busy = false;
    }
    rep.cv.notify_all();
  }
}

void ReplicaSet::Issue(int r, std::function<void()> fn) {
  Replica& rep = *replicas_[r];
  if (!rep.comm.joinable()) {  // collectives that only enqueue
    fn();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(rep.mu);
    rep.queue.push_back(std::move(fn));
  }
  rep.cv.notify_all();
}

void ReplicaSet::Complete(int r) {
  Replica& rep = *replicas_[r];
  const GpuLaneScope lane(rep.lane);
  if (rep.comm.joinable()) {
    std::unique_lock<std::mutex> lock(rep.mu);
    rep.cv.wait(lock, [&] { return rep.queue.empty() && !rep.busy; });
    if (rep.error) {
      std::exception_ptr e = rep.error;
      rep.error = nullptr;
      std::rethrow_exception(e);
    }
  }
  if (collective_ != nullptr) collective_->Wait(r);
}

bool ReplicaSet::AgreeStop(int r, int64_t step, bool stop_requested) {
  if (collective_ == nullptr) return stop_requested;
  if (!multi_process_) {
    std::lock_guard<std::mutex> lock(stop_mu_);
    const auto vote = stop_votes_.try_emplace(step, stop_requested, 0).first;
    const bool stop = vote->second.first;
    if (++vote->second.second == size()) stop_votes_.erase(vote);
    return stop;
  }
  Replica& rep = *replicas_[r];
  const GpuLaneScope lane(rep.lane);
  const double begin = Now();
  // On the replica's device: NCCL reduces GPU memory.
  Tensor flag = Tensor::Full(Shape({1}), stop_requested ? 1.0 : 0.0).To(rep.device);
  Issue(r, [this, r, &flag] {
    collective_->AllReduceSum(r, flag.data<float>(), 1, "stop request", 1);
  });
  Complete(r);
  const bool stop = flag.To(Device::Cpu()).At(0) > 0;
  // Waiting here is waiting for a peer still in its step, as in the reductions.
  rep.idle_since = Now();
  rep.counters.reduce_wait_seconds += rep.idle_since - begin;
  return stop;
}

void ReplicaSet::Abort(const std::string& reason) {
  if (collective_ != nullptr) collective_->Abort(reason);
  for (auto& g : tp_groups_) g->Abort(reason);
}

const Tensor& ReplicaSet::Infer(const Tensor& x, const ForwardContext& ctx) {
  const Tensor* out = nullptr;
  // On a GPU x is the caller's lane's: another lane waits for it and reads
  // its own copy, made before its first sum with the group, which the
  // caller's lane waits for before it goes on (and may reuse x's block).
  const StreamEvent x_ready(x.device());
  auto run = [this, &x, &x_ready, &ctx, &out](int r) {
    Replica& rep = *replicas_[r];
    const GpuLaneScope lane(rep.lane);
    Tensor mine;
    if (r > 0 && x.device().is_cuda()) {
      x_ready.Await(rep.device);
      mine = x.To(rep.device);
    }
    const Tensor* y = nullptr;
    auto forward = [&] { y = &rep.model->Forward(mine.defined() ? mine : x, ctx); };
    rep.arena ? rep.arena->execute(forward) : forward();
    if (r == 0) out = y;
  };
  if (tp_threads_ == nullptr) {  // no group, or this process holds one member of it
    run(0);
    return *out;
  }
  // Group 0's members at once, on threads that persist from call to call
  // (each blocks in the group's collectives until the others arrive); a
  // member that fails breaks the group, so the others fail at once rather
  // than at the timeout.
  tp_threads_->Run(run, [this](int member, const char* what) {
    tp_groups_[0]->Abort(StrCat("replica ", member, " failed its forward: ", what));
  });
  return *out;
}

namespace {

// Mixed targets (mixup, cutmix) copied to a GPU, and where they are.
struct MixCopy {
  Tensor other, weight;
  LabelMix mix;
};

// The mixed targets where a replica's loss reads them: the host's on a
// CPU; on a GPU the staged copy, or (rows that were not staged) a copy
// made now into `held`.
const LabelMix* MixOn(Device device, const LabelMix* mix, const LabelMix* device_mix, int64_t n,
                      MixCopy& held) {
  if (!device.is_cuda() || mix == nullptr) return mix;
  if (device_mix != nullptr) return device_mix;
  held.other = LabelTensor(mix->other, n, device);
  held.weight = Tensor::Empty(Shape({n}), DType::kF32, device);
  CopyBytes(device, held.weight.raw_data(), Device::Cpu(), mix->weight,
            static_cast<size_t>(n) * sizeof(float));
  held.mix = {held.other.data<int64_t>(), held.weight.data<float>()};
  return &held.mix;
}

// A shard's rows and labels on its replica's device (a GPU shard's usually
// are already: the split staged them).
struct ShardOnDevice {
  ShardOnDevice(const Tensor& x, const int64_t* host_labels, const int64_t* device_labels,
                Device device, int r)
      : rows(x), labels(device_labels != nullptr ? device_labels : host_labels) {
    if (x.device() != device) {
      rows = x.To(device);
      held = LabelTensor(host_labels, x.dim(0), device);
      labels = held.data<int64_t>();
    }
    CNNFLOW_ENFORCE(labels != nullptr, "replica ", r, "'s shard has no labels on ",
                    device.ToString());
  }
  Tensor rows;
  const int64_t* labels;
  Tensor held;  // labels copied to the device
};

}  // namespace

ReplicaSet::Result ReplicaSet::ForwardBackward(int r, const Tensor& x, const int64_t* labels,
                                               const ForwardContext& ctx, double grad_scale,
                                               double label_smoothing, bool reduce,
                                               const int64_t* device_labels, const LabelMix* mix,
                                               const LabelMix* device_mix) {
  Replica& rep = *replicas_[r];
  const GpuLaneScope lane(rep.lane);
  const double begin = Now();
  if (rep.idle_since >= 0) rep.counters.data_wait_seconds += begin - rep.idle_since;
  Result result;
  auto post = [this, r, &rep](int b) {
    Issue(r, [this, r, b, &rep] {
      rep.timeline.reduce_begin[b] = Now();
      const TraceSpan span("allreduce", [this, b] { return buckets_[b].tag; });
      Tensor& g = rep.bucket_grads[b];
      collective_->AllReduceSum(r, g.data<float>(), g.numel(), buckets_[b].tag, 1);
      rep.timeline.reduce_end[b] = Now();  // enqueued, where collectives only enqueue
    });
  };
  const bool reducing = reduce && collective_ != nullptr;
  if (x.dim(0) == 0) {  // an empty shard still takes part in the reduction
    if (reducing) {
      for (size_t b = 0; b < buckets_.size(); ++b) post(static_cast<int>(b));
      IssueBufferBroadcasts(r);
    }
    rep.idle_since = Now();
    return result;
  }
  auto run = [&] {
    Model& m = *rep.model;
    ForwardContext c = ctx;
    if (options_.sync_bn && collective_ != nullptr) c.sync_sum = &rep.sync_sum;
    const ShardOnDevice shard(x, labels, device_labels, rep.device, r);
    const Tensor& xd = shard.rows;
    const int64_t* labels_here = shard.labels;
    MixCopy held;
    const LabelMix* mix_here = MixOn(rep.device, mix, device_mix, x.dim(0), held);
    const double scale = rep.scaler ? grad_scale * rep.scaler->scale() : grad_scale;
    // graph.cuda_graph: the step replays its capture (not while --trace
    // times each kernel).
    const bool replay = rep.graph && !Tracer::on() &&
                        rep.graph->Prepare(xd, labels_here, mix_here, scale, label_smoothing, c);
    if (rep.idle) rep.idle->StartOfWork();
    Tensor dlogits;
    if (replay) {
      result.pending = rep.graph->ReplayForward(xd, labels_here, mix_here);
    } else {
      const Tensor& logits = m.Forward(xd, c);
      dlogits = Tensor::Empty(logits.shape(), logits.dtype(), rep.device);
      const TraceSpan span("loss", "softmax cross-entropy");
      result.pending =
          SoftmaxCrossEntropyAsync(logits, labels_here, &dlogits, scale, label_smoothing, mix_here);
    }
    if (result.pending->ready()) {  // a host loss: checked before backward
      const LossResult loss = result.pending->Get();
      result.pending.reset();
      CheckLossFinite(loss.loss, ctx.step);
      result.loss_sum = loss.loss * static_cast<double>(x.dim(0));
      result.correct = loss.correct;
    }
    rep.timeline.backward_begin = Now();
    if (rep.idle) rep.idle->Mark(kGpuBackward);
    MaybeSlowTestRank(global_offset() + r);  // CNNFLOW_TEST_SLOW_RANK, for the straggler test
    if (replay) {
      rep.graph->ReplayBackward();
    } else if (!reducing) {
      m.Backward(dlogits);
    } else {
      for (size_t b = 0; b < buckets_.size(); ++b)
        rep.layers_left[b] = static_cast<int>(buckets_[b].layers.size());
      m.Backward(dlogits, [&](int layer) {
        for (int b : rep.layer_buckets[layer])
          if (--rep.layers_left[b] == 0) post(b);
      });
    }
    rep.timeline.backward_end = Now();
    if (rep.idle) {  // then the stream waits for the reductions, or for the next batch
      if (reducing) {
        rep.idle->Mark(kGpuReduceWait);
      } else {
        rep.idle->EndOfWork();
      }
    }
  };
  try {
    if (rep.arena) {
      rep.arena->execute(run);
    } else {
      run();
    }
    rep.idle_since = Now();
    rep.counters.forward_seconds += rep.timeline.backward_begin - begin;
    rep.counters.backward_seconds += rep.idle_since - rep.timeline.backward_begin;
  } catch (const std::exception& e) {
    Abort(StrCat("replica ", global_offset() + r, " failed: ", e.what()));
    throw;
  }
  if (reducing) IssueBufferBroadcasts(r);
  return result;
}

// After the gradient buckets: this step's forward updated the buffers, and
// the optimizer does not touch them.
void ReplicaSet::IssueBufferBroadcasts(int r) {
  if (!options_.broadcast_buffers) return;
  const GpuLaneScope lane(replicas_[r]->lane);
  Model& m = *replicas_[r]->model;
  for (int i = 0; i < m.num_layers(); ++i) {
    Layer& l = m.layer(i);
    for (Buffer& b : l.buffers()) {
      Tensor t = b.value;
      Issue(r, [this, r, t, tag = StrCat("buffer ", l.name(), ".", b.name)]() mutable {
        collective_->Broadcast(r, t.data<float>(), t.numel(), tag);
      });
    }
  }
}

void ReplicaSet::WaitForReductions(int r) {
  Replica& rep = *replicas_[r];
  const GpuLaneScope lane(rep.lane);
  const double wait_begin = Now();
  {
    const TraceSpan span("allreduce-wait", "wait for gradient reductions");
    Complete(r);
  }
  rep.timeline.wait_seconds = Now() - wait_begin;
  rep.counters.reduce_wait_seconds += rep.timeline.wait_seconds;
}

void ReplicaSet::Step(int r, double lr) {
  Replica& rep = *replicas_[r];
  const GpuLaneScope lane(rep.lane);
  WaitForReductions(r);
  const double step_begin = Now();
  auto step = [&] { ApplyStep(rep, lr); };
  if (rep.arena) {
    rep.arena->execute(step);
  } else {
    step();
  }
  rep.idle_since = Now();
  rep.counters.optimizer_seconds += rep.idle_since - step_begin;
}

void ReplicaSet::ApplyStep(Replica& rep, double lr) {
  const TraceSpan span("optimizer", "optimizer step");
  const DeviceSpan device_span(rep.device, "gpu optimizer", [] { return "optimizer step"; });
  if (rep.idle) rep.idle->Mark(kGpuOptimizer);
  bool take = true;
  if (rep.scaler) {
    std::vector<Tensor*> grads;
    for (Tensor& g : rep.bucket_grads) grads.push_back(&g);
    const bool found_inf =
        UnscaleAndFindNonFinite(grads, static_cast<float>(1.0 / rep.scaler->scale()));
    take = rep.scaler->Update(found_inf);  // the same on every replica: grads are reduced
  }
  auto zero_grads = [&rep] {
    for (Tensor& g : rep.bucket_grads) g.Zero();
  };
  if (take && rep.graph && !Tracer::on()) {  // graph.cuda_graph
    rep.graph->Update(*rep.optimizer, lr, zero_grads);
  } else {
    if (take) rep.optimizer->Step(lr);
    zero_grads();
  }
  if (!take) ++rep.counters.skipped_steps;
  ++rep.counters.steps;
  if (rep.idle) {
    rep.idle->EndOfWork();
    rep.counters.gpu_idle_seconds = rep.idle->idle_seconds();
    for (int p = 0; p < kGpuPhases; ++p)
      rep.counters.gpu_busy_seconds[p] = rep.idle->busy_seconds(static_cast<GpuPhase>(p));
  }
}

}  // namespace cnnflow
