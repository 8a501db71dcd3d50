// Data parallelism: N replicas of a model in this process (and, through
// HierarchicalAllReduce, in every process of an MPI job), each training on
// its shard of the global batch, kept identical by averaging gradients.
//
// As PyTorch's DistributedDataParallel does:
//  - parameters start identical (broadcast from replica 0 of process 0);
//  - gradients are grouped into buckets of about `bucket_mb`, in reverse
//    layer order (the order backward produces them); each parameter's grad
//    is a view into its bucket's flat buffer, so nothing is copied;
//  - a bucket is handed to the replica's communication thread the moment
//    backward has finished its layers, and is all-reduced while backward
//    goes on with earlier layers;
//  - every replica steps its own optimizer with the same reduced gradient,
//    so the replicas stay bitwise identical without sending parameters;
//  - BatchNorm running statistics are broadcast from replica 0 after each
//    step (`broadcast_buffers`); SyncBN statistics travel the same way.
//
// Every collective of a replica is issued by its one communication thread,
// in the order the replica's compute thread asked for them; that order is
// the same on every replica, which is what matching collectives by call
// order (ops/collectives/collective.h) needs.
//
// Gradient semantics: the loss gradient of each replica is scaled by
// 1 / (global batch), and buckets are SUMMED, so the result is exactly the
// gradient of the mean loss over the global batch, even for a last batch
// whose shards differ in size. Accumulation (ForwardBackward with
// reduce = false) adds into the same buffers and reduces on the last one.
#pragma once

#include <tbb/task_arena.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ops/collectives/collective.h"
#include "ops/collectives/collective_mpi.h"
#include "ops/device_ops.h"
#include "ops/loss.h"
#include "ops/model.h"
#include "ops/parallel/member_threads.h"
#include "ops/parallel/step_graph.h"
#include "ops/parallel/tensor_parallel.h"
#include "ops/train/loss_scaler.h"
#include "ops/train/optimizer.h"

namespace cnnflow {

struct DataParallelOptions {
  int replicas = 1;  // in this process
  // The device of each replica (empty: all cpu). GPU replicas run their
  // kernels on their GPU's stream and reduce with NCCL (ops/cuda/nccl_comm.h)
  // instead of the host collectives, each issuing its collectives from its
  // own compute thread (the caller runs replicas on distinct threads).
  int threads_per_replica = 1;
  // Replicas' kernels flush denormals to zero (cpu::MakeComputeArena).
  bool flush_denormals = true;
  double bucket_mb = 25;
  bool broadcast_buffers = true;
  bool sync_bn = false;
  double timeout_s = 300;  // every collective
  std::vector<Device> devices;
  // Mixed precision on GPUs (ops/model.h): activations in f16 or bf16 over
  // f32 parameters. f16 also scales the loss dynamically (ops/train/loss_scaler.h):
  // a step whose reduced gradients hold an inf or NaN is skipped.
  DType compute = DType::kF32;
  LossScalerOptions loss_scaler;  // f16 only
  // GPU replicas: TF32 and deterministic algorithms (graph.tf32,
  // graph.deterministic; ops/device_ops.h), set on each replica's GPU.
  GpuMathOptions gpu_math;
  // The activations' layout on CPUs (ops/model.h).
  MemoryFormat memory_format = MemoryFormat::kAuto;
  bool fuse_activations = true;  // graph.fuse_activations (ModelOptions)
  // graph.cuda_graph: a GPU replica's forward and backward replayed as CUDA
  // graphs where they can be (ops/parallel/step_graph.h).
  bool cuda_graph = false;
  // Tensor parallelism (ops/parallel/tensor_parallel.h), CPU replicas: the
  // replicas come in groups of T = `tensor_parallel` consecutive ones. A
  // group's members split the layers of `split_layers` between them and
  // train on the same rows; the groups are the data-parallel replicas.
  //  - T divides `replicas`: replica r is member r % T of local group r / T;
  //  - T is a multiple of `replicas`: a group spans P = T / replicas
  //    consecutive processes of the MPI job (ranks g*P .. g*P+P-1), all of
  //    this process's replicas in it, its collectives on a communicator of
  //    its own (MpiWorld::Split); those processes read the same rows.
  int tensor_parallel = 1;
  std::map<std::string, TensorSplit> split_layers;
};

// Which parameters share a bucket: Model::NamedParameters() indices, in
// reverse layer order, cut when a bucket reaches bucket_mb (a parameter is
// never split).
struct Bucket {
  std::vector<int> params;
  int64_t numel = 0;
  std::vector<int> layers;  // layers whose parameters are in it
  std::string tag;          // "bucket 0 (fc2.bias..fc1.weight)"
};
std::vector<Bucket> LayoutBuckets(Model& model, double bucket_mb);

// Throws the training error for a non-finite loss at `step` (optimizer steps).
void CheckLossFinite(double loss, int64_t step);

// When a replica's step spent its time, for reports and tests (seconds on
// the steady clock since the ReplicaSet was made).
struct StepTimeline {
  double backward_begin = 0, backward_end = 0;
  std::vector<double> reduce_begin, reduce_end;  // per bucket
  double wait_seconds = 0;                       // Step() waiting for reductions after backward
};

class ReplicaSet {
 public:
  // Builds the replicas (same seed: identical initial parameters, then a
  // broadcast from replica 0 of process 0 makes sure) and their optimizers.
  // `world` may be inactive (a single process).
  ReplicaSet(const std::vector<LayerSpec>& layers, const Shape& input_shape, uint64_t seed,
             InitScheme init, const OptimizerSpec& optimizer, const DataParallelOptions& options,
             MpiWorld& world);
  ~ReplicaSet();

  int size() const { return static_cast<int>(replicas_.size()); }
  // Members of a tensor-parallel group over all its processes (1: none).
  int tensor_parallel() const { return options_.tensor_parallel; }
  // The processes a group spans (1: groups are in-process).
  int tensor_parallel_processes() const { return tensor_parallel() / tp_local_; }
  // The data-parallel replicas of this process (its groups, or 1 when its
  // replicas are part of a group that spans processes), and replica r's.
  int data_parallel() const { return size() / tp_local_; }
  int data_replica(int r) const { return r / tp_local_; }
  // Replica r's member index in its group, over the group's processes.
  int tensor_parallel_member(int r) const { return tp_first_member_ + r % tp_local_; }
  // Replicas over all processes, and this process's first one.
  int global_size() const;
  int global_offset() const;
  // The device of replica r's model.
  Device device(int r = 0) const;
  // Replica r's GPU lane (ops/device.h): 0 unless its GPU is listed before
  // it too. Work of replica r done outside ReplicaSet (staging its batches)
  // runs in a GpuLaneScope of it.
  int lane(int r) const;
  Model& model(int r = 0);
  Optimizer& optimizer(int r = 0);
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const DataParallelOptions& options() const { return options_; }
  // Replica r's f16 loss scale (1 without loss scaling).
  double loss_scale(int r = 0) const;

  struct Result {
    double loss_sum = 0;  // sum over the shard's samples
    int64_t correct = 0;
    // A GPU replica's loss, still on its way back: the caller reads it when
    // it needs it (loss_sum = Get().loss * rows), so the host never waits
    // for the GPU in the middle of a step. Null on a CPU replica.
    std::shared_ptr<PendingLoss> pending;
  };
  // Replica r: forward and backward of its shard x [n, ...] with labels.
  // For a GPU replica, x may be on its GPU already (then `device_labels`
  // holds the labels in GPU memory: see ops/cuda/batch_stager.h); a host x is
  // copied first.
  // grad_scale multiplies the summed loss gradient (1 / global batch, over
  // accumulated micro-batches too). With reduce, each bucket is all-reduced
  // as soon as backward has filled it, and the BN buffers are broadcast from
  // global replica 0 after the buckets. Runs in the replica's task arena.
  // Throws (after aborting the other replicas' collectives) on a non-finite
  // loss (a GPU replica: when the pending loss is read).
  // mix: mixed targets of the shard (mixup, cutmix), in host memory; a GPU
  // replica takes `device_mix` (the same in its GPU's memory, staged with the
  // labels) when given, else copies `mix` to its GPU.
  Result ForwardBackward(int r, const Tensor& x, const int64_t* labels, const ForwardContext& ctx,
                         double grad_scale, double label_smoothing, bool reduce,
                         const int64_t* device_labels = nullptr, const LabelMix* mix = nullptr,
                         const LabelMix* device_mix = nullptr);
  // Replica r: waits until the collectives its ForwardBackward issued are
  // done (where a stalled peer becomes an error).
  void WaitForReductions(int r);
  // Replica r: WaitForReductions, then steps its optimizer with lr (unless
  // the f16 loss scaler skips it) and zeroes its gradients.
  void Step(int r, double lr);
  // Inference on replica 0's model (with tensor parallelism, every member
  // of group 0 runs it, each in its arena, and member 0's output is
  // returned): for evaluation and prediction.
  const Tensor& Infer(const Tensor& x, const ForwardContext& ctx);
  // Replica r's part of agreeing, across every replica of every process,
  // whether any of them was asked to stop; all get the same answer (so all
  // stop after the same step). Call after `step` on every replica. In one
  // process the replicas share one request flag: the first replica to agree
  // on a step takes its value for all, with no collective (on GPUs its
  // read-back would wait for the step's kernels, and the host could not
  // issue the next step while the GPUs run this one).
  bool AgreeStop(int r, int64_t step, bool stop_requested);
  // Aborts every replica's collectives (a replica failed).
  void Abort(const std::string& reason);

  // graph.cuda_graph on replica r: whether its steps may be captured, how
  // many were replayed in how many captures, and why none are ("" while
  // they may be).
  struct CudaGraphStatus {
    bool requested = false;
    int64_t replayed_steps = 0;    // forward and backward
    int64_t replayed_updates = 0;  // the optimizer's
    int captures = 0;
    std::string why_not;
  };
  CudaGraphStatus cuda_graph(int r) const;

  const StepTimeline& timeline(int r) const;
  // Where replica r's time went since the last ResetCounters (benchmarks;
  // the trainer takes differences per epoch). Host time: on a GPU replica
  // forward and backward are the time to issue their kernels.
  struct Counters {
    // Waiting for its next batch: from the end of its last ForwardBackward,
    // Step or AgreeStop (or StartPass) to the start of the next ForwardBackward.
    double data_wait_seconds = 0;
    double forward_seconds = 0;   // forward and loss (and copying a host shard to its device)
    double backward_seconds = 0;  // backward, issuing the bucket reductions as it goes
    // Waiting for its peers: the reductions after backward, and AgreeStop.
    double reduce_wait_seconds = 0;
    double optimizer_seconds = 0;  // the optimizer step
    int64_t steps = 0;             // optimizer steps
    int64_t skipped_steps = 0;     // of those, skipped by the f16 loss scaler
    // A GPU replica: its GPU's idle time between steps (waiting for the host
    // or the next batch), and its busy time in each phase of a step (by
    // GpuPhase: the all-reduce's is its stream waiting for its peers),
    // measured on the GPU: the host's figures above are those of issuing.
    double gpu_idle_seconds = 0;
    std::array<double, kGpuPhases> gpu_busy_seconds{};
    double compute_seconds() const {
      return forward_seconds + backward_seconds + optimizer_seconds;
    }
  };
  const Counters& counters(int r) const;
  void ResetCounters();
  // A train pass starts: each replica's wait for its first batch counts
  // from now (not from its last step of the previous pass).
  void StartPass();

 private:
  struct Replica;
  // The constructor's steps: the tensor-parallel groups (graph.tensor_parallel),
  // each replica's gradients as views into its buckets' flat buffers, and
  // the broadcast of replica 0's initial state.
  void MakeTensorParallelGroups(MpiWorld& world);
  void MakeGpuTensorParallelGroups(MpiWorld& world);
  void BindGradientBuckets(Replica& rep);
  void BroadcastInitialState();
  // Issues replica r's collective fn: where collectives block, on r's
  // communication thread (after what is queued there), so that the caller
  // goes on; where they only enqueue (NCCL), at once.
  void Issue(int r, std::function<void()> fn);
  // Waits until every collective replica r issued is done; rethrows its error.
  void Complete(int r);
  void IssueBufferBroadcasts(int r);
  double Now() const;
  void CommLoop(Replica& rep);
  // The optimizer step after the reductions, unless the f16 loss scaler
  // found an inf or NaN in the gradients (then skipped); zeroes the grads.
  void ApplyStep(Replica& rep, double lr);

  DataParallelOptions options_;
  std::vector<Bucket> buckets_;
  // Every replica of every process (ops/collectives/collective_mpi.h's
  // MakeReplicaCollective); null when there is nobody to talk to.
  std::unique_ptr<Collective> collective_;
  bool multi_process_ = false;  // the replicas span processes (MPI)
  // One process's stop agreement: by step, the value taken and how many
  // replicas have read it.
  std::mutex stop_mu_;
  std::map<int64_t, std::pair<bool, int>> stop_votes_;
  // One per tensor-parallel group of this process (empty without): a
  // LocalGroup, or over tp_world_ when the group spans processes.
  std::unique_ptr<MpiWorld> tp_world_;
  std::vector<std::unique_ptr<Collective>> tp_groups_;
  int tp_local_ = 1;                           // members of a group in this process
  int tp_first_member_ = 0;                    // this process's first one's index in its group
  std::unique_ptr<MemberThreads> tp_threads_;  // Infer's, when tp_local_ > 1
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace cnnflow
