// conv2d: forward and backward against naive nested loops, gradient checks,
// shape errors, determinism across thread counts, and a timing to run by
// hand (--gtest_also_run_disabled_tests --gtest_filter='*Conv2dBench*').
#include "ops/layers/conv2d.h"

#include <gtest/gtest.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <string>
#include <utility>
#include <vector>

#include "ops/cpu/conv/pick_cache.h"
#include "ops/cpu/onednn.h"
#include "ops/cpu/parallel.h"
#include "tests/ops/gradient_check.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::CheckGradients;
using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

struct ConvCase {
  int64_t n, c, h, w, k;
  int64_t kh, kw, sh, sw, ph, pw, dh, dw, groups;
  bool bias = true;
};

Args ConvArgs(const ConvCase& t, const std::string& algo = "auto") {
  Args a;
  a.Set("algo", algo);
  a.Set("out", t.k);
  a.Set("kernel", std::vector<int64_t>{t.kh, t.kw});
  a.Set("stride", std::vector<int64_t>{t.sh, t.sw});
  a.Set("pad", std::vector<int64_t>{t.ph, t.pw});
  a.Set("dilation", std::vector<int64_t>{t.dh, t.dw});
  a.Set("groups", t.groups);
  a.Set("bias", t.bias);
  return a;
}

int64_t OutSize(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

// Naive convolution in double: returns [N, K, OH, OW] flattened.
std::vector<double> NaiveConv(const ConvCase& t, const Tensor& x, const Tensor& w,
                              const Tensor* b) {
  const int64_t oh_n = OutSize(t.h, t.kh, t.sh, t.ph, t.dh);
  const int64_t ow_n = OutSize(t.w, t.kw, t.sw, t.pw, t.dw);
  const int64_t cg = t.c / t.groups, kg = t.k / t.groups;
  std::vector<double> y(t.n * t.k * oh_n * ow_n);
  for (int64_t n = 0; n < t.n; ++n)
    for (int64_t k = 0; k < t.k; ++k)
      for (int64_t oh = 0; oh < oh_n; ++oh)
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          double s = b ? b->At(k) : 0.0;
          const int64_t grp = k / kg;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < t.kh; ++i)
              for (int64_t j = 0; j < t.kw; ++j) {
                const int64_t ih = oh * t.sh - t.ph + i * t.dh;
                const int64_t iw = ow * t.sw - t.pw + j * t.dw;
                if (ih < 0 || ih >= t.h || iw < 0 || iw >= t.w) continue;
                const int64_t ci = grp * cg + c;
                s += x.At(((n * t.c + ci) * t.h + ih) * t.w + iw) *
                     w.At(((k * cg + c) * t.kh + i) * t.kw + j);
              }
          y[((n * t.k + k) * oh_n + oh) * ow_n + ow] = s;
        }
  return y;
}

// Naive backward in double: dx [N, C, H, W], dw [K, C/g, kh, kw], db [K].
void NaiveConvBackward(const ConvCase& t, const Tensor& x, const Tensor& w, const Tensor& dy,
                       std::vector<double>* dx, std::vector<double>* dw, std::vector<double>* db) {
  const int64_t oh_n = OutSize(t.h, t.kh, t.sh, t.ph, t.dh);
  const int64_t ow_n = OutSize(t.w, t.kw, t.sw, t.pw, t.dw);
  const int64_t cg = t.c / t.groups, kg = t.k / t.groups;
  dx->assign(x.numel(), 0.0);
  dw->assign(w.numel(), 0.0);
  db->assign(t.k, 0.0);
  for (int64_t n = 0; n < t.n; ++n)
    for (int64_t k = 0; k < t.k; ++k)
      for (int64_t oh = 0; oh < oh_n; ++oh)
        for (int64_t ow = 0; ow < ow_n; ++ow) {
          const double g = dy.At(((n * t.k + k) * oh_n + oh) * ow_n + ow);
          (*db)[k] += g;
          const int64_t grp = k / kg;
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t i = 0; i < t.kh; ++i)
              for (int64_t j = 0; j < t.kw; ++j) {
                const int64_t ih = oh * t.sh - t.ph + i * t.dh;
                const int64_t iw = ow * t.sw - t.pw + j * t.dw;
                if (ih < 0 || ih >= t.h || iw < 0 || iw >= t.w) continue;
                const int64_t xi = ((n * t.c + grp * cg + c) * t.h + ih) * t.w + iw;
                const int64_t wi = ((k * cg + c) * t.kh + i) * t.kw + j;
                (*dx)[xi] += g * w.At(wi);
                (*dw)[wi] += g * x.At(xi);
              }
        }
}

// Creates and builds a conv2d (once), returning its output sample shape.
std::unique_ptr<Layer> BuildConv(Args args, const Shape& in, DType dtype, Shape* out) {
  const LayerType* type = LayerRegistry::Get().Find("conv2d");
  args.FillDefaults(type->schema);
  auto layer = type->create("conv", args);
  *out = layer->Build({in}, dtype);
  Rng rng(3);
  layer->ResetParameters(rng);
  return layer;
}

Shape InShape(const ConvCase& t) { return {t.n, t.c, t.h, t.w}; }
Shape OutShape(const ConvCase& t) {
  return {t.n, t.k, OutSize(t.h, t.kh, t.sh, t.ph, t.dh), OutSize(t.w, t.kw, t.sw, t.pw, t.dw)};
}

using testing::ExpectNear;

// Forward and backward of the layer against the naive loops.
void CheckAgainstNaive(const ConvCase& t, DType dtype, double tol,
                       const std::string& algo = "auto") {
  SCOPED_TRACE(StrCat(algo, " n=", t.n, " c=", t.c, " ", t.h, "x", t.w, " k=", t.k, " kernel ",
                      t.kh, "x", t.kw, " stride ", t.sh, "x", t.sw, " pad ", t.ph, "x", t.pw,
                      " dil ", t.dh, "x", t.dw, " groups ", t.groups, " ", DTypeName(dtype)));
  Shape out;
  auto layer = BuildConv(ConvArgs(t, algo), {t.c, t.h, t.w}, dtype, &out);
  ASSERT_EQ(out, OutShape(t).WithoutBatch());
  Parameter& w = layer->parameters()[0];
  const Tensor* b = t.bias ? &layer->parameters()[1].value : nullptr;
  Tensor x = RandomTensor(InShape(t), 5, -1, 1, dtype);
  Tensor y = RunForward(*layer, {x}, OutShape(t), {});
  ExpectNear(NaiveConv(t, x, w.value, b), y, tol, "y");

  Tensor dy = RandomTensor(OutShape(t), 6, -1, 1, dtype);
  Tensor dx = Tensor::Full(InShape(t), 123.0, dtype);  // must be overwritten
  for (auto& p : layer->parameters()) p.grad.Zero();
  const Tensor* xp = &x;
  Tensor* dxp = &dx;
  layer->Backward({xp}, y, dy, {dxp});
  std::vector<double> ndx, ndw, ndb;
  NaiveConvBackward(t, x, w.value, dy, &ndx, &ndw, &ndb);
  ExpectNear(ndx, dx, tol, "dx");
  ExpectNear(ndw, w.grad, tol, "dweight");
  if (t.bias) ExpectNear(ndb, layer->parameters()[1].grad, tol, "dbias");
}

const std::vector<ConvCase>& Cases() {
  //                                n  c  h  w  k kh kw sh sw ph pw dh dw g
  static const std::vector<ConvCase> cases = {
      {1, 1, 5, 5, 2, 3, 3, 1, 1, 1, 1, 1, 1, 1},         // batch 1, pad 1
      {2, 3, 7, 6, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1},         // odd sizes, stride 2
      {3, 4, 6, 7, 4, 3, 2, 1, 2, 0, 1, 2, 1, 2},         // dilation 2, groups 2, rect
      {2, 4, 5, 5, 6, 1, 1, 1, 1, 0, 0, 1, 1, 2},         // pointwise, groups 2
      {2, 2, 4, 5, 3, 1, 1, 2, 1, 0, 0, 1, 1, 1},         // 1x1 stride 2 (im2col path)
      {2, 2, 6, 6, 3, 2, 2, 1, 1, 2, 2, 1, 1, 1, false},  // pad >= kernel/2, no bias
      {1, 3, 9, 8, 3, 3, 3, 3, 2, 1, 0, 2, 2, 3},         // depthwise-like, stride 3
      // Stride 1 with W' == W takes the contiguous-span im2col path:
      {2, 3, 6, 7, 4, 3, 2, 1, 1, 0, 1, 1, 2, 1},  // no centre tap, H' < H
      {2, 2, 5, 6, 3, 5, 5, 1, 1, 2, 2, 1, 1, 1},  // two border columns
      {1, 2, 4, 4, 2, 3, 3, 1, 1, 2, 1, 1, 1, 1},  // H' > H: rows of pure padding
      {2, 1, 3, 2, 2, 3, 5, 1, 1, 1, 2, 1, 1, 1},  // kernel wider than the input
      // R = C/groups*kh*kw < K/groups: dW is computed transposed.
      {2, 2, 5, 4, 12, 2, 2, 1, 1, 0, 1, 1, 1, 2},
  };
  return cases;
}

TEST(Conv2dForward, MatchesNaiveF64) {
  for (const ConvCase& t : Cases()) CheckAgainstNaive(t, DType::kF64, 1e-12);
}

TEST(Conv2dForward, MatchesNaiveF32) {
  for (const ConvCase& t : Cases()) CheckAgainstNaive(t, DType::kF32, 1e-5);
}

// The cases above mostly have fewer than 64 output positions, where the
// GEMM path lowers a whole chunk into one GEMM; 16 more rows and columns
// take them to the per-sample GEMMs (P >= 64) too.
TEST(Conv2dForward, PerSampleGemmsMatchNaive) {
  for (ConvCase t : Cases()) {
    t.h += 16;
    t.w += 16;
    ASSERT_GE(OutShape(t)[2] * OutShape(t)[3], 64);
    CheckAgainstNaive(t, DType::kF64, 1e-12, "gemm");
    t.n = 9;  // ragged chunks
    CheckAgainstNaive(t, DType::kF64, 1e-12, "gemm");
  }
}

// Batches larger than a chunk and than one GEMM block (several chunks,
// ragged last block), with the model's own layer shapes.
TEST(Conv2dForward, LargeBatchesMatchNaive) {
  CheckAgainstNaive({37, 3, 5, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1}, DType::kF64, 1e-12);
  CheckAgainstNaive({37, 4, 3, 3, 2, 1, 1, 1, 1, 0, 0, 1, 1, 1}, DType::kF64, 1e-12);
  CheckAgainstNaive({5, 8, 14, 14, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1}, DType::kF32, 1e-5);
  CheckAgainstNaive({3, 1, 28, 28, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1}, DType::kF32, 1e-5);
  CheckAgainstNaive({37, 1, 6, 6, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1}, DType::kF64, 1e-12);
}

TEST(Conv2dGradient, MatchesFiniteDifferences) {
  for (const ConvCase& t : Cases()) {
    SCOPED_TRACE(StrCat("case c=", t.c, " ", t.h, "x", t.w, " k=", t.k, " groups ", t.groups));
    auto layer = MakeLayer("conv2d", ConvArgs(t), {Shape({t.c, t.h, t.w})});
    CheckGradients(*layer, {RandomTensor(InShape(t), 11)}, OutShape(t));
  }
}

TEST(Conv2dGradient, AddsIntoParameterGradsAndSkipsNullDx) {
  const ConvCase t{3, 2, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  auto layer = MakeLayer("conv2d", ConvArgs(t), {Shape({t.c, t.h, t.w})});
  Tensor x = RandomTensor(InShape(t), 1);
  Tensor y = RunForward(*layer, {x}, OutShape(t), {});
  Tensor dy = RandomTensor(OutShape(t), 2);
  for (auto& p : layer->parameters()) p.grad.Zero();
  const Tensor* xp = &x;
  layer->Backward({xp}, y, dy, {nullptr});
  Tensor once = layer->parameters()[0].grad.Clone();
  Tensor once_b = layer->parameters()[1].grad.Clone();
  layer->Backward({xp}, y, dy, {nullptr});
  for (int64_t i = 0; i < once.numel(); ++i) {
    ASSERT_NEAR(layer->parameters()[0].grad.At(i), 2 * once.At(i), 1e-12);
  }
  for (int64_t i = 0; i < once_b.numel(); ++i) {
    ASSERT_NEAR(layer->parameters()[1].grad.At(i), 2 * once_b.At(i), 1e-12);
  }
  std::vector<double> ndx, ndw, ndb;
  NaiveConvBackward(t, x, layer->parameters()[0].value, dy, &ndx, &ndw, &ndb);
  ExpectNear(ndw, once, 1e-12, "dweight");
}

// Outputs and gradients are bitwise equal whatever the thread count.
void ExpectSameAcrossThreadCounts(const ConvCase& t, const std::string& algo) {
  SCOPED_TRACE(algo);
  auto layer = MakeLayer("conv2d", ConvArgs(t, algo), {Shape({t.c, t.h, t.w})}, DType::kF32);
  Tensor x = RandomTensor(InShape(t), 1, -1, 1, DType::kF32);
  Tensor dy = RandomTensor(OutShape(t), 2, -1, 1, DType::kF32);
  auto grads = [&](int threads) {
    std::vector<Tensor> out;
    tbb::task_arena arena(threads);
    arena.execute([&] {
      Tensor y = RunForward(*layer, {x}, OutShape(t), {});
      Tensor dx = Tensor::Empty(InShape(t), DType::kF32);
      for (auto& p : layer->parameters()) p.grad.Zero();
      const Tensor* xp = &x;
      Tensor* dxp = &dx;
      layer->Backward({xp}, y, dy, {dxp});
      out = {y, dx, layer->parameters()[0].grad.Clone()};
      if (t.bias) out.push_back(layer->parameters()[1].grad.Clone());
    });
    return out;
  };
  const std::vector<Tensor> a = grads(1), b = grads(2), c = grads(2);
  for (size_t i = 0; i < a.size(); ++i) {
    for (int64_t j = 0; j < a[i].numel(); ++j) {
      ASSERT_EQ(a[i].At(j), b[i].At(j)) << "tensor " << i << " element " << j;
      ASSERT_EQ(b[i].At(j), c[i].At(j)) << "tensor " << i << " element " << j;
    }
  }
}

TEST(Conv2dGradient, DeterministicAcrossThreadCounts) {
  const ConvCase t{64, 4, 9, 9, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  ExpectSameAcrossThreadCounts(t, "gemm");
  ExpectSameAcrossThreadCounts(t, "onednn");
  ExpectSameAcrossThreadCounts(t, "auto");
  // ResNet's deep stage: few backward chunks, big dW.
  ExpectSameAcrossThreadCounts({64, 32, 4, 4, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, false}, "onednn");
}

// --- oneDNN's primitives (algo: onednn; f32 only) ----------------------------

// Every geometry of Cases(): strides, dilation, groups, padding wider than
// the kernel, kernels wider than the input, against the naive loops in f64.
TEST(Conv2dOnednn, MatchesNaiveForEveryCase) {
  for (const ConvCase& t : Cases()) CheckAgainstNaive(t, DType::kF32, 2e-5, "onednn");
}

// The shapes of real networks, several chunks of two sizes (37 = 5 x 2 +
// 11 x 3 in 16 chunks), and ResNet's 1x1 stride-2 shortcut (its right
// padding is negative: the last input row is never read).
TEST(Conv2dOnednn, NetworkShapesAndRaggedChunksMatchNaive) {
  //                n   c   h   w   k kh kw sh sw ph pw dh dw g
  CheckAgainstNaive({37, 8, 8, 8, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1}, DType::kF32, 2e-5, "onednn");
  CheckAgainstNaive({5, 16, 8, 8, 24, 1, 1, 2, 2, 0, 0, 1, 1, 1, false}, DType::kF32, 2e-5,
                    "onednn");
  CheckAgainstNaive({3, 16, 12, 12, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, false}, DType::kF32, 2e-5,
                    "onednn");
  CheckAgainstNaive({4, 3, 32, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1}, DType::kF32, 2e-5, "onednn");
  CheckAgainstNaive({2, 64, 4, 4, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, false}, DType::kF32, 5e-5,
                    "onednn");
}

// Central differences of L = sum(y * R) in f32. Convolution is linear in x
// and in w, so the difference quotient is exact for any step and only
// rounding remains: a large step keeps it far below the tolerance.
TEST(Conv2dOnednn, GradientsMatchFiniteDifferences) {
  for (const ConvCase& t : {ConvCase{3, 8, 6, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1},
                            ConvCase{2, 4, 7, 6, 8, 3, 3, 2, 2, 1, 1, 1, 1, 2},
                            ConvCase{2, 8, 5, 5, 8, 1, 1, 2, 2, 0, 0, 1, 1, 1, false}}) {
    SCOPED_TRACE(StrCat("c=", t.c, " ", t.h, "x", t.w, " k=", t.k, " stride ", t.sh));
    auto layer = MakeLayer("conv2d", ConvArgs(t, "onednn"), {Shape({t.c, t.h, t.w})}, DType::kF32);
    Tensor x = RandomTensor(InShape(t), 11, -1, 1, DType::kF32);
    const Tensor r = RandomTensor(OutShape(t), 12, -1, 1, DType::kF32);
    auto loss = [&] {
      Tensor y = RunForward(*layer, {x}, OutShape(t), {});
      double s = 0;
      for (int64_t i = 0; i < y.numel(); ++i) s += y.At(i) * r.At(i);
      return s;
    };
    Tensor y = RunForward(*layer, {x}, OutShape(t), {});
    Tensor dx = Tensor::Empty(InShape(t), DType::kF32);
    for (auto& p : layer->parameters()) p.grad.Zero();
    const Tensor* xp = &x;
    Tensor* dxp = &dx;
    layer->Backward({xp}, y, r, {dxp});
    const double h = 0.25;
    auto check = [&](Tensor& v, const Tensor& grad, const char* what) {
      for (int64_t i = 0; i < v.numel(); i += 1 + v.numel() / 40) {
        const double v0 = v.At(i);
        v.Set(i, v0 + h);
        const double up = loss();
        v.Set(i, v0 - h);
        const double down = loss();
        v.Set(i, v0);
        const double numeric = (up - down) / (2 * h);
        EXPECT_NEAR(grad.At(i), numeric, 1e-3 * (1 + std::abs(numeric))) << what << "[" << i << "]";
      }
    };
    check(x, dx, "dx");
    check(layer->parameters()[0].value, layer->parameters()[0].grad, "dweight");
    if (t.bias) check(layer->parameters()[1].value, layer->parameters()[1].grad, "dbias");
  }
}

TEST(Conv2dOnednn, F64RunsTheGemmPath) {
  auto layer = MakeLayer("conv2d", ConvArgs(Cases()[1], "onednn"), {Shape({3, 7, 6})});
  const Conv2dPlan plan = dynamic_cast<Conv2d&>(*layer).PlanFor(2, DType::kF64);
  EXPECT_EQ(plan.forward, ConvAlgo::kGemm);
  EXPECT_EQ(plan.backward_weights, ConvAlgo::kGemm);
  CheckAgainstNaive(Cases()[1], DType::kF64, 1e-12, "onednn");
}

// --- algo: auto and the kernel pick cache --------------------------------------

// Sets CNNFLOW_CACHE_DIR to a fresh folder for one test.
class KernelPickDir {
 public:
  KernelPickDir() {
    char tmpl[] = "/tmp/cnnflow_picks_XXXXXX";
    dir_ = mkdtemp(tmpl);
    const char* old = std::getenv("CNNFLOW_CACHE_DIR");
    had_old_ = old != nullptr;
    if (had_old_) old_ = old;
    setenv("CNNFLOW_CACHE_DIR", dir_.c_str(), 1);
  }
  ~KernelPickDir() {
    if (had_old_) {
      setenv("CNNFLOW_CACHE_DIR", old_.c_str(), 1);
    } else {
      unsetenv("CNNFLOW_CACHE_DIR");
    }
    std::remove(file().c_str());
    std::remove(dir_.c_str());
  }
  std::string file() const { return dir_ + "/kernel-picks.tsv"; }
  std::string Read() const {
    std::string text;
    if (FILE* f = std::fopen(file().c_str(), "r")) {
      char buf[4096];
      for (size_t got; (got = std::fread(buf, 1, sizeof buf, f)) > 0;) text.append(buf, got);
      std::fclose(f);
    }
    return text;
  }
  void Write(const std::string& key, const std::string& pick) const {
    FILE* f = std::fopen(file().c_str(), "a");
    ASSERT_NE(f, nullptr);
    std::fprintf(f, "%s\t%s\t%s\n", cpu::MachineId().c_str(), key.c_str(), pick.c_str());
    std::fclose(f);
  }

 private:
  std::string dir_, old_;
  bool had_old_ = false;
};

TEST(KernelPicks, MeasuredOnceThenReadFromTheFile) {
  KernelPickDir dir;
  int measured = 0;
  auto measure = [&] { return ++measured, std::string("b"); };
  EXPECT_EQ(cpu::FindOrMeasure("test-key-1", measure), "b");
  EXPECT_EQ(cpu::FindOrMeasure("test-key-1", measure), "b");
  EXPECT_EQ(measured, 1);
  EXPECT_NE(dir.Read().find("\ttest-key-1\tb\n"), std::string::npos) << dir.Read();
  // Another process's pick, already in the file: taken as it is.
  dir.Write("test-key-2", "a");
  EXPECT_EQ(cpu::FindOrMeasure("test-key-2", measure), "a");
  EXPECT_EQ(measured, 1);
}

// Picks in the file decide each pass, mixed plans included: forward and
// backward-weights on oneDNN with backward-data on GEMM, and the reverse.
TEST(KernelPicks, MixedPlansFromTheFileMatchNaive) {
  KernelPickDir dir;
  const ConvCase a{17, 8, 6, 6, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  const ConvCase b{17, 8, 6, 6, 16, 3, 3, 2, 2, 1, 1, 1, 1, 1, false};
  for (const auto& [t, pick] :
       {std::pair{a, "onednn,gemm,onednn"}, std::pair{b, "gemm,onednn,gemm"}}) {
    auto layer = MakeLayer("conv2d", ConvArgs(t), {Shape({t.c, t.h, t.w})}, DType::kF32);
    dir.Write(dynamic_cast<Conv2d&>(*layer).KernelPickKey(t.n), pick);
    const Conv2dPlan plan = dynamic_cast<Conv2d&>(*layer).PlanFor(t.n, DType::kF32);
    EXPECT_EQ(StrCat(ConvAlgoName(plan.forward), ",", ConvAlgoName(plan.backward_data), ",",
                     ConvAlgoName(plan.backward_weights)),
              pick);
    CheckAgainstNaive(t, DType::kF32, 2e-5);
  }
}

// auto measures a shape once and records it; a second layer of the same
// shape (another replica) gets the same plan without measuring.
TEST(KernelPicks, AutoMeasuresOncePerShape) {
  KernelPickDir dir;
  const ConvCase t{8, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  auto one = MakeLayer("conv2d", ConvArgs(t), {Shape({t.c, t.h, t.w})}, DType::kF32);
  auto two = MakeLayer("conv2d", ConvArgs(t), {Shape({t.c, t.h, t.w})}, DType::kF32);
  auto& c1 = dynamic_cast<Conv2d&>(*one);
  auto& c2 = dynamic_cast<Conv2d&>(*two);
  const Conv2dPlan p1 = c1.PlanFor(t.n, DType::kF32), p2 = c2.PlanFor(t.n, DType::kF32);
  EXPECT_EQ(p1.forward, p2.forward);
  EXPECT_EQ(p1.backward_data, p2.backward_data);
  EXPECT_EQ(p1.backward_weights, p2.backward_weights);
  const std::string text = dir.Read();
  const std::string key = c1.KernelPickKey(t.n);
  const size_t at = text.find(key);
  ASSERT_NE(at, std::string::npos) << text;
  EXPECT_EQ(text.find(key, at + 1), std::string::npos) << "measured twice:\n" << text;
}

// f32 on channels-last tensors (graph.channels_last): oneDNN reads and
// writes NHWC as it is, and the backward-data of a stride-1 convolution may
// run as the flipped forward one. Every pick of each case, pinned in the
// file, against the naive loops; then `auto` measures the alternatives once.
TEST(Conv2dOnednn, ChannelsLastPassesMatchNaive) {
  if (!cpu::OnednnHasAvx512Core()) {
    GTEST_SKIP() << "f32 channels-last convolutions run where oneDNN has AVX-512 kernels only";
  }
  KernelPickDir dir;
  //            n   c   h   w   k kh kw sh sw ph pw dh dw g
  for (const ConvCase& c : {ConvCase{5, 24, 9, 9, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, false},
                            ConvCase{4, 16, 7, 8, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1},
                            ConvCase{3, 8, 9, 9, 16, 2, 2, 1, 1, 0, 0, 1, 1, 1},  // no padding
                            ConvCase{3, 8, 9, 9, 16, 3, 3, 1, 1, 2, 2, 2, 2, 1},  // dilated
                            ConvCase{3, 16, 9, 9, 32, 3, 3, 2, 2, 1, 1, 1, 1, 1, false}}) {
    for (const char* pick : {"onednn,onednn,onednn", "onednn,flipped,onednn"}) {
      if (c.sh != 1 && std::string(pick).find("flipped") != std::string::npos) continue;
      // A geometry per pick: a key is read from the file once per process.
      ConvCase t = c;
      if (std::string(pick).find("flipped") != std::string::npos) t.k += 8;
      SCOPED_TRACE(StrCat(pick, " c=", t.c, " ", t.h, "x", t.w, " k=", t.k, " kernel ", t.kh,
                          " stride ", t.sh, " dilation ", t.dh));
      Shape out;
      auto layer = BuildConv(ConvArgs(t), {t.c, t.h, t.w}, DType::kF32, &out);
      auto& conv = dynamic_cast<Conv2d&>(*layer);
      conv.SetChannelsLast({true}, true);
      dir.Write(StrCat(conv.KernelPickKey(t.n), " nhwc=inout"), pick);
      const Conv2dPlan plan = conv.PlanFor(t.n, DType::kF32);
      ASSERT_EQ(StrCat(ConvAlgoName(plan.forward), ",", ConvAlgoName(plan.backward_data), ",",
                       ConvAlgoName(plan.backward_weights)),
                pick);
      Parameter& w = layer->parameters()[0];
      const Tensor* b = t.bias ? &layer->parameters()[1].value : nullptr;
      const Tensor x = RandomTensor(InShape(t), 5, -1, 1, DType::kF32);
      const Tensor xl = testing::ToChannelsLast(x);
      const Tensor yl = RunForward(*layer, {xl}, OutShape(t), {});
      ExpectNear(NaiveConv(t, x, w.value, b), testing::FromChannelsLast(yl), 2e-5, "y");
      const Tensor dy = RandomTensor(OutShape(t), 6, -1, 1, DType::kF32);
      Tensor dxl = Tensor::Full(InShape(t), 123.0, DType::kF32);  // must be overwritten
      for (auto& p : layer->parameters()) p.grad.Zero();
      layer->Backward({&xl}, yl, testing::ToChannelsLast(dy), {&dxl});
      std::vector<double> ndx, ndw, ndb;
      NaiveConvBackward(t, x, w.value, dy, &ndx, &ndw, &ndb);
      ExpectNear(ndx, testing::FromChannelsLast(dxl), 2e-5, "dx");
      ExpectNear(ndw, w.grad, 2e-5, "dweight");
      if (t.bias) ExpectNear(ndb, layer->parameters()[1].grad, 2e-5, "dbias");
    }
  }
  // Unpinned: the stride-1 geometry is measured with both backward-data
  // kernels and recorded under its channels-last key.
  const ConvCase t{6, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1};
  Shape out;
  auto layer = BuildConv(ConvArgs(t), {t.c, t.h, t.w}, DType::kF32, &out);
  auto& conv = dynamic_cast<Conv2d&>(*layer);
  conv.SetChannelsLast({true}, true);
  const Conv2dPlan plan = conv.PlanFor(t.n, DType::kF32);
  EXPECT_EQ(plan.forward, ConvAlgo::kOnednn);
  EXPECT_EQ(plan.backward_weights, ConvAlgo::kOnednn);
  const std::string text = dir.Read();
  EXPECT_NE(text.find(StrCat(conv.KernelPickKey(t.n), " nhwc=inout\t")), std::string::npos) << text;
  EXPECT_NE(text.find("(GFLOP/s of one thread, f32 kernels: forward "), std::string::npos) << text;
  EXPECT_NE(text.find(", backward-data onednn/flipped "), std::string::npos) << text;
}

TEST(Conv2dBuild, ParametersShapesAndInit) {
  ConvCase t{1, 6, 10, 12, 8, 3, 5, 2, 1, 1, 2, 1, 1, 2};
  auto layer = MakeLayer("conv2d", ConvArgs(t), {Shape({6, 10, 12})}, DType::kF32);
  ASSERT_EQ(layer->parameters().size(), 2u);
  EXPECT_EQ(layer->parameters()[0].name, "weight");
  EXPECT_EQ(layer->parameters()[0].value.shape(), Shape({8, 3, 3, 5}));
  EXPECT_EQ(layer->parameters()[1].name, "bias");
  EXPECT_EQ(layer->parameters()[1].value.shape(), Shape({8}));
  // fan_in = 3 * 3 * 5 = 45: U(-1/sqrt(45), 1/sqrt(45)), not all equal.
  const double bound = 1 / std::sqrt(45.0);
  double lo = 1, hi = -1;
  for (auto& p : layer->parameters()) {
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      lo = std::min(lo, p.value.At(i));
      hi = std::max(hi, p.value.At(i));
    }
  }
  EXPECT_GE(lo, -bound);
  EXPECT_LE(hi, bound);
  EXPECT_LT(lo, -bound / 2);
  EXPECT_GT(hi, bound / 2);
  // out 10x12 -> (10 + 2 - 3) / 2 + 1 = 5, (12 + 4 - 5) / 1 + 1 = 12.
  EXPECT_EQ(layer->ForwardFlops(4), 2 * 4 * 8 * 45 * 5 * 12);

  t.bias = false;
  auto nobias = MakeLayer("conv2d", ConvArgs(t), {Shape({6, 10, 12})});
  EXPECT_EQ(nobias->parameters().size(), 1u);
}

TEST(Conv2dBuild, ScalarParamsAndDefaults) {
  Args a;
  a.Set("out", int64_t{32});
  a.Set("kernel", int64_t{3});
  a.Set("pad", int64_t{1});
  Shape out;
  auto layer = BuildConv(a, {1, 28, 28}, DType::kF32, &out);
  EXPECT_EQ(out, Shape({32, 28, 28}));
  auto* conv = dynamic_cast<Conv2d*>(layer.get());
  ASSERT_NE(conv, nullptr);
  EXPECT_EQ(conv->geometry().stride_h, 1);
  EXPECT_EQ(conv->geometry().groups, 1);
  EXPECT_TRUE(conv->has_bias());
}

std::string BuildError(Args a, const Shape& in) {
  try {
    MakeLayer("conv2d", std::move(a), {in});
  } catch (const ShapeError& e) {
    return e.what();
  }
  return "no ShapeError";
}

TEST(Conv2dBuild, ShapeErrorsNameTheNumbers) {
  Args a;
  a.Set("out", int64_t{8});
  a.Set("kernel", int64_t{3});
  a.Set("in", int64_t{3});
  EXPECT_EQ(BuildError(a, {1, 28, 28}),
            "conv2d expects 3 input channels (in: 3), got [1, 28, 28] with 1");
  EXPECT_EQ(BuildError(a, {3, 28, 28}), "no ShapeError");

  Args g;
  g.Set("out", int64_t{8});
  g.Set("kernel", int64_t{3});
  g.Set("groups", int64_t{2});
  EXPECT_EQ(BuildError(g, {3, 8, 8}),
            "conv2d: input channels 3 are not divisible by groups 2 (input [3, 8, 8])");
  g.Set("out", int64_t{7});
  EXPECT_EQ(BuildError(g, {4, 8, 8}),
            "conv2d: output channels 7 (out) are not divisible by groups 2");

  Args s;
  s.Set("out", int64_t{2});
  s.Set("kernel", int64_t{3});
  s.Set("dilation", int64_t{2});
  EXPECT_EQ(BuildError(s, {1, 4, 9}),
            "conv2d: output size 0x5 <= 0: input [1, 4, 9] padded by 0x0 is smaller than the "
            "5x5 (dilated) kernel");
  EXPECT_EQ(BuildError(s, {4, 4}), "conv2d expects one [C, H, W] input, got [4, 4]");
}

TEST(Conv2dBuild, BadParamsAreConfigErrors) {
  Args a;
  a.Set("out", int64_t{8});
  a.Set("kernel", int64_t{0});
  EXPECT_THROW(MakeLayer("conv2d", a, {Shape({1, 5, 5})}), ConfigError);
  a.Set("kernel", std::vector<int64_t>{3, 3, 3});
  EXPECT_THROW(MakeLayer("conv2d", a, {Shape({1, 5, 5})}), ConfigError);
  a.Set("kernel", int64_t{3});
  a.Set("groups", int64_t{0});
  EXPECT_THROW(MakeLayer("conv2d", a, {Shape({1, 5, 5})}), ConfigError);
}

}  // namespace
}  // namespace cnnflow
