// Operator (tensor) parallelism for one conv2d, conv1d or linear layer: its
// output channels (column-parallel) or its input channels (row-parallel)
// split over the members of a Collective, each member holding a layer of
// the same type over its share of the weight, so every kernel the layer
// has (GEMM, oneDNN) serves the shards unchanged.
//
//   column: member r computes output channels [K_r) of y from the whole x,
//           then all-gathers y; backward sums the members' partial dx
//           (each saw only its channels of dy) with an all-reduce.
//   row:    member r holds input channels [C_r) and computes a partial y
//           from x[:, C_r), all-reduced into y (the bias on member 0
//           only); backward all-gathers dx from the members' channels.
//   spatial (conv2d along the height, conv1d along the length): member r
//           computes output rows [H_r) from the input rows they read, its
//           rows plus a halo of (kernel - 1) / 2 rows a side for a
//           stride-1 "same" conv (zeros past the edges, where the unsplit
//           layer pads), then all-gathers y; backward sums the members'
//           dx windows (the halos overlap, and add) with an all-reduce.
//           Each member holds the whole weight; its gradient is the part
//           from its rows, and the members' parts add up to the whole.
//           Every member holds the whole x here, so the halo is read, not
//           exchanged; a chain of spatial layers that keeps activations
//           split (and exchanges halos) is not done.
//
// Shards are as even as they go: the first K % T members take one channel
// more, so any K >= T splits. Every member is given the whole x (and the
// whole dy) and ends with the whole y (dx), so a split layer drops into a
// model in place of the unsplit one. The all-gather is an all-reduce of a
// zeroed full tensor into which each member wrote its channels: exact (x +
// 0 == x) and carried by every backend with its deadlines and named errors,
// at twice the bytes of a dedicated all-gather.
//
// Weights move as the unsplit tensors (LoadFull / StoreFull), so what a
// split run saves evaluates, exports and resumes on any layout.
//
// A column-parallel layer whose output only a row-parallel one reads
// (directly or through a relu) needs no all-gather between them, as in
// Megatron-LM: with the same members and channels, member r's input
// channels of the row layer are the output channels it computed itself
// (KeepOutputLocal / TakeInputLocal; Model::Build pairs them).
//
// In a model, a split layer is a TensorParallelLayer (below).
//
// On GPUs a member's tensors are on its device, in its lane (ops/device.h),
// and the group's collectives only enqueue: after each, the member's stream
// waits for the sum (Collective::Wait), and the host does not. f32 only.
// Not thread-safe: member r calls from its own thread (on a GPU, in its
// lane), every member the same sequence of calls.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/collectives/collective.h"
#include "ops/layer.h"
#include "ops/model.h"

namespace cnnflow {

enum class TensorSplit { kColumn, kRow, kSpatial };
const char* TensorSplitName(TensorSplit split);

// Channels (rows, for a spatial split) [begin, end) of `total` that member
// `rank` of `ranks` holds.
struct ShardRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
ShardRange ShardOf(int64_t total, int rank, int ranks);

class TensorParallelShard {
 public:
  // Member `rank` of `group` (this process's rank; members are numbered
  // from the group's global_offset(), so a group may span processes)
  // holds its share of layer `name` of `type`
  // ("conv2d", "conv1d", "linear") with YAML parameters `args` (defaults
  // filled), over input samples of shape `input` (no batch dimension).
  // Throws ConfigError naming the layer for another type, groups > 1, or
  // fewer channels than members.
  TensorParallelShard(const std::string& name, const std::string& type, const Args& args,
                      const Shape& input, TensorSplit split, Collective& group, int rank,
                      DType dtype = DType::kF32, Device device = Device::Cpu());
  ~TensorParallelShard();

  TensorSplit split() const { return split_; }
  const ShardRange& range() const { return range_; }
  Shape output_shape() const { return out_shape_; }
  Layer& layer() { return *layer_; }

  // Column split: Forward leaves y holding only this member's channels
  // (zeros elsewhere) and skips the all-gather. For a column layer whose
  // output reaches only a row layer that TakeInputLocal.
  void KeepOutputLocal();
  // Row split: Backward leaves dx holding only this member's channels and
  // skips the all-gather: the column layer before it needs no more.
  void TakeInputLocal();
  bool local_output() const { return local_output_; }
  bool local_input() const { return local_input_; }

  // This member's part of the unsplit parameters, by local name ("weight",
  // "bias": those of the unsplit layer of the same type and arguments).
  void LoadFull(const std::vector<Parameter>& full);
  // Writes this member's part into the unsplit tensors (values, or with
  // grads the gradients), leaving the rest untouched: once every member has
  // written, they hold the whole layer. Members write disjoint parts. A
  // spatial shard writes the whole values, and no gradients (its are
  // partial sums: AddGradsToFull).
  void StoreFull(std::vector<Parameter>& full, bool grads) const;
  // Adds scale x this member's parameter gradients into its part of the
  // unsplit gradients (a spatial shard: into all of them).
  void AddGradsToFull(std::vector<Parameter>& full, float scale) const;

  // x [N, input...], the same on every member -> y [N, output...], the same
  // on every member.
  void Forward(const Tensor& x, Tensor& y, const ForwardContext& ctx);
  // After Forward of the same x: dy [N, output...] -> dx [N, input...] (when
  // not null), the same on every member; adds the shard's weight gradients.
  void Backward(const Tensor& x, const Tensor& dy, Tensor* dx);

 private:
  // The dimension of an unsplit weight or bias this member's share is cut
  // from: rows (column split, and every bias) or columns (row split).
  int ParameterAxis(const Tensor& full) const {
    return split_ == TensorSplit::kRow && full.rank() > 1 ? 1 : 0;
  }
  // The constructor's part for a spatial split.
  void BuildSpatial(const std::string& type, const Args& args, int member, int ranks, DType dtype);
  void MakeLayer(const std::string& type, const Args& args, const Shape& input, DType dtype);
  // t summed over the members in place, ready for this member's next work.
  void Sum(Tensor& t, const char* what);

  std::string name_;
  TensorSplit split_;
  bool local_output_ = false, local_input_ = false;
  Collective& group_;
  int rank_;
  Device device_;
  ShardRange range_;
  Shape in_shape_, out_shape_, part_out_;  // part_out_: the shard layer's output
  std::unique_ptr<Layer> layer_;
  // From Forward, for Backward: row, x's channels and y; column, y's
  // channels; spatial, x's window and y's rows.
  Tensor x_part_, y_part_;
  // Spatial: the split dimension's size in x and y, the floats after it in
  // a row of each, and the window of x rows this member reads:
  // [window_begin_, window_begin_ + window_rows_), past the edges in the
  // padding.
  int64_t in_rows_ = 0, out_rows_ = 0, in_inner_ = 1, out_inner_ = 1;
  int64_t window_begin_ = 0, window_rows_ = 0;
  // The rows of x the window holds: [lo, hi), clamped to x.
  std::pair<int64_t, int64_t> WindowInInput() const {
    return {std::max<int64_t>(window_begin_, 0), std::min(window_begin_ + window_rows_, in_rows_)};
  }
};

// What tensor parallelism costs on this machine, measured: an in-process
// all-reduce among `members` threads of `bytes` (best of 5: its payload
// bandwidth), and a single-threaded GEMM's rate (the layers' kernels run
// at about it) times `threads_per_device`. For `cnnflow validate`.
struct TensorParallelCost {
  double allreduce_gb_per_s = 0;
  double gflops_per_device = 0;
};
TensorParallelCost MeasureTensorParallelCost(int members, int64_t bytes, int threads_per_device);

// Where Model::Build splits layers: which ones and how, and this model's
// member in its tensor-parallel group. Split builds the named layers as
// TensorParallelLayers on the model's device; Pair joins a column layer
// whose output only a row layer reads (directly or through a relu) to it,
// with no all-gather between (Megatron's pairing).
struct TensorParallelPlacement : LayerSplitter {
  std::map<std::string, TensorSplit> layers;
  Collective* group = nullptr;
  int rank = 0;

  std::unique_ptr<Layer> Split(const LayerSpec& spec, const Args& args,
                               Device device) const override;
  void Pair(Model& model) const override;
};

// A split layer in a model. Its parameters are the unsplit tensors, so the
// optimizer, checkpoints, model.safetensors, train.init and the
// data-parallel all-reduce all see the unsplit layer, initialised to the
// same values as unsplit from the same seed. Each Forward takes this
// member's part of them (a copy of 1/T of the weight: small beside the
// convolution over a batch); Backward adds the shard's gradients, times
// the group size, into the member's part of the unsplit gradients, the
// rest staying zero.
//
// Why times T: the T members of a group train on the same rows, so the
// trainer scales the loss gradient by 1/T and the data-parallel all-reduce
// sums every member's gradients. An unsplit layer is then summed T times
// (T x 1/T), and each part of a split one once, from the member that holds
// it (T x 1/T). Exact for T a power of two.
//
// The memory of the split layer's weights is not divided (each member keeps
// the unsplit tensors and their optimizer state); its compute and its
// activations are.
class TensorParallelLayer final : public Layer {
 public:
  TensorParallelLayer(const std::string& name, const std::string& type, const Args& args,
                      TensorSplit split, Collective& group, int rank,
                      Device device = Device::Cpu());
  ~TensorParallelLayer() override;

  const char* type() const override { return type_.c_str(); }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void ResetParameters(Rng& rng) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  // A column or spatial shard applies the relu to its part before the gather.
  bool FuseRelu() override;
  // The unsplit layer's (the model's work, as in an unsplit model), and
  // this member's share of it.
  int64_t ForwardFlops(int64_t n) const override { return n * unsplit_flops_; }
  int64_t MemberFlops(int64_t n) const;
  void MoveTo(Device device) override;

  TensorParallelShard& shard() { return *shard_; }
  const TensorParallelShard& shard() const { return *shard_; }
  // Bytes this member sends and receives in the collectives of one forward
  // and backward of n rows (for reports).
  int64_t CommunicatedBytes(int64_t n, bool backward) const;

 private:
  std::string type_;
  Args args_;
  TensorSplit split_;
  Collective& group_;
  int rank_;
  Device device_;  // where the shard's layer runs
  Shape in_shape_;
  int64_t unsplit_flops_ = 0;  // a sample's
  std::unique_ptr<TensorParallelShard> shard_;
};

}  // namespace cnnflow
