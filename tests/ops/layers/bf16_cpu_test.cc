// bf16 on the CPU (graph.precision: bf16 on cpu:K): the rounding, the check
// for native bf16, and, where the CPU has it, conv2d, conv1d and linear
// against an f64 reference over the bf16-rounded operands, and a small
// network's training against its f32 twin. On a CPU without avx512_bf16 or
// AMX the kernel tests skip with a message (nothing is emulated).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "ops/cpu/bf16_layout.h"
#include "ops/cpu/conv/onednn_conv.h"
#include "ops/cpu/conv/pick_cache.h"
#include "ops/cpu/elementwise.h"
#include "ops/cpu/gemm.h"
#include "ops/cpu/onednn.h"
#include "ops/layers/conv2d.h"
#include "ops/loss.h"
#include "ops/model.h"
#include "tests/ops/reference_check.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::MakeLayerPair;
using testing::RandomTensor;
using testing::RelError;
using testing::RunForward;
using testing::Spec;
using testing::Values;

float FromBf16Bits(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The bf16 value nearest to f, ties to the even mantissa, found by
// comparing the two bf16 neighbours in double (independent of the bit trick).
float NearestBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const float lo = FromBf16Bits(static_cast<uint16_t>(u >> 16));  // towards zero
  const float hi = FromBf16Bits(static_cast<uint16_t>((u >> 16) + 1));
  const double dlo = std::abs(static_cast<double>(f) - lo);
  const double dhi = std::abs(static_cast<double>(f) - hi);
  if (dlo != dhi) return dlo < dhi ? lo : hi;
  return ((u >> 16) & 1) == 0 ? lo : hi;
}

double RoundedValue(double v) { return FromBf16Bits(cpu::Bf16Bits(static_cast<float>(v))); }

// A copy of t (f64) with every value rounded through f32 to bf16, as the
// kernels round what they multiply.
Tensor RoundedCopy(const Tensor& t) {
  Tensor r = Tensor::Empty(t.shape(), DType::kF64);
  for (int64_t i = 0; i < t.numel(); ++i) r.Set(i, RoundedValue(t.At(i)));
  return r;
}

TEST(Bf16Cpu, RoundsToNearestEven) {
  Rng rng(5);
  for (int i = 0; i < 200000; ++i) {
    const float f = static_cast<float>(rng.Uniform(-4, 4) * std::pow(10.0, rng.Uniform(-30, 30)));
    ASSERT_EQ(FromBf16Bits(cpu::Bf16Bits(f)), NearestBf16(f)) << f;
  }
  // Exact ties: 1 + 2^-8 lies halfway between 1 and 1 + 2^-7 and goes to the
  // even 1; 1 + 3 * 2^-8 goes up to the even 1 + 2^-6.
  EXPECT_EQ(FromBf16Bits(cpu::Bf16Bits(1.0f + 0x1p-8f)), 1.0f);
  EXPECT_EQ(FromBf16Bits(cpu::Bf16Bits(1.0f + 3 * 0x1p-8f)), 1.0f + 0x1p-6f);
  EXPECT_EQ(FromBf16Bits(cpu::Bf16Bits(-2.5f)), -2.5f);
  EXPECT_TRUE(std::isinf(FromBf16Bits(cpu::Bf16Bits(std::numeric_limits<float>::infinity()))));
  EXPECT_TRUE(std::isnan(FromBf16Bits(cpu::Bf16Bits(std::numeric_limits<float>::quiet_NaN()))));
  // The largest finite floats round up to infinity, as IEEE's rounding does.
  EXPECT_TRUE(std::isinf(FromBf16Bits(cpu::Bf16Bits(std::numeric_limits<float>::max()))));
}

// What /proc/cpuinfo says of native bf16, independently of CPUID.
bool CpuinfoHasBf16() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    std::string w;
    while (words >> w)
      if (w == "avx512_bf16" || w == "amx_bf16") return true;
    return false;
  }
  return false;
}

bool NativeBf16() { return cpu::NoNativeBf16Reason().empty(); }

#define SKIP_WITHOUT_NATIVE_BF16()                                                 \
  if (!NativeBf16())                                                               \
  GTEST_SKIP() << "no native bf16 on this CPU, so bf16 is refused, not emulated: " \
               << cpu::NoNativeBf16Reason()

TEST(Bf16Cpu, NativeSupportMatchesCpuinfo) {
  const std::string why = cpu::NoNativeBf16Reason();
  if (!CpuinfoHasBf16()) {
    testing::ExpectContains(why, {"avx512_bf16", "AMX-BF16", "emulated", "fp32"});
  } else if (std::getenv("ONEDNN_MAX_CPU_ISA") == nullptr) {
    EXPECT_EQ(why, "");
  }
}

std::vector<LayerSpec> SmallNet() {
  return {
      Spec("conv1", "conv2d", {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("bn1", "batchnorm", {}),
      Spec("relu1", "relu", {}),
      Spec("pool1", "maxpool2d", {{"kernel", int64_t{2}}}),
      Spec("conv2", "conv2d", {{"out", int64_t{16}}, {"kernel", int64_t{3}}}),
      Spec("relu2", "relu", {}),
      Spec("fc", "linear", {{"out", int64_t{5}}})};
}

TEST(Bf16Cpu, ModelRefusesOrUsesIt) {
  if (!NativeBf16()) {
    const std::string e = testing::ErrorOf<ConfigError>([] {
      Model::Build(SmallNet(), {3, 12, 12}, {.seed = 1, .compute = DType::kBF16});
    });
    testing::ExpectContains(e, {"bf16 on cpu", "avx512_bf16", "emulated"});
    return;
  }
  auto m = Model::Build(SmallNet(), {3, 12, 12}, {.seed = 1, .compute = DType::kBF16});
  EXPECT_EQ(m->bf16_layers(), 3);              // conv1, conv2, fc
  EXPECT_EQ(m->compute_dtype(), DType::kF32);  // the activations stay f32
  // fp16 stays GPU-only.
  EXPECT_THROW(Model::Build(SmallNet(), {3, 12, 12}, {.seed = 1, .compute = DType::kF16}),
               ConfigError);
}

// One layer in bf16 against the f64 layer over the bf16-rounded operands:
// y from rounded x and w (the bias added in f32), dx from rounded dy and w,
// dw from rounded x and dy. The products of bf16 values are exact in f32,
// so only f32 accumulation separates them (tol); and the result must be
// further from the unrounded f64 result than that, or bf16 was not used.
// The bias gradient sums dy: oneDNN's convolutions sum the rounded dy they
// multiply with (bias_from_rounded_dy), linear sums the f32 dy.
void CheckBf16Layer(const std::string& type, const Args& args, const Shape& batch_shape,
                    bool bias_from_rounded_dy, double tol = 2e-5) {
  auto p = MakeLayerPair(type, args, {batch_shape});
  ASSERT_TRUE(p.f32->ComputeInBf16()) << type;
  const Tensor x_r = RoundedCopy(p.x64[0]);
  auto rounded = MakeLayerPair(type, args, {batch_shape});  // its f64 layer: the reference
  auto& ref = *rounded.f64;
  for (size_t i = 0; i < ref.parameters().size(); ++i) {
    const Tensor& v = p.f64->parameters()[i].value;
    ref.parameters()[i].value =
        ref.parameters()[i].name == "bias" ? v.Cast(DType::kF32).Cast(DType::kF64) : RoundedCopy(v);
  }
  const Tensor y = RunForward(*p.f32, p.x32, p.out, {});
  const Tensor y_ref = RunForward(ref, {x_r}, p.out, {});
  const Tensor y_exact = RunForward(*p.f64, p.x64, p.out, {});
  EXPECT_LE(RelError(y, Values(y_ref)), tol) << type << " forward";
  EXPECT_GT(RelError(y, Values(y_exact)), 10 * tol) << type << " forward: bf16 not used?";

  const Tensor dy = RandomTensor(p.out, 55);
  const Tensor dy32 = dy.Cast(DType::kF32), dy_r = RoundedCopy(dy);
  Tensor dx = Tensor::Zeros(batch_shape, DType::kF32);
  Tensor dx_ref = Tensor::Zeros(batch_shape, DType::kF64);
  p.f32->Backward({&p.x32[0]}, y, dy32, {&dx});
  ref.Backward({&x_r}, y_ref, dy_r, {&dx_ref});
  EXPECT_LE(RelError(dx, Values(dx_ref)), tol) << type << " dx";
  for (size_t i = 0; i < ref.parameters().size(); ++i) {
    const Parameter& want = ref.parameters()[i];
    if (want.name == "bias" && !bias_from_rounded_dy) {
      // db[o] = the sum of dy's column o, in f64 from the f32 dy.
      const int64_t out = want.value.numel();
      std::vector<double> db(out, 0.0);
      for (int64_t r = 0; r < dy32.numel() / out; ++r)
        for (int64_t o = 0; o < out; ++o) db[o] += dy32.At(r * out + o);
      EXPECT_LE(RelError(p.f32->parameters()[i].grad, db), tol) << type << " dbias";
      continue;
    }
    EXPECT_LE(RelError(p.f32->parameters()[i].grad, Values(want.grad)), tol)
        << type << " d" << want.name;
  }
}

Args ConvArgs(int64_t out, int64_t kernel, int64_t stride, int64_t pad, int64_t groups, bool bias) {
  Args a;
  a.Set("out", out);
  a.Set("kernel", kernel);
  a.Set("stride", stride);
  a.Set("pad", pad);
  a.Set("groups", groups);
  a.Set("bias", bias);
  return a;
}

TEST(Bf16Cpu, Conv2dMatchesRoundedReference) {
  SKIP_WITHOUT_NATIVE_BF16();
  CheckBf16Layer("conv2d", ConvArgs(16, 3, 1, 1, 1, true), Shape({4, 8, 10, 10}), true);
  CheckBf16Layer("conv2d", ConvArgs(32, 3, 2, 1, 1, false), Shape({3, 16, 9, 9}), true);
  CheckBf16Layer("conv2d", ConvArgs(16, 1, 1, 0, 1, false), Shape({5, 32, 6, 6}), true);
  CheckBf16Layer("conv2d", ConvArgs(16, 3, 1, 1, 4, true), Shape({2, 16, 7, 7}), true);  // grouped
  CheckBf16Layer("conv2d", ConvArgs(16, 3, 1, 1, 16, false), Shape({2, 16, 8, 8}),
                 true);  // depthwise
}

// Pins a bf16 conv2d's picks ("forward,backward_data,backward_weights",
// then ",f32" for the f32 kernels) at batch n in a fresh pick file, so a
// test runs the passes it names whatever this machine would measure. Each
// caller's geometry must be its own: a process remembers the first pick of
// a key.
class PinnedPicks {
 public:
  PinnedPicks() : dir_(::testing::TempDir() + "/picks." + std::to_string(::getpid())) {
    std::filesystem::create_directories(dir_);
    old_ = std::getenv("CNNFLOW_CACHE_DIR") != nullptr ? std::getenv("CNNFLOW_CACHE_DIR") : "";
    had_old_ = std::getenv("CNNFLOW_CACHE_DIR") != nullptr;
    ::setenv("CNNFLOW_CACHE_DIR", dir_.c_str(), 1);
  }
  ~PinnedPicks() {
    if (had_old_) {
      ::setenv("CNNFLOW_CACHE_DIR", old_.c_str(), 1);
    } else {
      ::unsetenv("CNNFLOW_CACHE_DIR");
    }
    std::filesystem::remove_all(dir_);
  }
  void Pin(const Args& conv_args, const Shape& batch_shape, const std::string& picks) {
    Args args = conv_args;
    args.FillDefaults(LayerRegistry::Get().Find("conv2d")->schema);
    Conv2d conv("pinned", args);
    conv.Build({batch_shape.WithoutBatch()}, DType::kF32);
    std::ofstream(cpu::KernelPickFile(), std::ios::app)
        << cpu::MachineId() << "\t" << conv.KernelPickKey(batch_shape[0]) << " bf16\t" << picks
        << "\n";
  }

 private:
  std::string dir_, old_;
  bool had_old_ = false;
};

// Every combination of the bf16 passes through the layer, on the bf16
// kernels and on the f32 ones ("f32", which flip only channels-last
// tensors: F32KernelsMatchBf16Kernels): the backward reads x as the forward
// kept it in bf16 where the backward-weights is oneDNN's primitive, and
// converts dy once where the flipped backward-data reads it too. Batch 10
// of 10x10 planes runs the forward in chunks of 1 and the backward in
// chunks of 5, so the kept x crosses chunkings.
TEST(Bf16Cpu, Conv2dPassCombinationsMatchRoundedReference) {
  SKIP_WITHOUT_NATIVE_BF16();
  PinnedPicks pinned;
  int64_t out = 10;  // a geometry per combination (see PinnedPicks)
  for (const char* picks :
       {"onednn,flipped,onednn", "onednn,onednn,onednn", "onednn,flipped,matmul",
        "onednn,onednn,matmul", "onednn,onednn,onednn,f32"}) {
    if (std::string(picks).find("matmul") != std::string::npos && !cpu::CpuHasAvx512Bf16())
      continue;
    SCOPED_TRACE(picks);
    const Args args = ConvArgs(++out, 3, 1, 1, 1, true);
    const Shape shape({10, 6, 10, 10});
    pinned.Pin(args, shape, picks);
    CheckBf16Layer("conv2d", args, shape, true);
  }
}

// Unpinned, a bf16 convolution times its passes on both kernels and
// records both; a pick file that asks for the matmul (a bf16 kernel) on the
// f32 kernels is refused, naming the line.
TEST(Bf16Cpu, Conv2dWeighsBothKernels) {
  SKIP_WITHOUT_NATIVE_BF16();
  PinnedPicks pinned;
  const Shape shape({8, 16, 8, 8});
  auto measured = MakeLayerPair("conv2d", ConvArgs(16, 3, 1, 1, 1, false), {shape});
  ASSERT_TRUE(measured.f32->ComputeInBf16());
  auto& conv = dynamic_cast<Conv2d&>(*measured.f32);
  const Conv2dPlan plan = conv.PlanFor(shape[0], DType::kF32);
  std::ifstream file(cpu::KernelPickFile());
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const size_t line = text.find(StrCat(conv.KernelPickKey(shape[0]), " bf16\t"));
  ASSERT_NE(line, std::string::npos) << text;
  const std::string entry = text.substr(line, text.find('\n', line) - line);
  EXPECT_NE(entry.find("bf16 kernels: forward "), std::string::npos) << entry;
  EXPECT_NE(entry.find("; f32 kernels on bf16 operands: forward "), std::string::npos) << entry;
  EXPECT_EQ(plan.f32_kernels, entry.find(",f32 (") != std::string::npos) << entry;

  const Args args = ConvArgs(17, 3, 1, 1, 1, false);
  pinned.Pin(args, shape, "onednn,onednn,matmul,f32");
  auto bad = MakeLayerPair("conv2d", args, {shape});
  ASSERT_TRUE(bad.f32->ComputeInBf16());
  try {
    dynamic_cast<Conv2d&>(*bad.f32).PlanFor(shape[0], DType::kF32);
    ADD_FAILURE() << "a matmul on the f32 kernels was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bad kernel pick 'onednn,onednn,matmul,f32'"),
              std::string::npos)
        << e.what();
  }
}

// Micro-batches in flight (a pipeline's forwards before their backwards):
// each backward reads its own kept x, so the gradients are bitwise those of
// forward and backward one micro-batch at a time.
TEST(Bf16Cpu, Conv2dKeepsAnInputPerMicroBatchInFlight) {
  SKIP_WITHOUT_NATIVE_BF16();
  PinnedPicks pinned;
  const Args args = ConvArgs(9, 3, 1, 1, 1, false);
  const Shape shape({8, 5, 12, 12});
  pinned.Pin(args, shape, "onednn,flipped,onednn");
  auto p = MakeLayerPair("conv2d", args, {shape});
  Layer& conv = *p.f32;
  ASSERT_TRUE(conv.ComputeInBf16());
  const Tensor x1 = RandomTensor(shape, 21).Cast(DType::kF32);
  const Tensor x2 = RandomTensor(shape, 22).Cast(DType::kF32);
  const Tensor dy1 = RandomTensor(p.out, 23).Cast(DType::kF32);
  const Tensor dy2 = RandomTensor(p.out, 24).Cast(DType::kF32);
  Tensor y1 = Tensor::Empty(p.out), y2 = Tensor::Empty(p.out);
  Tensor& dw = conv.parameters()[0].grad;
  auto backward = [&](const Tensor& x, const Tensor& y, const Tensor& dy, Tensor* dw_out) {
    dw.Zero();
    Tensor dx = Tensor::Zeros(shape);
    conv.Backward({&x}, y, dy, {&dx});
    *dw_out = dw.Clone();
    return dx;
  };
  Tensor dw1, dw2, dw1_flight, dw2_flight;
  conv.Forward({&x1}, y1, {});
  const Tensor dx1 = backward(x1, y1, dy1, &dw1);
  conv.Forward({&x2}, y2, {});
  const Tensor dx2 = backward(x2, y2, dy2, &dw2);
  conv.Forward({&x1}, y1, {});
  conv.Forward({&x2}, y2, {});
  const Tensor dx1_flight = backward(x1, y1, dy1, &dw1_flight);
  const Tensor dx2_flight = backward(x2, y2, dy2, &dw2_flight);
  EXPECT_EQ(MaxAbsDiff(dw1, dw1_flight), 0.0);
  EXPECT_EQ(MaxAbsDiff(dw2, dw2_flight), 0.0);
  EXPECT_EQ(MaxAbsDiff(dx1, dx1_flight), 0.0);
  EXPECT_EQ(MaxAbsDiff(dx2, dx2_flight), 0.0);
  EXPECT_GT(MaxAbsDiff(dw1, dw2), 0.0);
}

// Our own conversions for the bf16 convolutions' operands, element by
// element against NearestBf16, over channel and plane counts with and
// without 16-wide tails.
TEST(Bf16Cpu, LayoutConversionsMatchScalarReference) {
  SKIP_WITHOUT_NATIVE_BF16();
  if (!cpu::CpuHasAvx512Bf16()) GTEST_SKIP() << "our own bf16 conversions need avx512_bf16";
  for (const auto& [c, p] :
       {std::pair<int64_t, int64_t>{24, 49}, {16, 16}, {64, 9}, {3, 961}, {256, 1}, {17, 33}}) {
    SCOPED_TRACE(::testing::Message() << "c " << c << " p " << p);
    const int64_t n = 2, size = n * c * p;
    const Tensor x = RandomTensor(Shape({size}), 9).Cast(DType::kF32);
    const float* xs = x.data<float>();
    std::vector<uint16_t> bf(size), nhwc(size);
    cpu::ToBf16(xs, bf.data(), size);
    cpu::NchwToNhwcBf16(xs, nhwc.data(), n, c, p);
    std::vector<float> back(size), widened(size), rounded(size);
    cpu::NhwcToNchw(xs, back.data(), n, c, p);  // xs read as [n, p, c]
    cpu::FromBf16(bf.data(), widened.data(), size);
    cpu::RoundToBf16(xs, rounded.data(), size);
    int64_t wrong = 0;
    for (int64_t s = 0; s < n; ++s)
      for (int64_t ci = 0; ci < c; ++ci)
        for (int64_t pi = 0; pi < p; ++pi) {
          const int64_t nchw = (s * c + ci) * p + pi, nhwc_at = (s * p + pi) * c + ci;
          wrong += FromBf16Bits(bf[nchw]) != NearestBf16(xs[nchw]);
          wrong += FromBf16Bits(nhwc[nhwc_at]) != NearestBf16(xs[nchw]);
          wrong += back[nchw] != xs[nhwc_at];
          wrong += widened[nchw] != FromBf16Bits(bf[nchw]);
          wrong += rounded[nchw] != NearestBf16(xs[nchw]);
        }
    EXPECT_EQ(wrong, 0);
  }
}

// OnednnConv's bf16 alternatives to its convolution primitive's backward
// passes, picked per shape where faster (so the layer tests may not reach
// them), against f64 over the rounded operands and against the primitive.
struct ConvCase {
  int64_t mb, c, h, w, k, kh, kw, stride, pad_h, pad_w, dilation;
  bool bias;
};

Conv2dGeometry GeometryOf(const ConvCase& t) {
  Conv2dGeometry g;
  g.in_channels = t.c;
  g.in_h = t.h;
  g.in_w = t.w;
  g.out_channels = t.k;
  g.kernel_h = t.kh;
  g.kernel_w = t.kw;
  g.stride_h = g.stride_w = t.stride;
  g.pad_h = t.pad_h;
  g.pad_w = t.pad_w;
  g.dilation_h = g.dilation_w = t.dilation;
  g.out_h = ConvOutputSize(t.h, t.kh, t.stride, t.pad_h, t.dilation);
  g.out_w = ConvOutputSize(t.w, t.kw, t.stride, t.pad_w, t.dilation);
  return g;
}

// Calls fn(s, k, c, xi, yi, wi) for every product x[xi] * dy[yi] (or w[wi])
// of the convolution: the f64 references below.
template <typename Fn>
void ForEachProduct(const ConvCase& t, const Conv2dGeometry& g, Fn&& fn) {
  for (int64_t s = 0; s < t.mb; ++s)
    for (int64_t k = 0; k < t.k; ++k)
      for (int64_t oh = 0; oh < g.out_h; ++oh)
        for (int64_t ow = 0; ow < g.out_w; ++ow)
          for (int64_t c = 0; c < t.c; ++c)
            for (int64_t i = 0; i < t.kh; ++i)
              for (int64_t j = 0; j < t.kw; ++j) {
                const int64_t ih = oh * t.stride - t.pad_h + i * t.dilation;
                const int64_t iw = ow * t.stride - t.pad_w + j * t.dilation;
                if (ih < 0 || ih >= t.h || iw < 0 || iw >= t.w) continue;
                fn(((s * t.c + c) * t.h + ih) * t.w + iw,
                   ((s * t.k + k) * g.out_h + oh) * g.out_w + ow,
                   ((k * t.c + c) * t.kh + i) * t.kw + j);
              }
}

double RoundedAt(const Tensor& v, int64_t i) { return NearestBf16(v.data<float>()[i]); }

// Stride 1 and W' == W (dilated too) take im2col's shifted-plane path;
// strided and shrinking ones its general path.
const ConvCase kConvCases[] = {{3, 8, 10, 10, 16, 3, 3, 1, 1, 1, 1, true},
                               {2, 16, 9, 9, 32, 3, 3, 2, 1, 1, 1, false},
                               {2, 8, 9, 7, 16, 3, 3, 1, 2, 2, 2, true},
                               {4, 8, 7, 7, 8, 2, 2, 1, 0, 0, 1, true},
                               {2, 4, 5, 12, 8, 1, 7, 1, 0, 3, 1, false}};

TEST(Bf16Cpu, MatmulBackwardWeightsMatchesRoundedReference) {
  SKIP_WITHOUT_NATIVE_BF16();
  if (!cpu::CpuHasAvx512Bf16()) GTEST_SKIP() << "the matmul path needs avx512_bf16";
  for (const ConvCase& t : kConvCases) {
    SCOPED_TRACE(::testing::Message() << "case c " << t.c << " " << t.h << "x" << t.w << " kernel "
                                      << t.kh << "x" << t.kw << " stride " << t.stride);
    const Conv2dGeometry g = GeometryOf(t);
    cpu::OnednnConv conv(g, t.mb, {.bias = t.bias, .bf16 = true});
    ASSERT_TRUE(conv.HasMatmulWeights());
    const Tensor x = RandomTensor(Shape({t.mb, t.c, t.h, t.w}), 7).Cast(DType::kF32);
    const Tensor dy = RandomTensor(Shape({t.mb, t.k, g.out_h, g.out_w}), 8).Cast(DType::kF32);
    const int64_t dw_size = t.k * g.col_rows(), size = dw_size + (t.bias ? t.k : 0);
    Tensor got = Tensor::Zeros({size}), primitive = Tensor::Zeros({size});
    conv.BackwardWeightsByMatmul(x.data<float>(), dy.data<float>(), got.data<float>(),
                                 t.bias ? got.data<float>() + dw_size : nullptr);
    conv.BackwardWeights(x.data<float>(), dy.data<float>(), primitive.data<float>(),
                         t.bias ? primitive.data<float>() + dw_size : nullptr);
    std::vector<double> want(size, 0.0), exact(size, 0.0);
    ForEachProduct(t, g, [&](int64_t xi, int64_t yi, int64_t wi) {
      want[wi] += RoundedAt(dy, yi) * RoundedAt(x, xi);
      exact[wi] += static_cast<double>(dy.data<float>()[yi]) * x.data<float>()[xi];
    });
    if (t.bias) {  // db[k]: the sum of the rounded dy
      for (int64_t yi = 0; yi < dy.numel(); ++yi) {
        want[dw_size + yi / g.out_plane() % t.k] += RoundedAt(dy, yi);
        exact[dw_size + yi / g.out_plane() % t.k] += dy.data<float>()[yi];
      }
    }
    EXPECT_LE(RelError(got, want), 2e-5);
    EXPECT_GT(RelError(got, exact), 2e-4) << "bf16 not used?";
    EXPECT_LE(RelError(got, Values(primitive)), 4e-5) << "against oneDNN's convolution";
  }
}

TEST(Bf16Cpu, FlippedBackwardDataMatchesRoundedReference) {
  SKIP_WITHOUT_NATIVE_BF16();
  for (const ConvCase& t : kConvCases) {
    SCOPED_TRACE(::testing::Message() << "case c " << t.c << " " << t.h << "x" << t.w << " kernel "
                                      << t.kh << "x" << t.kw << " stride " << t.stride);
    const Conv2dGeometry g = GeometryOf(t);
    cpu::OnednnConv conv(g, t.mb, {.bias = t.bias, .bf16 = true});
    ASSERT_EQ(conv.HasFlippedData(), t.stride == 1);
    if (t.stride != 1) continue;
    const Tensor w = RandomTensor(Shape({t.k, t.c, t.kh, t.kw}), 6).Cast(DType::kF32);
    const Tensor dy = RandomTensor(Shape({t.mb, t.k, g.out_h, g.out_w}), 8).Cast(DType::kF32);
    Tensor got = Tensor::Zeros({t.mb, t.c, t.h, t.w}), primitive = Tensor::Zeros(got.shape());
    conv.PrepareFlippedWeights(w.data<float>());
    conv.BackwardDataByFlippedForward(dy.data<float>(), got.data<float>());
    conv.PrepareBackwardWeights(w.data<float>());
    conv.BackwardData(dy.data<float>(), primitive.data<float>());
    std::vector<double> want(got.numel(), 0.0), exact(got.numel(), 0.0);
    ForEachProduct(t, g, [&](int64_t xi, int64_t yi, int64_t wi) {
      want[xi] += RoundedAt(dy, yi) * RoundedAt(w, wi);
      exact[xi] += static_cast<double>(dy.data<float>()[yi]) * w.data<float>()[wi];
    });
    EXPECT_LE(RelError(got, want), 2e-5);
    EXPECT_GT(RelError(got, exact), 2e-4) << "bf16 not used?";
    EXPECT_LE(RelError(got, Values(primitive)), 4e-5) << "against oneDNN's backward-data";
  }
}

std::string LayoutCaseName(const ConvCase& t, bool nhwc_in, bool nhwc_out) {
  return StrCat("case c ", t.c, " ", t.h, "x", t.w, " kernel ", t.kh, "x", t.kw, " stride ",
                t.stride, " nhwc in ", nhwc_in, " out ", nhwc_out);
}

// A case's random operands, NCHW (x, dy) and as the layouts under test
// give them (xl, dyl: channels-last where in, out).
struct ConvOperands {
  ConvOperands(const ConvCase& t, const Conv2dGeometry& g, bool in, bool out)
      : xs{t.mb, t.c, t.h, t.w},
        ys{t.mb, t.k, g.out_h, g.out_w},
        x(RandomTensor(xs, 7).Cast(DType::kF32)),
        dy(RandomTensor(ys, 8).Cast(DType::kF32)),
        w(RandomTensor(Shape({t.k, t.c, t.kh, t.kw}), 6).Cast(DType::kF32)),
        b(RandomTensor(Shape({t.k}), 5).Cast(DType::kF32)),
        xl(in ? testing::ToChannelsLast(x) : x),
        dyl(out ? testing::ToChannelsLast(dy) : dy),
        bias(t.bias ? b.data<float>() : nullptr),
        in(in),
        out(out) {}
  // An x-shaped (y-shaped) result in the layout under test, as NCHW.
  Tensor NchwX(const Tensor& v) const { return in ? testing::FromChannelsLast(v) : v; }
  Tensor NchwY(const Tensor& v) const { return out ? testing::FromChannelsLast(v) : v; }
  Shape xs, ys;
  Tensor x, dy, w, b, xl, dyl;
  const float* bias;  // b, or null where the case has no bias
  bool in, out;
};

// Channels-last tensors (Layer::ChannelsLast): OnednnConv with x and dx
// (in), y and dy (out) NHWC, every pass and both alternatives of each
// backward pass, against the NCHW convolution on the same values.
TEST(Bf16Cpu, ChannelsLastConvPassesMatchNchw) {
  SKIP_WITHOUT_NATIVE_BF16();
  for (const ConvCase& t : kConvCases) {
    for (int layout = 1; layout < 4; ++layout) {
      const bool in = (layout & 1) != 0, out = (layout & 2) != 0;
      SCOPED_TRACE(LayoutCaseName(t, in, out));
      const Conv2dGeometry g = GeometryOf(t);
      cpu::OnednnConv ref(g, t.mb, {.bias = t.bias, .bf16 = true}),
          conv(g, t.mb, {.bias = t.bias, .bf16 = true, .nhwc_in = in, .nhwc_out = out});
      const ConvOperands ops(t, g, in, out);
      const Shape &xs = ops.xs, &ys = ops.ys;
      const Tensor &x = ops.x, &dy = ops.dy, &w = ops.w, &xl = ops.xl, &dyl = ops.dyl;
      const float* bias = ops.bias;

      Tensor y_ref = Tensor::Empty(ys), y = Tensor::Empty(ys);
      ref.PrepareForwardWeights(w.data<float>());
      conv.PrepareForwardWeights(w.data<float>());
      ref.Forward(x.data<float>(), bias, y_ref.data<float>());
      conv.Forward(xl.data<float>(), bias, y.data<float>());
      EXPECT_LE(RelError(ops.NchwY(y), Values(y_ref)), 4e-5) << "forward";

      Tensor dx_ref = Tensor::Empty(xs), dx = Tensor::Empty(xs);
      ref.PrepareBackwardWeights(w.data<float>());
      conv.PrepareBackwardWeights(w.data<float>());
      ref.BackwardData(dy.data<float>(), dx_ref.data<float>());
      conv.BackwardData(dyl.data<float>(), dx.data<float>());
      EXPECT_LE(RelError(ops.NchwX(dx), Values(dx_ref)), 4e-5) << "backward-data";
      if (conv.HasFlippedData()) {
        conv.PrepareFlippedWeights(w.data<float>());
        conv.BackwardDataByFlippedForward(dyl.data<float>(), dx.data<float>());
        EXPECT_LE(RelError(ops.NchwX(dx), Values(dx_ref)), 4e-5) << "flipped backward-data";
      }

      const int64_t dw_size = t.k * g.col_rows(), size = dw_size + (t.bias ? t.k : 0);
      Tensor dw_ref = Tensor::Zeros({size}), dw = Tensor::Zeros({size});
      auto db = [&](Tensor& d) { return t.bias ? d.data<float>() + dw_size : nullptr; };
      ref.BackwardWeights(x.data<float>(), dy.data<float>(), dw_ref.data<float>(), db(dw_ref));
      conv.BackwardWeights(xl.data<float>(), dyl.data<float>(), dw.data<float>(), db(dw));
      EXPECT_LE(RelError(dw, Values(dw_ref)), 4e-5) << "backward-weights";
      if (conv.HasMatmulWeights()) {
        conv.BackwardWeightsByMatmul(xl.data<float>(), dyl.data<float>(), dw.data<float>(), db(dw));
        EXPECT_LE(RelError(dw, Values(dw_ref)), 4e-5) << "matmul backward-weights";
        // Through Backward, with x as Forward kept it and dy converted once
        // for both passes where it can.
        if (conv.KeepsInput(ConvAlgo::kMatmul) && conv.HasFlippedData()) {
          std::vector<uint16_t> kept(x.numel());
          conv.Forward(xl.data<float>(), bias, y.data<float>(), kept.data());
          dw = Tensor::Zeros({size});
          conv.Backward(xl.data<float>(), kept.data(), dyl.data<float>(), dx.data<float>(),
                        ConvAlgo::kFlipped, dw.data<float>(), db(dw), ConvAlgo::kMatmul);
          EXPECT_LE(RelError(dw, Values(dw_ref)), 4e-5) << "Backward: matmul from the kept x";
          EXPECT_LE(RelError(ops.NchwX(dx), Values(dx_ref)), 4e-5) << "Backward: flipped";
        }
      }
    }
  }
}

// bf16 operands on oneDNN's f32 kernels (OnednnConv's f32_kernels): every
// pass, NCHW and channels-last, against the bf16 kernels on the same
// values. A product of two bf16 values is exact in f32, so only the order
// of the f32 sums separates them; the f32 convolution of the unrounded
// operands is 10x further off, so the f32 kernels did get rounded operands.
// Then through Backward, from x as Forward kept it, and dy given in f32 or
// in bf16.
TEST(Bf16Cpu, F32KernelsMatchBf16Kernels) {
  SKIP_WITHOUT_NATIVE_BF16();
  constexpr double kTol = 4e-5;
  for (const ConvCase& t : kConvCases) {
    for (int layout = 0; layout < 4; ++layout) {
      const bool in = (layout & 1) != 0, out = (layout & 2) != 0;
      SCOPED_TRACE(LayoutCaseName(t, in, out));
      const Conv2dGeometry g = GeometryOf(t);
      cpu::OnednnConv ref(g, t.mb, {.bias = t.bias, .bf16 = true}),
          exact(g, t.mb, {.bias = t.bias}),
          conv(g, t.mb,
               {.bias = t.bias, .bf16 = true, .nhwc_in = in, .nhwc_out = out, .f32_kernels = true});
      const ConvOperands ops(t, g, in, out);
      const Shape &xs = ops.xs, &ys = ops.ys;
      const Tensor &x = ops.x, &dy = ops.dy, &w = ops.w, &xl = ops.xl, &dyl = ops.dyl;
      const float* bias = ops.bias;
      for (cpu::OnednnConv* c : {&ref, &exact, &conv}) {
        c->PrepareForwardWeights(w.data<float>());
        c->PrepareBackwardWeights(w.data<float>());
      }

      Tensor y_ref = Tensor::Empty(ys), y_exact = Tensor::Empty(ys), y = Tensor::Empty(ys);
      ref.Forward(x.data<float>(), bias, y_ref.data<float>());
      exact.Forward(x.data<float>(), bias, y_exact.data<float>());
      conv.Forward(xl.data<float>(), bias, y.data<float>());
      EXPECT_LE(RelError(ops.NchwY(y), Values(y_ref)), kTol) << "forward";
      EXPECT_GT(RelError(y_exact, Values(y_ref)), 10 * kTol) << "the tolerance tells bf16 apart";

      Tensor dx_ref = Tensor::Empty(xs), dx = Tensor::Empty(xs);
      ref.BackwardData(dy.data<float>(), dx_ref.data<float>());
      conv.BackwardData(dyl.data<float>(), dx.data<float>());
      EXPECT_LE(RelError(ops.NchwX(dx), Values(dx_ref)), kTol) << "backward-data";
      if (conv.HasFlippedData()) {
        dx = Tensor::Empty(xs);
        conv.PrepareFlippedWeights(w.data<float>());
        conv.BackwardDataByFlippedForward(dyl.data<float>(), dx.data<float>());
        EXPECT_LE(RelError(ops.NchwX(dx), Values(dx_ref)), kTol) << "flipped backward-data";
      }
      EXPECT_FALSE(conv.HasMatmulWeights()) << "the matmul is a bf16 kernel";

      const int64_t dw_size = t.k * g.col_rows(), size = dw_size + (t.bias ? t.k : 0);
      Tensor dw_ref = Tensor::Zeros({size}), dw = Tensor::Zeros({size});
      auto db = [&](Tensor& d) { return t.bias ? d.data<float>() + dw_size : nullptr; };
      ref.BackwardWeights(x.data<float>(), dy.data<float>(), dw_ref.data<float>(), db(dw_ref));
      conv.BackwardWeights(xl.data<float>(), dyl.data<float>(), dw.data<float>(), db(dw));
      EXPECT_LE(RelError(dw, Values(dw_ref)), kTol) << "backward-weights";

      ASSERT_TRUE(conv.KeepsInput(ConvAlgo::kOnednn));
      std::vector<uint16_t> kept(x.numel());
      conv.Forward(xl.data<float>(), bias, y.data<float>(), kept.data());
      EXPECT_LE(RelError(ops.NchwY(y), Values(y_ref)), kTol) << "forward keeping x";
      dw = Tensor::Zeros({size});
      dx = Tensor::Empty(xs);
      conv.Backward(nullptr, kept.data(), dyl.data<float>(), dx.data<float>(),
                    conv.HasFlippedData() ? ConvAlgo::kFlipped : ConvAlgo::kOnednn,
                    dw.data<float>(), db(dw), ConvAlgo::kOnednn);
      EXPECT_LE(RelError(dw, Values(dw_ref)), kTol) << "Backward: from the kept x";
      EXPECT_LE(RelError(ops.NchwX(dx), Values(dx_ref)), kTol) << "Backward: backward-data";
      // dy given in bf16 NHWC (a bf16 gradient) instead.
      std::vector<uint16_t> dy16(dy.numel());
      cpu::NchwToNhwcBf16(dy.data<float>(), dy16.data(), t.mb, t.k, g.out_plane());
      dw = Tensor::Zeros({size});
      dx = Tensor::Empty(xs);
      conv.Backward(nullptr, kept.data(), nullptr, dx.data<float>(),
                    conv.HasFlippedData() ? ConvAlgo::kFlipped : ConvAlgo::kOnednn,
                    dw.data<float>(), db(dw), ConvAlgo::kOnednn, dy16.data());
      EXPECT_LE(RelError(dw, Values(dw_ref)), kTol) << "Backward: from a bf16 dy";
      EXPECT_LE(RelError(ops.NchwX(dx), Values(dx_ref)), kTol) << "Backward: from a bf16 dy";
    }
  }
}

// Model::Build keeps an activation channels-last where every layer that
// writes or reads it can, and a bf16 model so built trains as the NCHW
// one: the same logits and gradients up to the order of the sums.
std::vector<LayerSpec> ChannelsLastNet() {
  return {
      Spec("conv1", "conv2d", {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("pool1", "maxpool2d", {{"kernel", int64_t{2}}}),
      Spec("bn1", "batchnorm", {}),
      Spec("gelu1", "gelu", {}),
      Spec("conv2", "conv2d",
           {{"out", int64_t{16}}, {"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"bias", false}}),
      Spec("bn2", "batchnorm", {}),
      Spec("relu2", "relu", {}),
      Spec("scale", "mul", {{"scale", 0.5}}),
      Spec("conv3", "conv2d", {{"out", int64_t{16}}, {"kernel", int64_t{2}}}),
      Spec("relu3", "relu", {}),
      Spec("fc", "linear", {{"out", int64_t{5}}})};
}

TEST(Bf16Cpu, ModelChoosesChannelsLastWhereEveryLayerCan) {
  SKIP_WITHOUT_NATIVE_BF16();
  auto m = Model::Build(ChannelsLastNet(), {3, 12, 12}, {.seed = 1, .compute = DType::kBF16});
  // Per layer: its input's and its output's layout (1: NHWC). conv3's
  // output goes to fc through relu3, and fc reads NCHW.
  const std::vector<std::pair<int, int>> want = {{0, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 1}, {1, 1},
                                                 {1, 1}, {1, 1}, {1, 0}, {0, 0}, {0, 0}};
  ASSERT_EQ(m->num_layers(), static_cast<int>(want.size()));
  for (int i = 0; i < m->num_layers(); ++i) {
    EXPECT_EQ(m->layer(i).nhwc_input(), want[i].first != 0) << m->layer(i).name();
    EXPECT_EQ(m->layer(i).nhwc_output(), want[i].second != 0) << m->layer(i).name();
  }
  // A residual add of a conv's output and the model input (NCHW) keeps
  // both NCHW, whichever order it reads them in; conv2 may still write
  // channels-last for the add of two conv outputs.
  const std::vector<LayerSpec> residual = {
      Spec("conv1", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("sum1", "add", {}, {"conv1", "input"}),
      Spec("conv2", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("conv3", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{1}}}, {"sum1"}),
      Spec("sum2", "add", {}, {"conv2", "conv3"}),
      Spec("conv4", "conv2d", {{"out", int64_t{4}}, {"kernel", int64_t{3}}}),
      Spec("fc", "linear", {{"out", int64_t{5}}})};
  auto r = Model::Build(residual, {3, 12, 12}, {.seed = 1, .compute = DType::kBF16});
  EXPECT_FALSE(r->layer(0).nhwc_output());
  EXPECT_FALSE(r->layer(1).nhwc_input(0) || r->layer(1).nhwc_input(1) || r->layer(1).nhwc_output());
  EXPECT_TRUE(r->layer(2).nhwc_output() && r->layer(3).nhwc_output());
  EXPECT_TRUE(r->layer(4).nhwc_input(0) && r->layer(4).nhwc_input(1) && r->layer(4).nhwc_output());
  EXPECT_TRUE(r->layer(5).nhwc_input() && !r->layer(5).nhwc_output());

  auto off =
      Model::Build(ChannelsLastNet(), {3, 12, 12},
                   {.seed = 1, .compute = DType::kBF16, .memory_format = MemoryFormat::kNchw});
  for (int i = 0; i < off->num_layers(); ++i) {
    EXPECT_FALSE(off->layer(i).nhwc_input() || off->layer(i).nhwc_output());
  }
  auto f32 = Model::Build(ChannelsLastNet(), {3, 12, 12}, {.seed = 1});
  for (int i = 0; i < f32->num_layers(); ++i) {
    EXPECT_FALSE(f32->layer(i).nhwc_input() || f32->layer(i).nhwc_output()) << "f32 stays NCHW";
  }
}

TEST(Bf16Cpu, ChannelsLastModelMatchesNchw) {
  SKIP_WITHOUT_NATIVE_BF16();
  std::unique_ptr<Model> models[2];
  for (int k = 0; k < 2; ++k) {
    models[k] = Model::Build(ChannelsLastNet(), {3, 12, 12},
                             {.seed = 3,
                              .compute = DType::kBF16,
                              .memory_format = k == 1 ? MemoryFormat::kAuto : MemoryFormat::kNchw});
  }
  ASSERT_TRUE(models[1]->layer(0).nhwc_output());
  const int64_t n = 6;
  const Tensor x = RandomTensor({n, 3, 12, 12}, 4, -1, 1, DType::kF32);
  const Tensor dy = RandomTensor({n, 5}, 5, -1, 1, DType::kF32);
  Tensor logits[2];
  for (int k = 0; k < 2; ++k) {
    for (bool training : {false, true}) {
      ForwardContext ctx;
      ctx.training = training;
      logits[k] = models[k]->Forward(x, ctx).Clone();
      if (!training) {
        continue;
      }
      models[k]->ZeroGrad();
      models[k]->Backward(dy);
    }
  }
  EXPECT_LE(RelError(logits[1], Values(logits[0])), 1e-3);
  const auto named = models[0]->NamedParameters(), other = models[1]->NamedParameters();
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_LE(RelError(other[i].param->grad, Values(named[i].param->grad)), 2e-3) << named[i].name;
  }
}

// bf16 activations (Layer::WritesBf16 / ReadsBf16): a batchnorm's output
// that only convolutions read is stored in bf16, through a fused ReLU or
// GELU or none; one that an add or a max-pool reads stays f32. The
// gradient of a convolution's output that one max-pool reads is bf16 too
// (WritesBf16Grad / ReadsBf16Grad); one that a batchnorm reads stays f32.
std::vector<LayerSpec> Bf16ActivationsNet() {
  auto conv = [](const char* name, int64_t kernel, int64_t stride = 1) {
    return Spec(name, "conv2d",
                {{"out", int64_t{8}}, {"kernel", kernel}, {"pad", kernel / 2}, {"stride", stride}});
  };
  return {conv("conv1", 3),
          Spec("bn1", "batchnorm", {}),
          Spec("relu1", "relu", {}),
          conv("conv2", 3),
          Spec("bn2", "batchnorm", {}),
          Spec("gelu2", "gelu", {}),
          conv("conv3", 3),
          Spec("bn3", "batchnorm", {}),
          conv("conv4", 1),
          Spec("sum", "add", {}, {"conv4", "bn3"}),
          Spec("bn4", "batchnorm", {}),
          conv("conv5", 3, 2),
          Spec("pool", "maxpool2d", {{"kernel", int64_t{2}}}),
          Spec("bn5", "batchnorm", {}),
          conv("conv6", 1),
          Spec("fc", "linear", {{"out", int64_t{5}}})};
}

// The convolutions round their input and dy to bf16 either way, and
// batchnorm's channels-last backward never reads its output: the same bits
// with the bf16 activations and gradients as without, in training and evaluation, for the
// logits, every gradient and the running statistics.
TEST(Bf16Cpu, Bf16ActivationsGiveTheSameBits) {
  SKIP_WITHOUT_NATIVE_BF16();
  if (!cpu::CpuHasAvx512Bf16()) GTEST_SKIP() << "bf16 activations need avx512_bf16";
  std::unique_ptr<Model> models[2];
  for (int k = 0; k < 2; ++k) {
    models[k] = Model::Build(Bf16ActivationsNet(), {3, 12, 12},
                             {.seed = 3, .compute = DType::kBF16, .bf16_activations = k == 1});
  }
  const std::set<std::string> bf16 = {"bn1", "relu1", "bn2", "gelu2", "bn4", "bn5"};
  for (int i = 0; i < models[1]->num_layers(); ++i) {
    const std::string& name = models[1]->layer(i).name();
    EXPECT_EQ(models[1]->activation_dtype(i), bf16.count(name) ? DType::kBF16 : DType::kF32)
        << name;
    EXPECT_EQ(models[1]->gradient_dtype(i), name == "conv5" ? DType::kBF16 : DType::kF32) << name;
    EXPECT_EQ(models[0]->activation_dtype(i), DType::kF32) << name;
    EXPECT_EQ(models[0]->gradient_dtype(i), DType::kF32) << name;
  }
  const int64_t n = 6;
  const Tensor x = RandomTensor({n, 3, 12, 12}, 4, -1, 1, DType::kF32);
  const Tensor dy = RandomTensor({n, 5}, 5, -1, 1, DType::kF32);
  Tensor logits[2][2];
  for (int k = 0; k < 2; ++k) {
    for (int step = 0; step < 2; ++step) {
      ForwardContext ctx;
      ctx.training = step == 0;
      logits[k][step] = models[k]->Forward(x, ctx).Clone();
      if (!ctx.training) continue;
      models[k]->ZeroGrad();
      models[k]->Backward(dy);
    }
  }
  for (int step = 0; step < 2; ++step) EXPECT_EQ(MaxAbsDiff(logits[1][step], logits[0][step]), 0.0);
  const auto state = models[0]->StateTensors(), other = models[1]->StateTensors();
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(MaxAbsDiff(other[i].second, state[i].second), 0.0) << state[i].first;
  }
  const auto named = models[0]->NamedParameters(), named1 = models[1]->NamedParameters();
  for (size_t i = 0; i < named.size(); ++i) {
    EXPECT_GT(MaxAbsDiff(named[i].param->grad, Tensor::Zeros(named[i].param->grad.shape())), 0.0)
        << named[i].name;
    EXPECT_EQ(MaxAbsDiff(named1[i].param->grad, named[i].param->grad), 0.0) << named[i].name;
  }
}

TEST(Bf16Cpu, Conv1dMatchesRoundedReference) {
  SKIP_WITHOUT_NATIVE_BF16();
  CheckBf16Layer("conv1d", ConvArgs(16, 5, 1, 2, 1, true), Shape({4, 8, 50}), true);
}

TEST(Bf16Cpu, LinearMatchesRoundedReference) {
  SKIP_WITHOUT_NATIVE_BF16();
  Args a;
  a.Set("out", int64_t{37});
  CheckBf16Layer("linear", a, Shape({9, 70}), false);
  a.Set("bias", false);
  CheckBf16Layer("linear", a, Shape({64, 300}), false);
}

// The GEMM's transposes and beta, against f64 over the rounded operands.
TEST(Bf16Cpu, GemmTransposesAndBeta) {
  SKIP_WITHOUT_NATIVE_BF16();
  const int64_t m = 13, n = 21, k = 40;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float beta : {0.0f, 1.0f, 0.5f}) {
        const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 2, ldc = n + 5;
        const Tensor a = RandomTensor({(ta ? k : m) * lda}, 1, -1, 1, DType::kF32);
        const Tensor b = RandomTensor({(tb ? n : k) * ldb}, 2, -1, 1, DType::kF32);
        Tensor c = RandomTensor({m * ldc}, 3, -1, 1, DType::kF32);
        const Tensor c0 = c.Cast(DType::kF64);
        cpu::GemmBf16(ta, tb, m, n, k, a.data<float>(), lda, b.data<float>(), ldb, beta,
                      c.data<float>(), ldc);
        double err = 0;
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < n; ++j) {
            double s = 0;
            for (int64_t l = 0; l < k; ++l) {
              s += RoundedValue(a.At(ta ? l * lda + i : i * lda + l)) *
                   RoundedValue(b.At(tb ? j * ldb + l : l * ldb + j));
            }
            err = std::max(err, std::abs(c.At(i * ldc + j) - (s + beta * c0.At(i * ldc + j))));
          }
        EXPECT_LE(err, 1e-4) << "ta " << ta << " tb " << tb << " beta " << beta;
        // The padding between rows is untouched.
        EXPECT_EQ(c.At(n), static_cast<float>(c0.At(n)));
      }
}

// A small network trains in bf16 as its f32 twin does: the same weights at
// the start, 40 SGD steps on one batch; the losses stay within bf16's
// rounding of each other and fall as far.
TEST(Bf16Cpu, TrainsAsF32Does) {
  SKIP_WITHOUT_NATIVE_BF16();
  auto f32 = Model::Build(SmallNet(), {3, 12, 12}, {.seed = 7});
  auto bf16 = Model::Build(SmallNet(), {3, 12, 12}, {.seed = 7, .compute = DType::kBF16});
  const int64_t n = 32;
  const Tensor x = RandomTensor({n, 3, 12, 12}, 9, -1, 1, DType::kF32);
  std::vector<int64_t> labels(n);
  for (int64_t i = 0; i < n; ++i) labels[i] = i % 5;
  auto step = [&](Model& m) {
    m.ZeroGrad();
    ForwardContext ctx;
    const Tensor& logits = m.Forward(x, ctx);
    Tensor dlogits = Tensor::Empty(logits.shape(), DType::kF32);
    const double loss = SoftmaxCrossEntropy(logits, labels.data(), &dlogits).loss;
    m.Backward(dlogits);
    for (auto& np : m.NamedParameters()) {
      float* v = np.param->value.data<float>();
      const float* g = np.param->grad.data<float>();
      for (int64_t i = 0; i < np.param->value.numel(); ++i) v[i] -= 0.05f * g[i];
    }
    return loss;
  };
  double first = 0, last_f32 = 0, last_bf16 = 0;
  for (int s = 0; s < 40; ++s) {
    last_f32 = step(*f32);
    last_bf16 = step(*bf16);
    if (s == 0) {
      first = last_f32;
      EXPECT_NEAR(last_bf16, last_f32, 0.01 * last_f32);
    }
  }
  EXPECT_LT(last_f32, 0.5 * first);
  EXPECT_LT(last_bf16, 0.5 * first);
  EXPECT_NEAR(last_bf16, last_f32, 0.1 * first);
}

}  // namespace
}  // namespace cnnflow
