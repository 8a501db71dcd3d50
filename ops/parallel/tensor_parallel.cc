#include "ops/parallel/tensor_parallel.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "ops/cpu/gemm.h"
#include "ops/cuda/strided_copy.h"
#include "ops/error.h"

namespace cnnflow {
namespace {

// For each of `height` runs: dst[i * dst_pitch + j] = alpha * src[i *
// src_pitch + j], j < width (added with `accumulate`), on dst's device (a
// GPU's: on the calling thread's lane, after the work issued there).
void CopyRuns(const Tensor& dst_tensor, float* dst, int64_t dst_pitch, const float* src,
              int64_t src_pitch, int64_t width, int64_t height, float alpha = 1.0f,
              bool accumulate = false) {
  if (dst_tensor.device().is_cuda()) {
    cuda::StridedCopy(dst_tensor.device(), dst, dst_pitch, src, src_pitch, width, height, alpha,
                      accumulate);
    return;
  }
  for (int64_t i = 0; i < height; ++i) {
    float* to = dst + i * dst_pitch;
    const float* from = src + i * src_pitch;
    if (accumulate) {
      for (int64_t j = 0; j < width; ++j) to[j] += alpha * from[j];
    } else {
      std::memcpy(to, from, static_cast<size_t>(width) * sizeof(float));
    }
  }
}

// `full` viewed as [outer, channels, inner] around dimension `axis`, and
// `part` as the same with only the channels r: part into its place in full
// (into_full, adding alpha times it with `accumulate`) or out of it.
// Activations split on axis 1 ([N, C, ...]), weights on 0 (rows, the
// column split) or 1 (columns, the row split).
void CopyShard(const Tensor& full, int axis, ShardRange r, const Tensor& part, bool into_full,
               float alpha = 1.0f, bool accumulate = false) {
  int64_t outer = 1;
  for (int d = 0; d < axis; ++d) outer *= full.dim(d);
  const int64_t channels = full.dim(axis);
  const int64_t inner = outer * channels == 0 ? 0 : full.numel() / (outer * channels);
  float* f = full.data<float>() + r.begin * inner;
  float* p = part.data<float>();
  const int64_t width = r.size() * inner;
  if (into_full) {
    CopyRuns(full, f, channels * inner, p, width, width, outer, alpha, accumulate);
  } else {
    CopyRuns(part, p, width, f, channels * inner, width, outer);
  }
}

// Rows [src_row, src_row + rows) of src to rows [dst_row, ...) of dst, in
// every plane (every sample and channel): tensors [N, C, R, inner...] that
// differ only in R (src_rows, dst_rows).
void CopyRows(const Tensor& src, int64_t src_rows, int64_t src_row, Tensor& dst, int64_t dst_rows,
              int64_t dst_row, int64_t rows, int64_t inner) {
  if (rows <= 0) return;
  const int64_t planes = src.numel() / (src_rows * inner);
  CopyRuns(dst, dst.data<float>() + dst_row * inner, dst_rows * inner,
           src.data<float>() + src_row * inner, src_rows * inner, rows * inner, planes);
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
  switch (split) {
    case TensorSplit::kColumn:
      return "column";
    case TensorSplit::kRow:
      return "row";
    case TensorSplit::kSpatial:
      return "spatial";
  }
  return "?";
}

ShardRange ShardOf(int64_t total, int rank, int ranks) {
  const int64_t base = total / ranks, extra = total % ranks;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  return {begin, begin + base + (rank < extra ? 1 : 0)};
}

TensorParallelShard::TensorParallelShard(const std::string& name, const std::string& type,
                                         const Args& args, const Shape& input, TensorSplit split,
                                         Collective& group, int rank, DType dtype, Device device)
    : name_(name), split_(split), group_(group), rank_(rank), device_(device), in_shape_(input) {
  CNNFLOW_ENFORCE(dtype == DType::kF32, "tensor parallel layer '", name, "': f32 only");
  if (type != "conv2d" && type != "conv1d" && type != "linear") {
    throw ConfigError(StrCat("layer '", name, "' (", type,
                             ") cannot be split: tensor parallelism splits conv2d, conv1d and "
                             "linear layers"));
  }
  // A spatial shard holds every channel, so any grouping (depthwise too).
  if (type != "linear" && split != TensorSplit::kSpatial && args.Int("groups") != 1) {
    throw ConfigError(StrCat("layer '", name, "' has groups: ", args.Int("groups"),
                             "; a grouped convolution splits only spatially (yet)"));
  }
  // Members are numbered across processes (a group may span them).
  const int ranks = group.global_size();
  const int member = group.global_offset() + rank;
  if (split == TensorSplit::kSpatial) {
    BuildSpatial(type, args, member, ranks, dtype);
    return;
  }
  const int64_t total = split == TensorSplit::kColumn ? args.Int("out") : input[0];
  if (total < ranks) {
    throw ConfigError(StrCat("layer '", name, "' has ", total,
                             split == TensorSplit::kColumn ? " output" : " input",
                             " channels: too few to split over ", ranks, " devices (",
                             TensorSplitName(split), " split)"));
  }
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
  MakeLayer(type, shard, shard_in, dtype);
  out_shape_ = split == TensorSplit::kColumn ? WithChannels(part_out_, args.Int("out")) : part_out_;
}

void TensorParallelShard::BuildSpatial(const std::string& type, const Args& args, int member,
                                       int ranks, DType dtype) {
  if (type == "linear") {
    throw ConfigError(StrCat("layer '", name_,
                             "' (linear) has no rows to split: a spatial split splits conv2d "
                             "(along the height) and conv1d (along the length)"));
  }
  // The split dimension's kernel, stride, pad and dilation (conv1d's only
  // dimension, conv2d's first), and the shard's pads: none along it (the
  // window carries the unsplit layer's padding as zero rows).
  const bool two_d = type == "conv2d";
  const size_t dims = two_d ? 2 : 1;
  const int64_t k = args.Ints("kernel", dims)[0], s = args.Ints("stride", dims)[0],
                p = args.Ints("pad", dims)[0], d = args.Ints("dilation", dims)[0];
  in_rows_ = in_shape_[1];
  in_inner_ = two_d ? in_shape_[2] : 1;
  out_rows_ = (in_rows_ + 2 * p - d * (k - 1) - 1) / s + 1;
  if (out_rows_ < ranks) {
    throw ConfigError(StrCat("layer '", name_, "' has ", out_rows_,
                             " output rows: too few to split over ", ranks,
                             " devices (spatial split)"));
  }
  range_ = ShardOf(out_rows_, member, ranks);
  window_begin_ = range_.begin * s - p;
  window_rows_ = (range_.size() - 1) * s + d * (k - 1) + 1;
  Args shard = args;
  if (two_d) {
    shard.Set("pad", std::vector<int64_t>{0, args.Ints("pad", 2)[1]});
  } else {
    shard.Set("pad", int64_t{0});
  }
  std::vector<int64_t> window = in_shape_.dims();
  window[1] = window_rows_;
  MakeLayer(type, shard, Shape(window), dtype);
  CNNFLOW_ENFORCE(part_out_[1] == range_.size(), "layer '", name_, "': the window of ",
                  window_rows_, " rows makes ", part_out_[1], " output rows, not ", range_.size());
  out_inner_ = two_d ? part_out_[2] : 1;
  std::vector<int64_t> out = part_out_.dims();
  out[1] = out_rows_;
  out_shape_ = Shape(out);
}

// The shard's layer of `type` (its CUDA class on a GPU, initialised on the
// host and moved, as Model::Build does; LoadFull gives it its values).
void TensorParallelShard::MakeLayer(const std::string& type, const Args& args, const Shape& input,
                                    DType dtype) {
  const LayerType* t = LayerRegistry::Get().Find(type, device_.is_cuda() ? kCudaVariant : 0);
  CNNFLOW_ENFORCE(t != nullptr, "no layer type ", type, device_.is_cuda() ? " for GPUs" : "");
  layer_ = t->create(name_, args);
  part_out_ = layer_->Build({input}, dtype);
  if (device_.is_cuda()) layer_->MoveTo(device_);
}

TensorParallelShard::~TensorParallelShard() = default;

void TensorParallelShard::LoadFull(const std::vector<Parameter>& full) {
  for (Parameter& p : layer_->parameters()) {
    const Parameter& f = FindParameter(full, p.name, name_);
    if (split_ == TensorSplit::kSpatial || (split_ == TensorSplit::kRow && p.name == "bias")) {
      p.value.CopyFrom(f.value);  // the whole weight; a row split's bias is member 0's
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
    CNNFLOW_ENFORCE(!(grads && split_ == TensorSplit::kSpatial), "layer '", name_,
                    "': a spatial shard's gradients are partial sums (AddGradsToFull)");
    if (split_ == TensorSplit::kSpatial || (split_ == TensorSplit::kRow && p.name == "bias")) {
      to.CopyFrom(from);
    } else {
      CopyShard(to, ParameterAxis(to), range_, from, /*into_full=*/true);
    }
  }
}

void TensorParallelShard::AddGradsToFull(std::vector<Parameter>& full, float scale) const {
  for (const Parameter& p : layer_->parameters()) {
    Parameter& f = FindParameter(full, p.name, name_);
    const bool whole =
        split_ == TensorSplit::kSpatial || (split_ == TensorSplit::kRow && p.name == "bias");
    const ShardRange r = whole ? ShardRange{0, f.grad.dim(0)} : range_;
    CopyShard(f.grad, whole ? 0 : ParameterAxis(f.grad), r, p.grad, /*into_full=*/true, scale,
              /*accumulate=*/true);
  }
}

void TensorParallelShard::KeepOutputLocal() {
  CNNFLOW_ENFORCE(split_ == TensorSplit::kColumn, "layer '", name_,
                  "': only a column split keeps its output local");
  local_output_ = true;
}

void TensorParallelShard::TakeInputLocal() {
  CNNFLOW_ENFORCE(split_ == TensorSplit::kRow, "layer '", name_,
                  "': only a row split takes its input local");
  local_input_ = true;
}

void TensorParallelShard::Sum(Tensor& t, const char* what) {
  group_.AllReduceSum(rank_, t.data<float>(), t.numel(), StrCat("layer ", name_, " ", what), 1.0f);
  group_.Wait(rank_);  // a GPU group only enqueues: this member's stream waits for the sum
}

void TensorParallelShard::Forward(const Tensor& x, Tensor& y, const ForwardContext& ctx) {
  const int64_t n = x.dim(0);
  if (split_ == TensorSplit::kSpatial) {
    std::vector<int64_t> window = in_shape_.dims();
    window[1] = window_rows_;
    x_part_ = Tensor::Empty(Shape(window).WithBatch(n), DType::kF32, device_);
    // Rows past the edges are the unsplit layer's zero padding.
    const auto [lo, hi] = WindowInInput();
    if (lo > window_begin_ || hi < window_begin_ + window_rows_) x_part_.Zero();
    CopyRows(x, in_rows_, lo, x_part_, window_rows_, lo - window_begin_, hi - lo, in_inner_);
    y_part_ = Tensor::Empty(part_out_.WithBatch(n), DType::kF32, device_);
    layer_->Forward({&x_part_}, y_part_, ctx);
    y.Zero();
    CopyRows(y_part_, range_.size(), 0, y, out_rows_, range_.begin, range_.size(), out_inner_);
    Sum(y, "forward all-gather");
    return;
  }
  if (split_ == TensorSplit::kColumn) {
    y_part_ = Tensor::Empty(part_out_.WithBatch(n), DType::kF32, device_);
    layer_->Forward({&x}, y_part_, ctx);
    y.Zero();
    CopyShard(y, 1, range_, y_part_, /*into_full=*/true);
    if (local_output_) return;  // the row layer after it reads only these channels
    Sum(y, "forward all-gather");
  } else {
    x_part_ =
        Tensor::Empty(WithChannels(in_shape_, range_.size()).WithBatch(n), DType::kF32, device_);
    CopyShard(x, 1, range_, x_part_, /*into_full=*/false);
    layer_->Forward({&x_part_}, y, ctx);
    y_part_ = y;  // the layer's y, for its Backward
    Sum(y, "forward all-reduce");
  }
}

void TensorParallelShard::Backward(const Tensor& x, const Tensor& dy, Tensor* dx) {
  if (split_ == TensorSplit::kSpatial) {
    Tensor dy_part = Tensor::Empty(y_part_.shape(), DType::kF32, device_);
    CopyRows(dy, out_rows_, range_.begin, dy_part, range_.size(), 0, range_.size(), out_inner_);
    Tensor dx_part;
    if (dx != nullptr) dx_part = Tensor::Empty(x_part_.shape(), DType::kF32, device_);
    layer_->Backward({&x_part_}, y_part_, dy_part, {dx != nullptr ? &dx_part : nullptr});
    if (dx != nullptr) {
      const auto [lo, hi] = WindowInInput();
      dx->Zero();
      CopyRows(dx_part, window_rows_, lo - window_begin_, *dx, in_rows_, lo, hi - lo, in_inner_);
      // The windows overlap by the halo: the sum adds both members' parts.
      Sum(*dx, "backward all-reduce");
    }
    return;
  }
  if (split_ == TensorSplit::kColumn) {
    Tensor dy_part = Tensor::Empty(y_part_.shape(), DType::kF32, device_);
    CopyShard(dy, 1, range_, dy_part, /*into_full=*/false);
    layer_->Backward({&x}, y_part_, dy_part, {dx});
    if (dx != nullptr) {
      Sum(*dx, "backward all-reduce");
    }
  } else {
    Tensor dx_part;
    if (dx != nullptr) dx_part = Tensor::Empty(x_part_.shape(), DType::kF32, device_);
    layer_->Backward({&x_part_}, y_part_, dy, {dx != nullptr ? &dx_part : nullptr});
    if (dx != nullptr) {
      dx->Zero();
      CopyShard(*dx, 1, range_, dx_part, /*into_full=*/true);
      if (local_input_) return;  // the column layer before it reads only these channels
      Sum(*dx, "backward all-gather");
    }
  }
}

TensorParallelCost MeasureTensorParallelCost(int members, int64_t bytes, int threads_per_device) {
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point t) {
    return std::chrono::duration<double>(Clock::now() - t).count();
  };
  TensorParallelCost cost;
  const int64_t count = std::max<int64_t>(bytes / 4, 1 << 18);
  LocalGroup group(members, 30, "tensor-parallel cost");
  std::vector<std::vector<float>> data(members, std::vector<float>(count, 1.0f));
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    std::vector<std::thread> threads;
    for (int r = 0; r < members; ++r) {
      threads.emplace_back(
          [&, r] { group.AllReduceSum(r, data[r].data(), count, "measure", 1.0f); });
    }
    for (auto& t : threads) t.join();
    best = std::min(best, seconds(t0));
  }
  cost.allreduce_gb_per_s = static_cast<double>(count) * 4 / best / 1e9;
  const int64_t n = 256;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = Clock::now();
    cpu::Gemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    best = std::min(best, seconds(t0));
  }
  cost.gflops_per_device = 2.0 * n * n * n / best / 1e9 * threads_per_device;
  return cost;
}

TensorParallelLayer::TensorParallelLayer(const std::string& name, const std::string& type,
                                         const Args& args, TensorSplit split, Collective& group,
                                         int rank, Device device)
    : Layer(name),
      type_(type),
      args_(args),
      split_(split),
      group_(group),
      rank_(rank),
      device_(device) {}

TensorParallelLayer::~TensorParallelLayer() = default;

namespace {

// The unsplit layer of `type`, built: for its parameter shapes and its
// initialisation.
std::unique_ptr<Layer> BuildUnsplit(const std::string& name, const std::string& type,
                                    const Args& args, const Shape& input, DType dtype,
                                    Shape* out = nullptr) {
  const LayerType* t = LayerRegistry::Get().Find(type);
  CNNFLOW_ENFORCE(t != nullptr, "no layer type ", type);
  std::unique_ptr<Layer> layer = t->create(name, args);
  const Shape shape = layer->Build({input}, dtype);
  if (out != nullptr) *out = shape;
  return layer;
}

}  // namespace

Shape TensorParallelLayer::Build(const std::vector<Shape>& inputs, DType dtype) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "layer '", name(), "' takes one input");
  in_shape_ = inputs[0];
  Shape out;
  const std::unique_ptr<Layer> unsplit = BuildUnsplit(name(), type_, args_, in_shape_, dtype, &out);
  for (const Parameter& p : unsplit->parameters()) AddParameter(p.name, p.value.shape(), dtype);
  unsplit_flops_ = unsplit->ForwardFlops(1);
  shard_ = std::make_unique<TensorParallelShard>(name(), type_, args_, in_shape_, split_, group_,
                                                 rank_, dtype, device_);
  CNNFLOW_ENFORCE(shard_->output_shape() == out, "layer '", name(), "': the split makes ",
                  shard_->output_shape(), ", the unsplit layer ", out);
  return out;
}

void TensorParallelLayer::ResetParameters(Rng& rng) {
  // The unsplit layer's own initialisation, from the same stream: the same
  // values as in an unsplit model.
  const std::unique_ptr<Layer> unsplit =
      BuildUnsplit(name(), type_, args_, in_shape_, parameters().front().value.dtype());
  unsplit->ResetParameters(rng);
  for (size_t i = 0; i < parameters().size(); ++i) {
    parameters()[i].value.CopyFrom(unsplit->parameters()[i].value);
  }
}

void TensorParallelLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                                  const ForwardContext& ctx) {
  shard_->LoadFull(parameters());
  shard_->Forward(*x[0], y, ctx);
}

void TensorParallelLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/,
                                   const Tensor& dy, const std::vector<Tensor*>& dx) {
  for (Parameter& p : shard_->layer().parameters()) p.grad.Zero();
  shard_->Backward(*x[0], dy, dx[0]);
  shard_->AddGradsToFull(parameters(), static_cast<float>(group_.global_size()));
}

bool TensorParallelLayer::FuseRelu() {
  return split_ != TensorSplit::kRow && shard_->layer().FuseRelu();
}

int64_t TensorParallelLayer::MemberFlops(int64_t n) const {
  return shard_->layer().ForwardFlops(n);
}

void TensorParallelLayer::MoveTo(Device device) {
  CNNFLOW_ENFORCE(device == device_, "tensor parallel layer '", name(), "' was built for ",
                  device_.ToString(), ", not ", device.ToString());
  Layer::MoveTo(device);  // the unsplit tensors; the shard's layer is there already
}

int64_t TensorParallelLayer::CommunicatedBytes(int64_t n, bool backward) const {
  const int64_t y = shard_->output_shape().numel() * n * 4, x = in_shape_.numel() * n * 4;
  if (!backward) return split_ == TensorSplit::kColumn && shard_->local_output() ? 0 : y;
  return split_ == TensorSplit::kRow && shard_->local_input() ? 0 : x;
}

std::unique_ptr<Layer> TensorParallelPlacement::Split(const LayerSpec& spec, const Args& args,
                                                      Device device) const {
  auto it = layers.find(spec.name);
  if (it == layers.end()) return nullptr;
  return std::make_unique<TensorParallelLayer>(spec.name, spec.type, args, it->second, *group, rank,
                                               device);
}

void TensorParallelPlacement::Pair(Model& model) const {
  for (const auto& [name, split] : layers) {
    if (model.FindLayer(name) == nullptr) {
      throw ConfigError(StrCat("graph.tensor_parallel splits layer '", name,
                               "', which is not a layer of the model"));
    }
  }
  const int n = model.num_layers();
  std::vector<int> readers(n, 0);
  for (int i = 0; i < n; ++i)
    for (int j : model.input_indices(i))
      if (j >= 0) ++readers[j];
  auto split_of = [&model](int i) -> TensorParallelLayer* {
    return i >= 0 ? dynamic_cast<TensorParallelLayer*>(&model.layer(i)) : nullptr;
  };
  for (int i = 0; i < n; ++i) {
    TensorParallelLayer* row = split_of(i);
    if (row == nullptr || row->shard().split() != TensorSplit::kRow) continue;
    int j = model.input_indices(i)[0];
    if (j < 0 || readers[j] != 1) continue;
    // Through one relu: it keeps each channel to itself.
    if (std::string(model.layer(j).type()) == "relu") {
      j = model.input_indices(j)[0];
      if (j < 0 || readers[j] != 1) continue;
    }
    TensorParallelLayer* column = split_of(j);
    if (column == nullptr || column->shard().split() != TensorSplit::kColumn ||
        column->shard().range().begin != row->shard().range().begin ||
        column->shard().range().end != row->shard().range().end) {
      continue;
    }
    column->shard().KeepOutputLocal();
    row->shard().TakeInputLocal();
  }
}

}  // namespace cnnflow
