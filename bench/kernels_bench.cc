// Kernel micro-benchmarks (Google Benchmark): the Fashion-MNIST model's
// layers at batch 64, JPEG decoding and augmentation. Rates are per image;
// GFLOP/s counters use the layers' own FLOP counts.
//   build/bench/kernels_bench [--benchmark_filter=Conv]
// Threads: the TBB arena of each benchmark (second argument where given).
#include <benchmark/benchmark.h>
#include <tbb/global_control.h>

#include <vector>

#include "loaders/augment.h"
#include "loaders/jpeg_decoder.h"
#include "ops/layer.h"
#include "ops/layers/activation.h"
#include "ops/random.h"

namespace cnnflow {
namespace {

Tensor Random(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::Empty(shape);
  Rng rng(seed);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(rng.Uniform(-1, 1));
  return t;
}

// Forward + backward of one layer of the Fashion-MNIST model, batch 64.
void LayerStep(benchmark::State& state, const char* type, Args args, Shape sample, bool need_dx) {
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism, state.range(0));
  const int64_t n = 64;
  const LayerType* t = LayerRegistry::Get().Find(type);
  args.FillDefaults(t->schema);
  auto layer = t->create(type, args);
  const Shape out = layer->Build({sample}, DType::kF32);
  Rng rng(1);
  layer->ResetParameters(rng);
  Tensor x = Random(sample.WithBatch(n), 2), y = Tensor::Empty(out.WithBatch(n));
  Tensor dy = Random(out.WithBatch(n), 3), dx = Tensor::Empty(sample.WithBatch(n));
  for (auto _ : state) {
    layer->Forward({&x}, y, {});
    layer->Backward({&x}, y, dy, {need_dx ? &dx : nullptr});
  }
  // Backward costs ~2x forward with dx, ~1x without.
  const double flops = static_cast<double>(layer->ForwardFlops(n)) * (need_dx ? 3 : 2);
  state.counters["img/s"] = benchmark::Counter(n, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

Args Conv(int64_t out) {
  Args a;
  a.Set("out", out);
  a.Set("kernel", int64_t{3});
  a.Set("pad", int64_t{1});
  return a;
}

void BM_Conv1(benchmark::State& s) { LayerStep(s, "conv2d", Conv(32), {1, 28, 28}, false); }
void BM_Conv2(benchmark::State& s) { LayerStep(s, "conv2d", Conv(64), {32, 14, 14}, true); }
void BM_Fc1(benchmark::State& s) {
  Args a;
  a.Set("out", int64_t{128});
  LayerStep(s, "linear", a, {3136}, true);
}
void BM_MaxPool1(benchmark::State& s) {
  Args a;
  a.Set("kernel", int64_t{2});
  LayerStep(s, "maxpool2d", a, {32, 28, 28}, true);
}
// Forward + backward of a training batchnorm with a fused ReLU (as the
// step runs ResNet-18's), batch 64, on [channels, hw, hw] samples.
// batchnorm with its activation fused (Layer::FuseRelu / FuseGelu), forward
// and backward on [n, C, H, W] f32, or [n, H, W, C] when the fourth argument
// is 1 (channels-last, as a bf16 model keeps it).
void BatchNormStep(benchmark::State& state, bool gelu) {
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism, 2);
  const int64_t c = state.range(0), hw = state.range(1), n = state.range(2);
  const bool nhwc = state.range(3) != 0;
  const LayerType* t = LayerRegistry::Get().Find("batchnorm");
  Args args;
  args.FillDefaults(t->schema);
  auto layer = t->create("bn", args);
  const Shape sample{c, hw, hw};
  layer->Build({sample}, DType::kF32);
  layer->SetChannelsLast({nhwc}, nhwc);
  if (gelu) {
    layer->FuseGelu();
  } else {
    layer->FuseRelu();
  }
  Rng rng(1);
  layer->ResetParameters(rng);
  Tensor x = Random(sample.WithBatch(n), 2), y = Tensor::Empty(sample.WithBatch(n));
  Tensor dy = Random(sample.WithBatch(n), 3), dx = Tensor::Empty(sample.WithBatch(n));
  for (auto _ : state) {
    layer->Forward({&x}, y, {});
    layer->Backward({&x}, y, dy, {&dx});
  }
  // Bytes the two passes must move at least: x, y (forward); x, y, dy, dx (backward).
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(x.numel()) * 4 * 6 / 1e9,
                                              benchmark::Counter::kIsIterationInvariantRate);
}
void BM_BatchNormRelu(benchmark::State& state) { BatchNormStep(state, false); }
void BM_BatchNormGelu(benchmark::State& state) { BatchNormStep(state, true); }
// [C, H, W] and the batch: ResNet-18's at batch 64, the CIFAR speed run's
// (configs/cifar10_speedrun.yaml) at 1024.
BENCHMARK(BM_BatchNormRelu)
    ->ArgsProduct({{64}, {32}, {64}, {0, 1}})
    ->ArgsProduct({{512}, {4}, {64}, {0, 1}})
    ->ArgsProduct({{64}, {15}, {1024}, {0, 1}})
    ->ArgsProduct({{256}, {7}, {1024}, {0, 1}})
    ->UseRealTime();
BENCHMARK(BM_BatchNormGelu)
    ->ArgsProduct({{64}, {15}, {1024}, {0, 1}})
    ->ArgsProduct({{256}, {7}, {1024}, {0, 1}})
    ->UseRealTime();

BENCHMARK(BM_Conv1)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_Conv2)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_Fc1)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_MaxPool1)->Arg(1)->Arg(2)->UseRealTime();

// Activations, forward + backward on [16, 64, 56, 56] f32: the layer (oneDNN
// eltwise over fixed chunks) against a scalar loop of the same functions
// (std::erf / std::exp per element, what the layer would be without oneDNN).
const Shape kActShape{16, 64, 56, 56};

void ActivationStep(benchmark::State& state, const char* type) {
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism, state.range(0));
  const LayerType* t = LayerRegistry::Get().Find(type);
  Args args;
  args.FillDefaults(t->schema);
  auto layer = t->create(type, args);
  layer->Build({kActShape.WithoutBatch()}, DType::kF32);
  Tensor x = Random(kActShape, 2), y = Tensor::Empty(kActShape);
  Tensor dy = Random(kActShape, 3), dx = Tensor::Empty(kActShape);
  for (auto _ : state) {
    layer->Forward({&x}, y, {});
    layer->Backward({&x}, y, dy, {&dx});
  }
  state.counters["Melem/s"] = benchmark::Counter(static_cast<double>(x.numel()) / 1e6,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

template <typename Op>
void ScalarLoopStep(benchmark::State& state) {
  Tensor x = Random(kActShape, 2), y = Tensor::Empty(kActShape);
  Tensor dy = Random(kActShape, 3), dx = Tensor::Empty(kActShape);
  const float* xs = x.data<float>();
  const float* g = dy.data<float>();
  float* ys = y.data<float>();
  float* d = dx.data<float>();
  for (auto _ : state) {
    for (int64_t i = 0; i < x.numel(); ++i) ys[i] = Op::Forward(xs[i], 0.f);
    for (int64_t i = 0; i < x.numel(); ++i) d[i] = Op::Backward(xs[i], g[i], 0.f);
    benchmark::ClobberMemory();
  }
  state.counters["Melem/s"] = benchmark::Counter(static_cast<double>(x.numel()) / 1e6,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Gelu(benchmark::State& s) { ActivationStep(s, "gelu"); }
void BM_Silu(benchmark::State& s) { ActivationStep(s, "silu"); }
void BM_Hardswish(benchmark::State& s) { ActivationStep(s, "hardswish"); }
BENCHMARK(BM_Gelu)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_Silu)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(BM_Hardswish)->Arg(1)->Arg(2)->UseRealTime();
BENCHMARK(ScalarLoopStep<act::GeluErf>)->Name("BM_GeluScalarLoop")->UseRealTime();
BENCHMARK(ScalarLoopStep<act::Silu>)->Name("BM_SiluScalarLoop")->UseRealTime();

// A photo-like RGB image: gradients, edges and noise.
std::vector<uint8_t> PhotoLike(int w, int h) {
  std::vector<uint8_t> px(static_cast<size_t>(w) * h * 3);
  Rng rng(1);
  for (int y = 0; y < h; ++y)
    for (int x = 0; x < w; ++x)
      for (int c = 0; c < 3; ++c) {
        const int edge = ((x / 16 + y / 16) % 2) * 64;
        px[(static_cast<size_t>(y) * w + x) * 3 + c] =
            static_cast<uint8_t>((x * 255 / w + y * 255 / h) / 4 + edge + c * 20 + rng.Below(16));
      }
  return px;
}

// Single-thread TurboJPEG decode of one image, full size.
void BM_JpegDecode(benchmark::State& state) {
  const int w = static_cast<int>(state.range(0)), h = static_cast<int>(state.range(1));
  const std::vector<uint8_t> src = PhotoLike(w, h);
  const std::string jpeg = EncodeJpeg(src.data(), w, h, 3, 90);
  JpegDecoder dec;
  std::vector<uint8_t> buf(src.size());
  for (auto _ : state) {
    const JpegResult r = dec.Decode(reinterpret_cast<const uint8_t*>(jpeg.data()), jpeg.size(), 3,
                                    buf.data(), buf.size());
    if (!r.ok()) state.SkipWithError(r.error.c_str());
  }
  state.counters["img/s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["jpeg_bytes"] = static_cast<double>(jpeg.size());
}
BENCHMARK(BM_JpegDecode)->Args({32, 32})->Args({500, 375});

// Augmentation of one sample: CIFAR-style (pad 4, random crop, flip) and
// ImageNet-style (resize min side 256, crop 224, flip); second argument: 1
// adds trivial_augment, 2 color_jitter [0.4, 0.4, 0.4, 0.1], 3 both.
void BM_Augment(benchmark::State& state) {
  const bool imagenet = state.range(0) != 0;
  const int64_t extra = state.range(1);
  const int h = imagenet ? 375 : 32, w = imagenet ? 500 : 32;
  AugmentOptions o;
  o.out_h = o.out_w = imagenet ? 224 : 32;
  o.pad = imagenet ? 0 : 4;
  o.resize_min_side = imagenet ? 256 : 0;
  o.random_crop = o.hflip = true;
  o.mean = {0.49f, 0.48f, 0.45f};
  o.std = {0.25f, 0.24f, 0.26f};
  o.trivial_augment = (extra & 1) != 0;
  if (extra & 2) o.color_jitter = {0.4, 0.4, 0.4, 0.1};
  const std::vector<uint8_t> img = PhotoLike(w, h);
  const Augmenter aug(o);
  std::vector<float> out(3 * o.out_h * o.out_w);
  int64_t i = 0;
  for (auto _ : state) aug.Run(img.data(), h, w, 3, 1, 0, i++, out.data());
  state.counters["img/s"] = benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Augment)->ArgsProduct({{0, 1}, {0, 1, 2, 3}});

}  // namespace
}  // namespace cnnflow

BENCHMARK_MAIN();
