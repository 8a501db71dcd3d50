// The algorithm picks of conv2d's passes (picks.h): timed on random data,
// one chunk of each pass, on the calling thread.
#include "ops/cpu/conv/picks.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "ops/cpu/conv/chunks.h"
#include "ops/cpu/conv/lowering.h"
#include "ops/cpu/conv/onednn_conv.h"
#include "ops/cpu/conv/pick_cache.h"
#include "ops/cpu/conv/scratch.h"
#include "ops/random.h"

namespace cnnflow::cpu {
namespace {

// Seconds of the fastest of a few runs of fn (after one untimed run).
template <typename Fn>
double BestSeconds(Fn&& fn) {
  using Clock = std::chrono::steady_clock;
  fn();
  double best = 1e30;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return best;
}

// size f32 values, uniform in [-1, 1): the data kernels are timed on.
Tensor RandomF32(Rng& rng, int64_t size) {
  Tensor t = Tensor::Empty({size});
  float* p = t.data<float>();
  for (int64_t i = 0; i < size; ++i) p[i] = static_cast<float>(rng.Uniform(-1, 1));
  return t;
}

// Times one chunk of each pass on this thread with both algorithms, on
// random data: "forward,backward_data,backward_weights" with gemm|onednn
// each, then the measured rates in parentheses. oneDNN must win by kMargin
// to be picked (a tie keeps the GEMM path).
constexpr double kMargin = 1.03;
std::string MeasurePicks(const Conv2dGeometry& g, bool has_bias, Conv2dScratch& scratch,
                         int64_t fwd_mb, int64_t bwd_mb) {
  std::unique_ptr<OnednnConv> fwd_conv, bwd_conv;
  try {
    const OnednnConv::Options options{.bias = has_bias};
    fwd_conv = std::make_unique<OnednnConv>(g, fwd_mb, options);
    bwd_conv = fwd_mb == bwd_mb ? nullptr : std::make_unique<OnednnConv>(g, bwd_mb, options);
  } catch (const Error&) {
    return "gemm,gemm,gemm";  // oneDNN has no primitive for this geometry
  }
  OnednnConv& bconv = bwd_conv != nullptr ? *bwd_conv : *fwd_conv;
  const int64_t mb = std::max(fwd_mb, bwd_mb);
  Rng rng(1);
  auto random = [&](int64_t size) { return RandomF32(rng, size); };
  const int64_t dw_size = g.out_channels * g.col_rows();
  Tensor x = random(mb * g.in_channels * g.in_plane()), dx = random(x.numel());
  Tensor y = random(mb * g.out_channels * g.out_plane()), dy = random(y.numel());
  Tensor w = random(dw_size), b = random(g.out_channels);
  Tensor dw = random(dw_size + g.out_channels);
  const float* bias = has_bias ? b.data<float>() : nullptr;
  float* db = has_bias ? dw.data<float>() + dw_size : nullptr;
  fwd_conv->PrepareForwardWeights(w.data<float>());
  bconv.PrepareBackwardWeights(w.data<float>());
  auto pick = [](double gemm, double onednn) {
    return gemm > kMargin * onednn ? "onednn" : "gemm";
  };

  const double f_gemm = BestSeconds([&] {
    GemmForwardChunk<float>(g, scratch, x.data<float>(), w.data<float>(), bias, false,
                            y.data<float>(), 0, fwd_mb);
  });
  const double f_onednn =
      BestSeconds([&] { fwd_conv->Forward(x.data<float>(), bias, y.data<float>()); });
  const double d_gemm = BestSeconds([&] {
    GemmBackwardChunk<float>(g, scratch, x.data<float>(), w.data<float>(), dy.data<float>(),
                             dx.data<float>(), nullptr, nullptr, 0, bwd_mb);
  });
  const double d_onednn =
      BestSeconds([&] { bconv.BackwardData(dy.data<float>(), dx.data<float>()); });
  const double w_gemm = BestSeconds([&] {
    GemmBackwardChunk<float>(g, scratch, x.data<float>(), w.data<float>(), dy.data<float>(),
                             nullptr, dw.data<float>(), db, 0, bwd_mb);
  });
  const double w_onednn = BestSeconds(
      [&] { bconv.BackwardWeights(x.data<float>(), dy.data<float>(), dw.data<float>(), db); });
  // The rates go along in the file, so a reader sees why.
  const double f_flop = 2.0 * g.out_channels * g.col_rows() * g.out_plane() / 1e9;
  auto rates = [&](int64_t mb, double gemm, double onednn) {
    return StrCat(static_cast<int>(f_flop * mb / gemm), "/",
                  static_cast<int>(f_flop * mb / onednn));
  };
  return StrCat(pick(f_gemm, f_onednn), ",", pick(d_gemm, d_onednn), ",", pick(w_gemm, w_onednn),
                " (GFLOP/s of one thread, gemm/onednn: forward ", rates(fwd_mb, f_gemm, f_onednn),
                ", backward-data ", rates(bwd_mb, d_gemm, d_onednn), ", backward-weights ",
                rates(bwd_mb, w_gemm, w_onednn), "; oneDNN's ", fwd_conv->ImplInfo(), ")");
}

// One OnednnConv's passes on one chunk: its forward, the faster of its
// backward-data primitive and the flipped forward, and the faster of its
// backward-weights primitive and the matmul (where it has them).
struct OnednnPassTimes {
  std::string data = "onednn", weights = "onednn", rates;
  double seconds = 0;  // the three passes as picked
};
OnednnPassTimes TimeOnednnPasses(OnednnConv& conv, const Conv2dGeometry& g, bool has_bias,
                                 int64_t mb) {
  Rng rng(1);
  auto random = [&](int64_t size) { return RandomF32(rng, size); };
  const int64_t dw_size = g.out_channels * g.col_rows();
  Tensor x = random(mb * g.in_channels * g.in_plane()), dx = random(x.numel());
  Tensor y = random(mb * g.out_channels * g.out_plane()), dy = random(y.numel());
  Tensor w = random(dw_size), b = random(g.out_channels), dw = random(dw_size + g.out_channels);
  const float* bias = has_bias ? b.data<float>() : nullptr;
  float* db = has_bias ? dw.data<float>() + dw_size : nullptr;
  const double flop = 2.0 * dw_size * g.out_plane() * mb / 1e9;
  auto rate = [&](double seconds) { return static_cast<int>(flop / seconds); };
  OnednnPassTimes t;
  conv.PrepareForwardWeights(w.data<float>());
  conv.PrepareBackwardWeights(w.data<float>());
  const double f = BestSeconds([&] { conv.Forward(x.data<float>(), bias, y.data<float>()); });
  double d = BestSeconds([&] { conv.BackwardData(dy.data<float>(), dx.data<float>()); });
  t.rates = StrCat("forward ", rate(f), ", backward-data ");
  // A pass's primitive against its alternative: the faster by kMargin (a
  // tie keeps the primitive), named in `pick`, its rate beside the other's.
  auto faster = [&](double own, const char* alt, double alt_seconds, std::string& pick) {
    t.rates = StrCat(t.rates, "onednn/", alt, " ", rate(own), "/", rate(alt_seconds));
    if (own <= kMargin * alt_seconds) return own;
    pick = alt;
    return alt_seconds;
  };
  if (conv.HasFlippedData()) {
    conv.PrepareFlippedWeights(w.data<float>());
    d = faster(d, "flipped", BestSeconds([&] {
                 conv.BackwardDataByFlippedForward(dy.data<float>(), dx.data<float>());
               }),
               t.data);
  } else {
    t.rates = StrCat(t.rates, rate(d));
  }
  double wt = BestSeconds(
      [&] { conv.BackwardWeights(x.data<float>(), dy.data<float>(), dw.data<float>(), db); });
  t.rates = StrCat(t.rates, ", backward-weights ");
  if (conv.HasMatmulWeights()) {
    wt = faster(wt, "matmul", BestSeconds([&] {
                  conv.BackwardWeightsByMatmul(x.data<float>(), dy.data<float>(), dw.data<float>(),
                                               db);
                }),
                t.weights);
  } else {
    t.rates = StrCat(t.rates, rate(wt));
  }
  t.seconds = f + d + wt;
  return t;
}

// bf16, and f32 on channels-last tensors: oneDNN's convolution forward;
// for backward-data its convolution or the flipped forward one, for
// backward-weights its convolution or OnednnConv's matmul (bf16 kernels),
// whichever is faster on one chunk: "onednn,onednn|flipped,onednn|matmul".
// bf16 weighs the f32 kernels on the same rounded operands too, and takes
// them where the three passes run kMargin faster (CPUs whose bf16 dot
// products are slower than their f32 FMAs): then a fourth pick, "f32".
// Then the rates of each.
std::string MeasureOnednnPicks(const Conv2dGeometry& g, bool has_bias, int64_t bwd_mb, bool bf16,
                               bool nhwc_in, bool nhwc_out) {
  OnednnConv conv(g, bwd_mb,
                  {.bias = has_bias, .bf16 = bf16, .nhwc_in = nhwc_in, .nhwc_out = nhwc_out});
  const OnednnPassTimes own = TimeOnednnPasses(conv, g, has_bias, bwd_mb);
  std::string picks = StrCat("onednn,", own.data, ",", own.weights);
  std::string rates = StrCat(bf16 ? "bf16" : "f32", " kernels: ", own.rates);
  if (bf16) {
    try {
      OnednnConv f32(g, bwd_mb,
                     {.bias = has_bias,
                      .bf16 = true,
                      .nhwc_in = nhwc_in,
                      .nhwc_out = nhwc_out,
                      .f32_kernels = true});
      const OnednnPassTimes t = TimeOnednnPasses(f32, g, has_bias, bwd_mb);
      if (own.seconds > kMargin * t.seconds)
        picks = StrCat("onednn,", t.data, ",", t.weights, ",f32");
      rates = StrCat(rates, "; f32 kernels on bf16 operands: ", t.rates);
    } catch (const Error&) {
      // No f32 primitive for the geometry: the bf16 kernels run it.
    }
  }
  return StrCat(picks, " (GFLOP/s of one thread, ", rates, ")");
}

ConvAlgo ParsePick(const std::string& s) {
  if (s == "onednn") return ConvAlgo::kOnednn;
  if (s == "matmul") return ConvAlgo::kMatmul;
  return s == "flipped" ? ConvAlgo::kFlipped : ConvAlgo::kGemm;
}

}  // namespace

std::string PickKey(const Conv2dGeometry& g, bool has_bias, int64_t n) {
  // The picks hold for one chunk size: the first chunk's stands for all.
  const int64_t fwd_mb = n / BatchChunks(n), bwd_mb = n / BackwardChunks(g, n);
  return StrCat("conv2d in=", g.in_channels, "x", g.in_h, "x", g.in_w, " out=", g.out_channels,
                " kernel=", g.kernel_h, "x", g.kernel_w, " stride=", g.stride_h, "x", g.stride_w,
                " pad=", g.pad_h, "x", g.pad_w, " dilation=", g.dilation_h, "x", g.dilation_w,
                " groups=", g.groups, " bias=", has_bias ? 1 : 0, " mb=", fwd_mb, "/", bwd_mb);
}

Conv2dPlan PlanConv(const Conv2dGeometry& g, bool has_bias, ConvAlgo algo, Conv2dScratch& scratch,
                    int64_t n, DType dtype) {
  if (dtype != DType::kF32 || (algo == ConvAlgo::kGemm && !scratch.bf16)) return {};
  // f32 on channels-last tensors: oneDNN's primitives (the GEMM path reads
  // NCHW), and where x and y are both NHWC the flipped backward-data if it
  // measures faster.
  const bool f32_nhwc = !scratch.bf16 && scratch.nhwc_in && scratch.nhwc_out;
  if (!scratch.bf16 && !f32_nhwc &&
      (algo == ConvAlgo::kOnednn || scratch.nhwc_in || scratch.nhwc_out)) {
    return {ConvAlgo::kOnednn, ConvAlgo::kOnednn, ConvAlgo::kOnednn};
  }
  std::lock_guard<std::mutex> lock(scratch.mu);
  auto it = scratch.plans.find(n);
  if (it != scratch.plans.end()) return it->second;
  const int64_t fwd_mb = n / BatchChunks(n), bwd_mb = n / BackwardChunks(g, n);
  const std::string key =
      StrCat(PickKey(g, has_bias, n), scratch.bf16 ? " bf16" : "",
             scratch.nhwc_in || scratch.nhwc_out
                 ? StrCat(" nhwc=", scratch.nhwc_in ? "in" : "", scratch.nhwc_out ? "out" : "")
                 : "");
  const std::string picks = FindOrMeasure(key, [&] {
    return scratch.bf16 || f32_nhwc ? MeasureOnednnPicks(g, has_bias, bwd_mb, scratch.bf16,
                                                         scratch.nhwc_in, scratch.nhwc_out)
                                    : MeasurePicks(g, has_bias, scratch, fwd_mb, bwd_mb);
  });
  // "forward,backward_data,backward_weights[,f32]", then the rates.
  std::vector<std::string> words;
  std::stringstream list(picks.substr(0, picks.find(' ')));
  for (std::string w; std::getline(list, w, ',');) words.push_back(w);
  CNNFLOW_ENFORCE(words.size() == 3 || (words.size() == 4 && words[3] == "f32" && scratch.bf16 &&
                                        words[2] != "matmul"),
                  "conv2d: bad kernel pick '", picks, "' for ", key, " in ", KernelPickFile());
  Conv2dPlan plan;
  plan.forward = ParsePick(words[0]);
  plan.backward_data = ParsePick(words[1]);
  plan.backward_weights = ParsePick(words[2]);
  plan.f32_kernels = words.size() == 4;
  scratch.plans[n] = plan;
  return plan;
}

}  // namespace cnnflow::cpu
