#include "ops/parallel/tensor_parallel.h"

#include <algorithm>
#include <cstring>

#include "ops/error.h"

namespace cnnflow {
namespace {

// `full` viewed as [outer, channels, inner] around dimension `axis`, and
// `part` as the same with only the channels r: copies part into its place
// in full (into_full) or out of it. Activations split on axis 1 ([N, C,
// ...]), weights on 0 (rows, the column split) or 1 (columns, the row split).
void CopyShard(const Tensor& full, int axis, ShardRange r, const Tensor& part, bool into_full) {
  int64_t outer = 1;
  for (int d = 0; d < axis; ++d) outer *= full.dim(d);
  const int64_t channels = full.dim(axis);
  const int64_t inner = outer * channels == 0 ? 0 : full.numel() / (outer * channels);
  const size_t bytes = static_cast<size_t>(r.size() * inner) * sizeof(float);
  for (int64_t i = 0; i < outer; ++i) {
    float* f = full.data<float>() + (i * channels + r.begin) * inner;
    float* p = part.data<float>() + i * r.size() * inner;
    into_full ? std::memcpy(f, p, bytes) : std::memcpy(p, f, bytes);
  }
}

// The parameter `name` of ps (a layer's or the unsplit ones).
template <typename Parameters>
auto& FindParameter(Parameters& ps, const std::string& name, const std::string& layer) {
  for (auto& p : ps)
    if (p.name == name) return p;
  throw Error(
      StrCat("tensor parallel layer '", layer, "': the unsplit parameters have no '", name, "'"));
}

// `s` with its first (channel) dimension set to c.
Shape WithChannels(const Shape& s, int64_t c) {
  std::vector<int64_t> d = s.dims();
  d[0] = c;
  return Shape(d);
}

}  // namespace

const char* TensorSplitName(TensorSplit split) {
  return split == TensorSplit::kColumn ? "column" : "row";
}

ShardRange ShardOf(int64_t total, int rank, int ranks) {
  const int64_t base = total / ranks, extra = total % ranks;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

TensorParallelShard::TensorParallelShard(const std::string& name, const std::string& type,
                                         const Args& args, const Shape& input, TensorSplit split,
                                         Collective& group, int rank, DType dtype)
    : name_(name), split_(split), group_(group), rank_(rank), in_shape_(input) {
  CNNFLOW_ENFORCE(dtype == DType::kF32, "tensor parallel layer '", name, "': f32 only");
  if (type != "conv2d" && type != "conv1d" && type != "linear") {
    throw ConfigError(StrCat("layer '", name, "' (", type,
                             ") cannot be split: tensor parallelism splits conv2d, conv1d and "
                             "linear layers"));
  }
  if (type != "linear" && args.Int("groups") != 1) {
    throw ConfigError(StrCat("layer '", name, "' has groups: ", args.Int("groups"),
                             "; a grouped convolution cannot be split (yet)"));
  }
  // Members are numbered across processes (a group may span them).
  const int ranks = group.global_size();
  const int64_t total = split == TensorSplit::kColumn ? args.Int("out") : input[0];
  if (total < ranks) {
    throw ConfigError(StrCat("layer '", name, "' has ", total,
                             split == TensorSplit::kColumn ? " output" : " input",
                             " channels: too few to split over ", ranks, " devices (",
                             TensorSplitName(split), " split)"));
  }
  const int member = group.global_offset() + rank;
  range_ = ShardOf(total, member, ranks);
  Args shard = args;
  Shape shard_in = input;
  if (split == TensorSplit::kColumn) {
    shard.Set("out", range_.size());
  } else {
    shard_in = WithChannels(input, range_.size());
    if (shard.Has("in") && shard.Int("in") != 0) shard.Set("in", range_.size());
    shard.Set("bias", member == 0 && args.Bool("bias"));  // added once, by member 0
  }
  const LayerType* t = LayerRegistry::Get().Find(type);
  CNNFLOW_ENFORCE(t != nullptr, "no layer type ", type);
  layer_ = t->create(name, shard);
  part_out_ = layer_->Build({shard_in}, dtype);
  out_shape_ = split == TensorSplit::kColumn ? WithChannels(part_out_, args.Int("out")) : part_out_;
}

TensorParallelShard::~TensorParallelShard() = default;

void TensorParallelShard::LoadFull(const std::vector<Parameter>& full) {
  for (Parameter& p : layer_->parameters()) {
    const Parameter& f = FindParameter(full, p.name, name_);
    if (split_ == TensorSplit::kRow && p.name == "bias") {
      p.value.CopyFrom(f.value);  // member 0's whole bias
    } else {
      CopyShard(f.value, ParameterAxis(f.value), range_, p.value, /*into_full=*/false);
    }
  }
}

void TensorParallelShard::StoreFull(std::vector<Parameter>& full, bool grads) const {
  for (const Parameter& p : layer_->parameters()) {
    Parameter& f = FindParameter(full, p.name, name_);
    Tensor& to = grads ? f.grad : f.value;
    const Tensor& from = grads ? p.grad : p.value;
    if (split_ == TensorSplit::kRow && p.name == "bias") {
      to.CopyFrom(from);
    } else {
      CopyShard(to, ParameterAxis(to), range_, from, /*into_full=*/true);
    }
  }
}

void TensorParallelShard::Forward(const Tensor& x, Tensor& y, const ForwardContext& ctx) {
  const int64_t n = x.dim(0);
  if (split_ == TensorSplit::kColumn) {
    y_part_ = Tensor::Empty(part_out_.WithBatch(n));
    layer_->Forward({&x}, y_part_, ctx);
    y.Zero();
    CopyShard(y, 1, range_, y_part_, /*into_full=*/true);
    group_.AllReduceSum(rank_, y.data<float>(), y.numel(),
                        StrCat("layer ", name_, " forward all-gather"), 1.0f);
  } else {
    x_part_ = Tensor::Empty(WithChannels(in_shape_, range_.size()).WithBatch(n));
    CopyShard(x, 1, range_, x_part_, /*into_full=*/false);
    layer_->Forward({&x_part_}, y, ctx);
    y_part_ = y;  // the layer's y, for its Backward
    group_.AllReduceSum(rank_, y.data<float>(), y.numel(),
                        StrCat("layer ", name_, " forward all-reduce"), 1.0f);
  }
}

void TensorParallelShard::Backward(const Tensor& x, const Tensor& dy, Tensor* dx) {
  if (split_ == TensorSplit::kColumn) {
    Tensor dy_part = Tensor::Empty(y_part_.shape());
    CopyShard(dy, 1, range_, dy_part, /*into_full=*/false);
    layer_->Backward({&x}, y_part_, dy_part, {dx});
    if (dx != nullptr) {
      group_.AllReduceSum(rank_, dx->data<float>(), dx->numel(),
                          StrCat("layer ", name_, " backward all-reduce"), 1.0f);
    }
  } else {
    Tensor dx_part;
    if (dx != nullptr) dx_part = Tensor::Empty(x_part_.shape());
    layer_->Backward({&x_part_}, y_part_, dy, {dx != nullptr ? &dx_part : nullptr});
    if (dx != nullptr) {
      dx->Zero();
      CopyShard(*dx, 1, range_, dx_part, /*into_full=*/true);
      group_.AllReduceSum(rank_, dx->data<float>(), dx->numel(),
                          StrCat("layer ", name_, " backward all-gather"), 1.0f);
    }
  }
}

}  // namespace cnnflow
