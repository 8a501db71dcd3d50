#include "ops/parallel/tensor_parallel.h"

#include <algorithm>
#include <cstring>

#include "ops/error.h"

namespace cnnflow {
namespace {

// [N, C, S...] viewed as N blocks of C channels of `inner` values each.
struct ChannelView {
  int64_t n, channels, inner;
};

ChannelView ViewOf(const Tensor& t) {
  const int64_t n = t.dim(0), c = t.rank() > 1 ? t.dim(1) : 1;
  return {n, c, n * c == 0 ? 0 : t.numel() / (n * c)};
}

// dst[:, 0..r.size()) = src[:, r) (dst holds r.size() channels).
void CopyChannelsOut(const Tensor& src, ShardRange r, Tensor& dst) {
  const ChannelView s = ViewOf(src);
  const float* from = src.data<float>();
  float* to = dst.data<float>();
  for (int64_t i = 0; i < s.n; ++i) {
    std::memcpy(to + i * r.size() * s.inner, from + (i * s.channels + r.begin) * s.inner,
                static_cast<size_t>(r.size() * s.inner) * sizeof(float));
  }
}

// dst[:, r) = src (src holds r.size() channels).
void CopyChannelsIn(const Tensor& src, ShardRange r, Tensor& dst) {
  const ChannelView d = ViewOf(dst);
  const float* from = src.data<float>();
  float* to = dst.data<float>();
  for (int64_t i = 0; i < d.n; ++i) {
    std::memcpy(to + (i * d.channels + r.begin) * d.inner, from + i * r.size() * d.inner,
                static_cast<size_t>(r.size() * d.inner) * sizeof(float));
  }
}

// The part of a [K, C, ...] weight (or [K] bias) a member holds: rows r
// (column split) or columns r (row split; dim 1).
void CopyParameter(const Tensor& from, Tensor& to, TensorSplit split, ShardRange r,
                   bool into_full) {
  const Tensor& full = into_full ? to : from;
  const Tensor& part = into_full ? from : to;
  if (split == TensorSplit::kColumn || full.rank() == 1) {
    const int64_t inner = full.numel() / full.dim(0);
    float* f = full.data<float>() + r.begin * inner;
    float* p = part.data<float>();
    const size_t bytes = static_cast<size_t>(r.size() * inner) * sizeof(float);
    into_full ? std::memcpy(f, p, bytes) : std::memcpy(p, f, bytes);
    return;
  }
  // [K, C, inner]: per row k, the channels r.
  const int64_t k = full.dim(0), c = full.dim(1), inner = full.numel() / (k * c);
  for (int64_t i = 0; i < k; ++i) {
    float* f = full.data<float>() + (i * c + r.begin) * inner;
    float* p = part.data<float>() + i * r.size() * inner;
    const size_t bytes = static_cast<size_t>(r.size() * inner) * sizeof(float);
    into_full ? std::memcpy(f, p, bytes) : std::memcpy(p, f, bytes);
  }
}

const Parameter& FindParameter(const std::vector<Parameter>& ps, const std::string& name,
                               const std::string& layer) {
  for (const Parameter& p : ps)
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
      CopyParameter(f.value, p.value, split_, range_, /*into_full=*/false);
    }
  }
}

void TensorParallelShard::StoreFull(std::vector<Parameter>& full, bool grads) const {
  for (const Parameter& p : layer_->parameters()) {
    Parameter& f = const_cast<Parameter&>(FindParameter(full, p.name, name_));
    Tensor& to = grads ? f.grad : f.value;
    const Tensor& from = grads ? p.grad : p.value;
    if (split_ == TensorSplit::kRow && p.name == "bias") {
      to.CopyFrom(from);
    } else {
      CopyParameter(from, to, split_, range_, /*into_full=*/true);
    }
  }
}

void TensorParallelShard::Forward(const Tensor& x, Tensor& y, const ForwardContext& ctx) {
  const int64_t n = x.dim(0);
  if (split_ == TensorSplit::kColumn) {
    y_part_ = Tensor::Empty(part_out_.WithBatch(n));
    layer_->Forward({&x}, y_part_, ctx);
    y.Zero();
    CopyChannelsIn(y_part_, range_, y);
    group_.AllReduceSum(rank_, y.data<float>(), y.numel(),
                        StrCat("layer ", name_, " forward all-gather"), 1.0f);
  } else {
    x_part_ = Tensor::Empty(WithChannels(in_shape_, range_.size()).WithBatch(n));
    CopyChannelsOut(x, range_, x_part_);
    layer_->Forward({&x_part_}, y, ctx);
    y_part_ = y;  // the layer's y, for its Backward
    group_.AllReduceSum(rank_, y.data<float>(), y.numel(),
                        StrCat("layer ", name_, " forward all-reduce"), 1.0f);
  }
}

void TensorParallelShard::Backward(const Tensor& x, const Tensor& dy, Tensor* dx) {
  if (split_ == TensorSplit::kColumn) {
    Tensor dy_part = Tensor::Empty(y_part_.shape());
    CopyChannelsOut(dy, range_, dy_part);
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
      CopyChannelsIn(dx_part, range_, *dx);
      group_.AllReduceSum(rank_, dx->data<float>(), dx->numel(),
                          StrCat("layer ", name_, " backward all-gather"), 1.0f);
    }
  }
}

}  // namespace cnnflow
