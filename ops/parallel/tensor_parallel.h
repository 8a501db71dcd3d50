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
// CPU tensors only, for now. Not thread-safe: member r calls from its own
// thread, every member the same sequence of calls.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ops/collectives/collective.h"
#include "ops/layer.h"

namespace cnnflow {

enum class TensorSplit { kColumn, kRow };
const char* TensorSplitName(TensorSplit split);

// Channels [begin, end) of `total` that member `rank` of `ranks` holds.
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
                      DType dtype = DType::kF32);
  ~TensorParallelShard();

  TensorSplit split() const { return split_; }
  const ShardRange& range() const { return range_; }
  Shape output_shape() const { return out_shape_; }
  Layer& layer() { return *layer_; }

  // This member's part of the unsplit parameters, by local name ("weight",
  // "bias": those of the unsplit layer of the same type and arguments).
  void LoadFull(const std::vector<Parameter>& full);
  // Writes this member's part into the unsplit tensors (values, or with
  // grads the gradients), leaving the rest untouched: once every member has
  // written, they hold the whole layer. Members write disjoint parts.
  void StoreFull(std::vector<Parameter>& full, bool grads) const;

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

  std::string name_;
  TensorSplit split_;
  Collective& group_;
  int rank_;
  ShardRange range_;
  Shape in_shape_, out_shape_, part_out_;  // part_out_: the shard layer's output
  std::unique_ptr<Layer> layer_;
  // From Forward, for Backward: row, x's channels and y; column, y's channels.
  Tensor x_part_, y_part_;
};

}  // namespace cnnflow
