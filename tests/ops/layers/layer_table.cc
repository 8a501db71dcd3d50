#include "tests/ops/layers/layer_table.h"

#include <cctype>

#include "tests/ops/gradient_check.h"

namespace cnnflow::testing {
namespace {

Args A(std::initializer_list<std::pair<const char*, ParamValue>> kv = {}) {
  Args a;
  for (const auto& [k, v] : kv) a.Set(k, v);
  return a;
}

LayerCase Row(std::string type, Args args, std::vector<Shape> inputs, std::string variant = "") {
  LayerCase c;
  c.type = std::move(type);
  c.args = std::move(args);
  c.inputs = std::move(inputs);
  c.variant = std::move(variant);
  return c;
}

// Evaluation mode (running statistics, dropout off).
LayerCase Eval(LayerCase c) {
  c.training = false;
  c.variant += c.variant.empty() ? "eval" : "_eval";
  return c;
}

std::vector<LayerCase> MakeCases() {
  using I = int64_t;
  using Ints = std::vector<int64_t>;
  std::vector<LayerCase> r;
  // ---- convolutions
  r.push_back(Row("conv2d", A({{"out", I{4}}, {"kernel", I{3}}, {"pad", I{1}}}), {{3, 6, 5}}));
  r.push_back(Row("conv2d", A({{"out", I{4}}, {"kernel", I{3}}, {"stride", I{2}}, {"bias", false}}),
                  {{2, 7, 7}}, "stride2_nobias"));
  r.push_back(Row("conv2d", A({{"out", I{6}}, {"kernel", Ints{3, 1}}, {"groups", I{3}}}),
                  {{3, 5, 4}}, "groups3"));
  r.push_back(Row("conv2d", A({{"out", I{4}}, {"kernel", I{7}}, {"pad", I{3}}, {"groups", I{4}}}),
                  {{4, 8, 8}}, "depthwise7x7"));
  r.push_back(Row("conv2d", A({{"out", I{3}}, {"kernel", I{3}}, {"dilation", I{2}}, {"pad", I{2}}}),
                  {{2, 6, 6}}, "dilation2"));
  r.push_back(Row("conv1d", A({{"out", I{4}}, {"kernel", I{3}}, {"pad", I{1}}}), {{3, 11}}));
  r.push_back(
      Row("conv1d", A({{"out", I{8}}, {"kernel", I{5}}, {"pad", I{2}}}), {{8, 13}}, "tapgemm"));
  r.push_back(Row("conv1d",
                  A({{"out", I{4}}, {"kernel", I{4}}, {"stride", I{3}}, {"groups", I{2}}}),
                  {{2, 17}}, "stride3_groups2"));
  // ---- fully connected
  r.push_back(Row("linear", A({{"out", I{5}}}), {{7}}));
  r.push_back(Row("linear", A({{"out", I{3}}, {"bias", false}}), {{2, 3, 3}}, "flattens_nobias"));
  // ---- normalisation
  r.push_back(Row("batchnorm", A(), {{3, 4, 5}}, "2d"));
  r.push_back(Row("batchnorm", A({{"affine", false}}), {{3, 6}}, "1d_noaffine"));
  r.push_back(Row("batchnorm", A(), {{5}}, "features"));
  r.back().batch = 6;  // statistics over 2 values leave dx all cancellation
  r.push_back(Eval(Row("batchnorm", A(), {{3, 4, 5}}, "2d")));
  // ---- pooling
  r.push_back(Row("maxpool2d", A({{"kernel", I{2}}}), {{2, 6, 6}}));
  r.push_back(Row("maxpool2d", A({{"kernel", I{3}}, {"stride", I{2}}, {"pad", I{1}}}), {{2, 7, 7}},
                  "k3s2p1"));
  // ceil_mode: the last windows hang over the (padded) input, clipped to it.
  r.push_back(Row("maxpool2d", A({{"kernel", I{3}}, {"stride", I{2}}, {"ceil_mode", true}}),
                  {{2, 6, 6}}, "ceil"));
  r.push_back(Row("avgpool2d", A({{"kernel", I{2}}}), {{2, 6, 6}}));
  r.push_back(Row("avgpool2d",
                  A({{"kernel", I{3}}, {"stride", I{2}}, {"pad", I{1}}, {"ceil_mode", true}}),
                  {{2, 6, 6}}, "ceil"));
  r.push_back(Row(
      "avgpool2d",
      A({{"kernel", I{3}}, {"stride", I{2}}, {"ceil_mode", true}, {"count_include_pad", false}}),
      {{2, 5, 7}}, "ceil_exclude_pad"));
  r.push_back(
      Row("avgpool2d",
          A({{"kernel", I{3}}, {"stride", I{2}}, {"pad", I{1}}, {"count_include_pad", false}}),
          {{2, 7, 7}}, "k3s2p1_excludepad"));
  r.push_back(Row("maxpool1d", A({{"kernel", I{3}}, {"stride", I{2}}}), {{3, 11}}));
  r.push_back(Row("avgpool1d", A({{"kernel", I{2}}}), {{3, 10}}));
  r.push_back(Row("global_avgpool", A(), {{3, 4, 5}}, "2d"));
  r.push_back(Row("global_avgpool", A(), {{3, 9}}, "1d"));
  // ---- elementwise and shape
  r.push_back(Row("relu", A(), {{3, 4, 5}}));
  r.push_back(Row("add", A(), {{3, 4, 5}, {3, 4, 5}}));
  r.push_back(Row("flatten", A(), {{3, 4, 5}}));
  r.push_back(Row("channel_shuffle", A({{"groups", int64_t{3}}}), {{6, 2, 3}}));
  r.push_back(Row("channel_shuffle", A({{"groups", int64_t{2}}}), {{4, 5}}, "1d"));
  r.push_back(Row("channel_slice", A({{"start", int64_t{2}}, {"end", int64_t{5}}}), {{6, 2, 3}}));
  r.push_back(
      Row("channel_slice", A({{"start", int64_t{0}}, {"end", int64_t{2}}}), {{4, 5}}, "1d"));
  r.push_back(Row("dropout", A({{"p", 0.3}}), {{4, 5}}));
  r.push_back(Eval(Row("dropout", A({{"p", 0.3}}), {{4, 5}})));
  // ---- joins and scales
  r.push_back(Row("concat", A(), {{2, 3, 4}, {3, 3, 4}}));
  r.push_back(Row("concat", A(), {{1, 5}, {2, 5}, {4, 5}}, "three_1d"));
  r.push_back(Row("mul", A(), {{3, 4, 5}, {3, 4, 5}}, "same_shape"));
  r.push_back(Row("mul", A(), {{3, 4, 5}, {3, 1, 1}}, "squeeze_excitation"));
  r.push_back(Row("mul", A(), {{3, 7}, {3}}, "per_channel_1d"));
  r.push_back(Row("mul", A({{"scale", std::vector<double>{0.111}}}), {{3, 4, 5}}, "constant"));
  r.push_back(Row("layer_scale", A({{"init", 0.5}}), {{3, 4, 5}}));
  r.push_back(Row("layer_scale", A({{"init", 0.5}}), {{4, 6}}, "1d"));
  r.push_back(Row("channel_linear", A({{"out", I{5}}}), {{3, 4, 5}}));
  r.push_back(Row("channel_linear", A({{"out", I{4}}, {"bias", false}}), {{6, 7}}, "1d_nobias"));
  // ---- normalisation over channels
  r.push_back(Row("layernorm", A({{"eps", 1e-6}}), {{6, 3, 4}}));
  r.push_back(Row("layernorm", A({{"affine", false}}), {{5, 7}}, "1d_noaffine"));
  r.push_back(Row("layernorm", A(), {{8}}, "features"));
  r.push_back(Row("groupnorm", A({{"groups", I{2}}}), {{4, 3, 3}}));
  r.push_back(Row("groupnorm", A({{"groups", I{3}}, {"affine", false}}), {{6, 5}}, "1d_noaffine"));
  // ---- activations (ops/layers/activation.h): inputs across the kinks
  // (-3, 0, 3, 6) and the saturated tails
  auto act = [&](const char* type, Args args, std::string variant, double lo, double hi) {
    r.push_back(Row(type, std::move(args), {{3, 4, 5}}, std::move(variant)));
    r.back().lo = lo;
    r.back().hi = hi;
  };
  act("gelu", A(), "", -6, 6);
  act("gelu", A({{"approximate", std::string("tanh")}}), "tanh", -6, 6);
  act("silu", A(), "", -8, 8);
  act("sigmoid", A(), "", -8, 8);
  act("tanh", A(), "", -4, 4);
  act("hardsigmoid", A(), "", -5, 5);
  act("hardswish", A(), "", -5, 5);
  act("relu6", A(), "", -2, 8);
  act("leaky_relu", A(), "", -2, 2);
  act("leaky_relu", A({{"negative_slope", 0.2}}), "slope0_2", -2, 2);
  // f32 gelu on oneDNN over several fixed-length chunks and a tail.
  r.push_back(Row("gelu", A(), {{5, 67, 67}}, "chunks"));
  r.back().batch = 3;
  r.back().grad_check = false;
  r.back().why_no_grad_check = "67335 values; the [3, 4, 5] rows check the gradient";
  // ---- spatial: adaptive pooling, upsampling, transposed convolution, stochastic depth
  using Floats = std::vector<double>;
  const ParamValue bilinear = std::string("bilinear");
  r.push_back(Row("adaptive_avgpool2d", A({{"out", Ints{3, 2}}}), {{3, 7, 5}}, "overlap"));
  r.push_back(Row("adaptive_avgpool2d", A({{"out", I{2}}}), {{2, 6, 4}}, "divides"));
  r.push_back(Row("adaptive_avgpool2d", A({{"out", Ints{5, 7}}}), {{2, 3, 5}}, "grows"));
  r.push_back(Row("adaptive_avgpool1d", A({{"out", I{4}}}), {{3, 10}}));
  r.push_back(Row("upsample", A({{"scale", 2.0}}), {{2, 3, 4}}, "nearest2"));
  r.push_back(Row("upsample", A({{"scale", 1.5}}), {{2, 4, 6}}, "nearest1_5"));
  r.push_back(Row("upsample", A({{"size", Ints{7, 3}}}), {{2, 5, 4}}, "nearest_size"));
  r.push_back(Row("upsample", A({{"scale", Floats{2.5, 1.5}}, {"mode", bilinear}}), {{2, 5, 3}},
                  "bilinear"));
  r.push_back(Row("upsample", A({{"scale", 2.0}, {"mode", bilinear}, {"align_corners", true}}),
                  {{2, 4, 5}}, "bilinear_align"));
  r.push_back(Row("upsample", A({{"size", Ints{4, 11}}, {"mode", bilinear}}), {{2, 6, 7}},
                  "bilinear_size"));
  r.push_back(Row("conv_transpose2d",
                  A({{"out", I{6}},
                     {"kernel", I{3}},
                     {"stride", I{2}},
                     {"pad", I{1}},
                     {"output_pad", I{1}},
                     {"groups", I{2}}}),
                  {{4, 3, 4}}, "s2_outpad_groups2"));
  r.push_back(Row("conv_transpose2d",
                  A({{"out", I{3}}, {"kernel", Ints{2, 3}}, {"dilation", I{2}}, {"bias", false}}),
                  {{2, 4, 3}}, "dilated_nobias"));
  r.push_back(Row("conv_transpose2d",
                  A({{"out", I{4}}, {"kernel", I{4}}, {"stride", I{2}}, {"pad", I{1}}}),
                  {{3, 4, 4}}, "k4s2p1"));
  r.push_back(Row("drop_path", A({{"p", 0.5}}), {{3, 4}}));
  r.back().batch = 8;  // some samples kept, some dropped
  r.push_back(Eval(Row("drop_path", A({{"p", 0.5}}), {{3, 4}})));
  return r;
}

}  // namespace

ForwardContext LayerCase::Context() const {
  ForwardContext ctx;
  ctx.training = training;
  ctx.seed = 11;
  ctx.step = 3;
  return ctx;
}

std::string LayerCase::Label() const {
  std::string s = variant.empty() ? type : StrCat(type, "(", variant, ")");
  for (const Shape& in : inputs) s += " " + in.ToString();
  return s;
}

std::string LayerCase::TestName(size_t index) const {
  std::string s = type + (variant.empty() ? "" : "_" + variant) + "_" + std::to_string(index);
  for (char& ch : s)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return s;
}

const std::vector<LayerCase>& LayerCases() {
  static const std::vector<LayerCase> cases = MakeCases();
  return cases;
}

LayerRun::LayerRun(const LayerCase& c, DType dtype, Device device, const LayerRun* like)
    : case_(c), dtype_(dtype), device_(device) {
  const LayerType* t = LayerRegistry::Get().Find(c.type);
  if (t == nullptr) throw Error(StrCat("layer table: no layer type '", c.type, "'"));
  Args args = c.args;
  args.FillDefaults(t->schema);
  const LayerType* impl = device.is_cuda() ? LayerRegistry::Get().Find(c.type, kCudaVariant) : t;
  if (impl == nullptr) throw Error(StrCat("layer table: '", c.type, "' has no CUDA class"));
  layer_ = impl->create(c.type + "0", args);
  out_shape_ = layer_->Build(c.inputs, dtype).WithBatch(c.batch);
  Rng rng(5);
  layer_->ResetParameters(rng);
  for (size_t k = 0; k < c.inputs.size(); ++k) {
    Tensor x = like != nullptr
                   ? like->inputs_[k].Cast(dtype)
                   : RandomTensor(c.inputs[k].WithBatch(c.batch), 100 + k, c.lo, c.hi, dtype);
    inputs_.push_back(std::move(x));
  }
  if (like != nullptr) {
    auto& mine = layer_->parameters();
    auto& theirs = like->layer_->parameters();
    for (size_t k = 0; k < mine.size(); ++k) mine[k].value = theirs[k].value.Cast(dtype);
    auto& mb = layer_->buffers();
    auto& tb = like->layer_->buffers();
    for (size_t k = 0; k < mb.size(); ++k) mb[k].value = tb[k].value.Cast(dtype);
  }
  if (device.is_cuda()) {
    layer_->MoveTo(device);
    for (auto& x : inputs_) x = x.To(device);
  }
}

void LayerRun::ForwardBackward() {
  std::vector<const Tensor*> in;
  for (const auto& t : inputs_) in.push_back(&t);
  y_ = Tensor::Empty(out_shape_, dtype_, device_);
  layer_->Forward(in, y_, case_.Context());
  const Tensor dy = RandomTensor(out_shape_, 991, -1, 1, dtype_).To(device_);
  dx_.clear();
  std::vector<Tensor*> dxp;
  for (const auto& t : inputs_) dx_.push_back(Tensor::Zeros(t.shape(), dtype_, device_));
  for (auto& t : dx_) dxp.push_back(&t);
  for (auto& p : layer_->parameters()) p.grad.Zero();
  layer_->Backward(in, y_, dy, dxp);
}

}  // namespace cnnflow::testing
