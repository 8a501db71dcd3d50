#include "ops/layers/batch_norm.h"

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>

#include "ops/collectives/collective.h"
#include "ops/cpu/elementwise.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow {
namespace {

using testing::CheckGradients;
using testing::MakeLayer;
using testing::RandomTensor;
using testing::RunForward;

Args BnArgs(double momentum = 0.1, double eps = 1e-5, bool affine = true) {
  Args a;
  a.Set("momentum", momentum);
  a.Set("eps", eps);
  a.Set("affine", affine);
  return a;
}

ForwardContext Mode(bool training) {
  ForwardContext ctx;
  ctx.training = training;
  return ctx;
}

// Gives weight, bias and the running statistics non-trivial values.
void Randomise(Layer& layer, uint64_t seed) {
  Rng rng(seed);
  for (auto& p : layer.parameters())
    for (int64_t i = 0; i < p.value.numel(); ++i)
      p.value.Set(i, p.name == "weight" ? rng.Uniform(0.5, 1.5) : rng.Uniform(-0.5, 0.5));
  Tensor& rm = layer.buffers()[0].value;
  Tensor& rv = layer.buffers()[1].value;
  for (int64_t i = 0; i < rm.numel(); ++i) {
    rm.Set(i, rng.Uniform(-0.3, 0.3));
    rv.Set(i, rng.Uniform(0.5, 2.0));
  }
}

// Naive reference: x viewed as [N, C, S]; statistics per channel.
struct NaiveBn {
  std::vector<double> mean, var;
  Tensor y;
};
NaiveBn NaiveBatchNorm(const Tensor& x, Layer& layer, bool training, double eps) {
  const int64_t n = x.dim(0), c_n = x.dim(1), s_n = x.numel() / (n * c_n);
  NaiveBn r;
  r.mean.assign(c_n, 0);
  r.var.assign(c_n, 0);
  r.y = Tensor::Empty(x.shape(), DType::kF64);
  const bool affine = !layer.parameters().empty();
  for (int64_t c = 0; c < c_n; ++c) {
    double mean = 0, var = 0;
    if (training) {
      for (int64_t i = 0; i < n; ++i)
        for (int64_t s = 0; s < s_n; ++s) mean += x.At((i * c_n + c) * s_n + s);
      mean /= static_cast<double>(n * s_n);
      for (int64_t i = 0; i < n; ++i)
        for (int64_t s = 0; s < s_n; ++s) {
          const double d = x.At((i * c_n + c) * s_n + s) - mean;
          var += d * d;
        }
      var /= static_cast<double>(n * s_n);
    } else {
      mean = layer.buffers()[0].value.At(c);
      var = layer.buffers()[1].value.At(c);
    }
    r.mean[c] = mean;
    r.var[c] = var;
    const double g = affine ? layer.parameters()[0].value.At(c) : 1.0;
    const double b = affine ? layer.parameters()[1].value.At(c) : 0.0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t s = 0; s < s_n; ++s) {
        const int64_t k = (i * c_n + c) * s_n + s;
        r.y.Set(k, (x.At(k) - mean) / std::sqrt(var + eps) * g + b);
      }
  }
  return r;
}

TEST(BatchNorm, ParametersAndBuffersAsPytorch) {
  auto layer = MakeLayer("batchnorm", BnArgs(), {Shape{3, 4, 4}});
  ASSERT_EQ(layer->parameters().size(), 2u);
  EXPECT_EQ(layer->parameters()[0].name, "weight");
  EXPECT_EQ(layer->parameters()[1].name, "bias");
  ASSERT_EQ(layer->buffers().size(), 2u);
  EXPECT_EQ(layer->buffers()[0].name, "running_mean");
  EXPECT_EQ(layer->buffers()[1].name, "running_var");
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_EQ(layer->parameters()[0].value.At(c), 1.0);
    EXPECT_EQ(layer->parameters()[1].value.At(c), 0.0);
    EXPECT_EQ(layer->buffers()[0].value.At(c), 0.0);
    EXPECT_EQ(layer->buffers()[1].value.At(c), 1.0);
  }
  auto plain = MakeLayer("batchnorm", BnArgs(0.1, 1e-5, false), {Shape{3}});
  EXPECT_TRUE(plain->parameters().empty());
  EXPECT_EQ(plain->buffers().size(), 2u);
  EXPECT_THROW(MakeLayer("batchnorm", BnArgs(), {Shape{2, 3, 4, 5}}), ShapeError);
}

TEST(BatchNorm, ForwardMatchesNaive) {
  for (const Shape& s : {Shape{4, 3, 5, 6}, Shape{3, 4, 7}, Shape{6, 5}, Shape{1, 2, 3, 3}}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(s.ToString() + (training ? " training" : " eval"));
      auto layer = MakeLayer("batchnorm", BnArgs(), {s.WithoutBatch()});
      Randomise(*layer, 3);
      Tensor x = RandomTensor(s, 4, -2, 3);
      NaiveBn ref = NaiveBatchNorm(x, *layer, training, 1e-5);  // before the running update
      Tensor y = RunForward(*layer, {x}, s, Mode(training));
      for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.At(i), ref.y.At(i), 1e-12) << i;
    }
  }
}

TEST(BatchNorm, ForwardFloatMatchesNaive) {
  // A large mean next to a small spread: the f32 kernel must not cancel.
  const Shape s{8, 4, 9, 9};
  auto layer = MakeLayer("batchnorm", BnArgs(), {s.WithoutBatch()}, DType::kF32);
  Tensor x = RandomTensor(s, 5, 99, 101, DType::kF32);
  NaiveBn ref = NaiveBatchNorm(x, *layer, true, 1e-5);
  Tensor y = RunForward(*layer, {x}, s, Mode(true));
  for (int64_t i = 0; i < y.numel(); ++i) ASSERT_NEAR(y.At(i), ref.y.At(i), 2e-4) << i;
}

TEST(BatchNorm, RunningStatsUpdateByHand) {
  // One channel, values {1, 2, 3, 6}: mean 3, biased var 3.5, unbiased var 14/3.
  auto layer = MakeLayer("batchnorm", BnArgs(0.1), {Shape{1, 2}});
  Tensor x = Tensor::Empty({2, 1, 2}, DType::kF64);
  const double v[] = {1, 2, 3, 6};
  for (int i = 0; i < 4; ++i) x.Set(i, v[i]);
  Tensor y = RunForward(*layer, {x}, {2, 1, 2}, Mode(true));
  EXPECT_NEAR(layer->buffers()[0].value.At(0), 0.9 * 0 + 0.1 * 3, 1e-12);
  EXPECT_NEAR(layer->buffers()[1].value.At(0), 0.9 * 1 + 0.1 * 14.0 / 3.0, 1e-12);
  // Normalised with the biased variance.
  EXPECT_NEAR(y.At(0), (1 - 3) / std::sqrt(3.5 + 1e-5), 1e-12);
  // A second step compounds: running = 0.9 * running + 0.1 * batch.
  RunForward(*layer, {x}, {2, 1, 2}, Mode(true));
  EXPECT_NEAR(layer->buffers()[0].value.At(0), 0.9 * 0.3 + 0.1 * 3, 1e-12);
  EXPECT_NEAR(layer->buffers()[1].value.At(0), 0.9 * (0.9 + 0.1 * 14.0 / 3.0) + 0.1 * 14.0 / 3.0,
              1e-12);
  // Eval neither uses nor changes the batch statistics.
  const double rm = layer->buffers()[0].value.At(0), rv = layer->buffers()[1].value.At(0);
  Tensor ye = RunForward(*layer, {x}, {2, 1, 2}, Mode(false));
  EXPECT_EQ(layer->buffers()[0].value.At(0), rm);
  EXPECT_NEAR(ye.At(3), (6 - rm) / std::sqrt(rv + 1e-5), 1e-12);

  // Another momentum: running = (1 - m) * running + m * batch.
  auto fast = MakeLayer("batchnorm", BnArgs(0.5), {Shape{1, 2}});
  RunForward(*fast, {x}, {2, 1, 2}, Mode(true));
  EXPECT_NEAR(fast->buffers()[0].value.At(0), 1.5, 1e-12);
  EXPECT_NEAR(fast->buffers()[1].value.At(0), 0.5 + 0.5 * 14.0 / 3.0, 1e-12);
}

TEST(BatchNorm, GradientCheckTraining) {
  for (const Shape& s : {Shape{2, 3, 4, 5}, Shape{1, 2, 3, 3}, Shape{3, 4, 5}, Shape{5, 3}}) {
    for (bool affine : {true, false}) {
      SCOPED_TRACE(s.ToString() + (affine ? " affine" : ""));
      auto layer = MakeLayer("batchnorm", BnArgs(0.1, 1e-5, affine), {s.WithoutBatch()});
      Randomise(*layer, 7);
      testing::GradCheckOptions opt;
      opt.ctx = Mode(true);
      CheckGradients(*layer, {RandomTensor(s, 8)}, s, opt);
    }
  }
}

TEST(BatchNorm, GradientCheckEval) {
  for (const Shape& s : {Shape{2, 3, 4, 5}, Shape{1, 2, 3, 3}, Shape{3, 4, 5}, Shape{1, 3}}) {
    SCOPED_TRACE(s.ToString());
    auto layer = MakeLayer("batchnorm", BnArgs(), {s.WithoutBatch()});
    Randomise(*layer, 9);
    testing::GradCheckOptions opt;
    opt.ctx = Mode(false);
    CheckGradients(*layer, {RandomTensor(s, 10)}, s, opt);
  }
}

TEST(BatchNorm, ResultsDoNotDependOnThreadCount) {
  const Shape s{64, 32, 14, 14};
  auto run = [&](int threads) {
    tbb::global_control gc(tbb::global_control::max_allowed_parallelism, threads);
    auto layer = MakeLayer("batchnorm", BnArgs(), {s.WithoutBatch()}, DType::kF32);
    Tensor x = RandomTensor(s, 1, -1, 2, DType::kF32);
    Tensor y = RunForward(*layer, {x}, s, Mode(true));
    Tensor dy = RandomTensor(s, 2, -1, 1, DType::kF32);
    Tensor dx = Tensor::Empty(s, DType::kF32);
    layer->Backward({&x}, y, dy, {&dx});
    return std::vector<Tensor>{y,
                               dx,
                               layer->parameters()[0].grad,
                               layer->parameters()[1].grad,
                               layer->buffers()[0].value,
                               layer->buffers()[1].value};
  };
  auto a = run(1), b = run(2);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(std::memcmp(a[i].raw_data(), b[i].raw_data(), a[i].nbytes()), 0) << "tensor " << i;
}

TEST(BatchNorm, SingleValuePerChannelInTrainingIsError) {
  auto layer = MakeLayer("batchnorm", BnArgs(), {Shape{4}});
  Tensor x = RandomTensor({1, 4}, 1);
  try {
    RunForward(*layer, {x}, {1, 4}, Mode(true));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than 1 value per channel"), std::string::npos);
  }
  EXPECT_NO_THROW(RunForward(*layer, {x}, {1, 4}, Mode(false)));
}

// ---------------------------------------------------------------------------
// Synchronised BatchNorm (ForwardContext::sync_sum): N replicas, each with
// its own layer (same parameters and running statistics) and a shard of one
// batch, synced through an in-process LocalGroup from each replica's own
// thread, must equal ONE layer on the whole batch without sync.

using SyncFn = std::function<void(float*, int64_t)>;

// What one training step (forward + backward) of one layer leaves.
struct StepResult {
  Tensor y, dx, dweight, dbias, running_mean, running_var;
};

StepResult TrainStep(Layer& layer, const Tensor& x, const Tensor& dy, const ForwardContext& ctx) {
  for (auto& p : layer.parameters()) p.grad.Zero();
  StepResult r;
  r.y = RunForward(layer, {x}, x.shape(), ctx);
  r.dx = Tensor::Empty(x.shape(), x.dtype());
  layer.Backward({&x}, r.y, dy, {&r.dx});
  r.dweight = layer.parameters()[0].grad.Clone();
  r.dbias = layer.parameters()[1].grad.Clone();
  r.running_mean = layer.buffers()[0].value.Clone();
  r.running_var = layer.buffers()[1].value.Clone();
  return r;
}

std::unique_ptr<Layer> ReplicaLayer(const Shape& sample, DType dtype) {
  auto layer = MakeLayer("batchnorm", BnArgs(), {sample}, dtype);
  Randomise(*layer, 11);  // the same parameters and running statistics everywhere
  return layer;
}

// Replica r trains on rows [bounds[r], bounds[r + 1]) of x and dy, from its
// own thread; sync_sum all-reduces over a LocalGroup. calls[r] counts
// replica r's sync_sum calls.
std::vector<StepResult> SyncedSteps(const Tensor& x, const Tensor& dy,
                                    const std::vector<int64_t>& bounds,
                                    std::vector<int>* calls = nullptr) {
  const int n = static_cast<int>(bounds.size()) - 1;
  LocalGroup group(n, /*timeout_s=*/30, "bn replicas");
  std::vector<StepResult> out(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<int> counted(n, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        auto layer = ReplicaLayer(x.shape().WithoutBatch(), x.dtype());
        const SyncFn sync = [&, r](float* data, int64_t count) {
          ++counted[r];
          group.AllReduceSum(r, data, count, "bn sync");
        };
        ForwardContext ctx;
        ctx.training = true;
        ctx.sync_sum = &sync;
        out[r] = TrainStep(*layer, x.Slice(bounds[r], bounds[r + 1]),
                           dy.Slice(bounds[r], bounds[r + 1]), ctx);
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        group.Abort(StrCat("replica ", r, ": ", e.what()));
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  if (calls != nullptr) *calls = counted;
  return out;
}

// |a - b| <= tol * (1 + |b|) for every element (rows of `a` are rows
// [row0, ...) of `b` when b is bigger); returns the largest |a - b|.
double ExpectClose(const Tensor& a, const Tensor& b, double tol, const std::string& what,
                   int64_t offset = 0) {
  double worst = 0;
  int bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double u = a.At(i), v = b.At(offset + i);
    worst = std::max(worst, std::abs(u - v));
    if (!(std::abs(u - v) <= tol * (1 + std::abs(v))) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: " << u << " vs " << v;
  }
  return worst;
}

// Runs the batch both ways and compares: outputs and dx row by row, the
// running statistics of every replica, and the sum over replicas of the
// weight and bias gradients (local sums) with the single layer's.
void CompareSyncWithWholeBatch(const Shape& batch, const std::vector<int64_t>& bounds, DType dtype,
                               double tol, double lo = -2, double hi = 3) {
  SCOPED_TRACE(batch.ToString() + " in " + std::to_string(bounds.size() - 1) + " shards");
  ASSERT_EQ(bounds.back(), batch[0]);
  const Tensor x = RandomTensor(batch, 21, lo, hi, dtype);
  const Tensor dy = RandomTensor(batch, 22, -1, 1, dtype);
  auto single_layer = ReplicaLayer(batch.WithoutBatch(), dtype);
  const StepResult single = TrainStep(*single_layer, x, dy, Mode(true));
  const std::vector<StepResult> shards = SyncedSteps(x, dy, bounds);
  const int64_t row = batch.numel() / batch[0];
  const int64_t c_n = batch[1];
  Tensor dweight = Tensor::Zeros({c_n}, DType::kF64), dbias = Tensor::Zeros({c_n}, DType::kF64);
  for (size_t r = 0; r < shards.size(); ++r) {
    SCOPED_TRACE("replica " + std::to_string(r));
    ExpectClose(shards[r].y, single.y, tol, "y", bounds[r] * row);
    ExpectClose(shards[r].dx, single.dx, tol, "dx", bounds[r] * row);
    ExpectClose(shards[r].running_mean, single.running_mean, tol, "running_mean");
    ExpectClose(shards[r].running_var, single.running_var, tol, "running_var");
    // Every replica ends with bitwise the same running statistics.
    EXPECT_EQ(std::memcmp(shards[r].running_mean.raw_data(), shards[0].running_mean.raw_data(),
                          shards[0].running_mean.nbytes()),
              0);
    EXPECT_EQ(std::memcmp(shards[r].running_var.raw_data(), shards[0].running_var.raw_data(),
                          shards[0].running_var.nbytes()),
              0);
    for (int64_t c = 0; c < c_n; ++c) {
      dweight.Set(c, dweight.At(c) + shards[r].dweight.At(c));
      dbias.Set(c, dbias.At(c) + shards[r].dbias.At(c));
    }
  }
  ExpectClose(dweight, single.dweight, tol, "sum of dweight");
  ExpectClose(dbias, single.dbias, tol, "sum of dbias");
}

// f32: the sync sums travel as float; outputs, gradients and running
// statistics agree to a few float ulps (tolerance 2e-5 relative).
constexpr double kSyncF32Tol = 2e-5;

TEST(BatchNormSync, TwoAndThreeReplicasMatchOneLayer2d) {
  CompareSyncWithWholeBatch({8, 3, 4, 5}, {0, 4, 8}, DType::kF32, kSyncF32Tol);
  CompareSyncWithWholeBatch({8, 3, 4, 5}, {0, 5, 8}, DType::kF32, kSyncF32Tol);  // uneven
  CompareSyncWithWholeBatch({9, 3, 4, 5}, {0, 3, 6, 9}, DType::kF32, kSyncF32Tol);
  CompareSyncWithWholeBatch({7, 4, 3, 3}, {0, 4, 5, 7}, DType::kF32, kSyncF32Tol);  // 4, 1, 2
}

TEST(BatchNormSync, ReplicasMatchOneLayer1d) {
  // [N, C, L] and [N, C]; a shard may hold a single value per channel, as
  // long as the global batch has more.
  CompareSyncWithWholeBatch({5, 4, 7}, {0, 3, 5}, DType::kF32, kSyncF32Tol);
  CompareSyncWithWholeBatch({6, 2, 16}, {0, 2, 4, 6}, DType::kF32, kSyncF32Tol);
  CompareSyncWithWholeBatch({4, 6}, {0, 1, 4}, DType::kF32, kSyncF32Tol);
  CompareSyncWithWholeBatch({5, 6}, {0, 1, 3, 5}, DType::kF32, kSyncF32Tol);
}

TEST(BatchNormSync, LargeMeanSmallSpreadKeepsPrecision) {
  // |mean| / std ~ 300: the second pass around the pass-1 mean keeps the
  // normalised values as precise as the single f32 layer.
  CompareSyncWithWholeBatch({8, 4, 9, 9}, {0, 5, 8}, DType::kF32, 2e-4, 299, 301);
  CompareSyncWithWholeBatch({9, 4, 9, 9}, {0, 3, 6, 9}, DType::kF32, 2e-4, -301, -299);
}

TEST(BatchNormSync, DoubleInputsSyncAtFloatPrecision) {
  // f64 layers sync through float hi/lo pairs: over N > 1 replicas the
  // statistics carry about float precision (the sum of the hi parts).
  CompareSyncWithWholeBatch({6, 3, 5}, {0, 4, 6}, DType::kF64, 1e-6);
  CompareSyncWithWholeBatch({9, 2, 3, 3}, {0, 2, 7, 9}, DType::kF64, 1e-6);
  // |mean| / std ~ 300: float sums alone would put the mean off by ~1e-5 std;
  // the second pass around the pass-1 mean corrects it.
  CompareSyncWithWholeBatch({8, 4, 9, 9}, {0, 5, 8}, DType::kF64, 1e-6, 299, 301);
}

TEST(BatchNormSync, RunningStatsByHand) {
  // One channel; replica 0 holds {1, 2}, replica 1 holds {3, 6}: the global
  // mean 3, biased var 3.5 (normalisation), unbiased var 14/3 (running).
  Tensor x = Tensor::Empty({2, 1, 2}, DType::kF32);
  const double v[] = {1, 2, 3, 6};
  for (int i = 0; i < 4; ++i) x.Set(i, v[i]);
  const Tensor dy = Tensor::Zeros({2, 1, 2}, DType::kF32);
  const std::vector<StepResult> shards = SyncedSteps(x, dy, {0, 1, 2});
  auto ref = ReplicaLayer(Shape{1, 2}, DType::kF32);  // the initial running statistics
  const double rm = ref->buffers()[0].value.At(0), rv = ref->buffers()[1].value.At(0);
  const double g = ref->parameters()[0].value.At(0), b = ref->parameters()[1].value.At(0);
  for (const StepResult& r : shards) {
    EXPECT_NEAR(r.running_mean.At(0), 0.9 * rm + 0.1 * 3, 1e-6);
    EXPECT_NEAR(r.running_var.At(0), 0.9 * rv + 0.1 * 14.0 / 3.0, 1e-6);
  }
  EXPECT_NEAR(shards[1].y.At(1), (6 - 3) / std::sqrt(3.5 + 1e-5) * g + b, 1e-5);
}

TEST(BatchNormSync, CallsAndDeterminism) {
  const Shape batch{6, 3, 4, 4};
  const Tensor x = RandomTensor(batch, 31, -1, 2, DType::kF32);
  const Tensor dy = RandomTensor(batch, 32, -1, 1, DType::kF32);
  std::vector<int> calls;
  auto a = SyncedSteps(x, dy, {0, 2, 6}, &calls);
  // Two calls in forward (mean, variance), one in backward.
  EXPECT_EQ(calls, (std::vector<int>{3, 3}));
  // Collectives are rank-ordered sums: a rerun is bitwise the same.
  auto b = SyncedSteps(x, dy, {0, 2, 6});
  for (size_t r = 0; r < a.size(); ++r) {
    for (auto field : {&StepResult::y, &StepResult::dx, &StepResult::dweight, &StepResult::dbias,
                       &StepResult::running_mean, &StepResult::running_var}) {
      EXPECT_EQ(
          std::memcmp((a[r].*field).raw_data(), (b[r].*field).raw_data(), (a[r].*field).nbytes()),
          0)
          << "replica " << r;
    }
  }
}

TEST(BatchNormSync, BackwardWithoutInputGradientSkipsSync) {
  // No dx wanted (the first layer): no backward sync; the parameter
  // gradients are this replica's local sums.
  const Shape s{4, 3, 5};
  auto layer = MakeLayer("batchnorm", BnArgs(), {s.WithoutBatch()});
  Randomise(*layer, 5);
  int calls = 0;
  const SyncFn identity = [&](float*, int64_t) { ++calls; };
  ForwardContext ctx = Mode(true);
  ctx.sync_sum = &identity;
  const Tensor x = RandomTensor(s, 1), dy = RandomTensor(s, 2);
  Tensor y = RunForward(*layer, {x}, s, ctx);
  EXPECT_EQ(calls, 2);
  layer->Backward({&x}, y, dy, {nullptr});
  EXPECT_EQ(calls, 2);
  const Tensor dweight = layer->parameters()[0].grad.Clone();
  auto plain = MakeLayer("batchnorm", BnArgs(), {s.WithoutBatch()});
  Randomise(*plain, 5);
  const StepResult ref = TrainStep(*plain, x, dy, Mode(true));
  ExpectClose(dweight, ref.dweight, 1e-12, "dweight");
}

TEST(BatchNormSync, GradientCheckWithIdentitySync) {
  // One replica with an identity sync_sum runs the synced path (float hi/lo
  // packing included) and must still pass the f64 gradient check and equal
  // the unsynced layer.
  for (const Shape& s : {Shape{2, 3, 4, 5}, Shape{3, 4, 5}, Shape{5, 3}}) {
    for (bool affine : {true, false}) {
      SCOPED_TRACE(s.ToString() + (affine ? " affine" : ""));
      int calls = 0;
      const SyncFn identity = [&](float*, int64_t) { ++calls; };
      auto layer = MakeLayer("batchnorm", BnArgs(0.1, 1e-5, affine), {s.WithoutBatch()});
      Randomise(*layer, 7);
      testing::GradCheckOptions opt;
      opt.ctx = Mode(true);
      opt.ctx.sync_sum = &identity;
      CheckGradients(*layer, {RandomTensor(s, 8)}, s, opt);
      EXPECT_GT(calls, 3);

      auto synced = MakeLayer("batchnorm", BnArgs(0.1, 1e-5, affine), {s.WithoutBatch()});
      auto plain = MakeLayer("batchnorm", BnArgs(0.1, 1e-5, affine), {s.WithoutBatch()});
      const Tensor x = RandomTensor(s, 9);
      const Tensor ys = RunForward(*synced, {x}, s, opt.ctx);
      const Tensor yp = RunForward(*plain, {x}, s, Mode(true));
      ExpectClose(ys, yp, 1e-12, "y");
      ExpectClose(synced->buffers()[1].value, plain->buffers()[1].value, 1e-12, "running_var");
    }
  }
}

TEST(BatchNormSync, EvalIgnoresSyncSum) {
  const Shape s{4, 3, 2, 2};
  auto layer = MakeLayer("batchnorm", BnArgs(), {s.WithoutBatch()}, DType::kF32);
  Randomise(*layer, 3);
  int calls = 0;
  const SyncFn sync = [&](float*, int64_t) { ++calls; };
  ForwardContext ctx = Mode(false);
  ctx.sync_sum = &sync;
  const Tensor x = RandomTensor(s, 4, -1, 1, DType::kF32);
  const Tensor dy = RandomTensor(s, 5, -1, 1, DType::kF32);
  const Tensor rm = layer->buffers()[0].value.Clone();
  const StepResult synced = TrainStep(*layer, x, dy, ctx);
  const StepResult plain = TrainStep(*layer, x, dy, Mode(false));
  EXPECT_EQ(calls, 0);
  for (auto field : {&StepResult::y, &StepResult::dx, &StepResult::dweight})
    EXPECT_EQ(
        std::memcmp((synced.*field).raw_data(), (plain.*field).raw_data(), (plain.*field).nbytes()),
        0);
  EXPECT_EQ(std::memcmp(layer->buffers()[0].value.raw_data(), rm.raw_data(), rm.nbytes()), 0);
}

// Channels-last (Layer::SetChannelsLast): every path of the NHWC layer
// (training, evaluation, synced; plain, ReLU or GELU fused) against the
// NCHW layer on the same values, in f64: the same outputs, running
// statistics and gradients up to the order of the sums.
// 5 channels take the sums' 4-channel tile and a single channel; 37 take
// two 16-channel tiles, a 4-channel one and a single one, over several
// blocks of rows.
TEST(BatchNorm, ChannelsLastMatchesNchw) {
  enum Fused { kNone, kRelu, kGelu };
  for (const Shape& s : {Shape{3, 5, 4, 3}, Shape{2, 37, 9, 8}})
    for (Fused fused : {kNone, kRelu, kGelu}) {
      for (int mode = 0; mode < 3; ++mode) {  // training, evaluation, training synced
        SCOPED_TRACE(::testing::Message() << s << " fused " << fused << " mode " << mode);
        int calls = 0;
        const SyncFn identity = [&](float*, int64_t) { ++calls; };
        std::unique_ptr<Layer> layers[2];
        for (int k = 0; k < 2; ++k) {
          layers[k] = MakeLayer("batchnorm", BnArgs(0.3), {s.WithoutBatch()});
          Randomise(*layers[k], 11);
          if (fused == kRelu) layers[k]->FuseRelu();
          if (fused == kGelu) layers[k]->FuseGelu();
        }
        layers[1]->SetChannelsLast({true}, true);
        ForwardContext ctx = Mode(mode != 1);
        if (mode == 2) ctx.sync_sum = &identity;
        const Tensor x = RandomTensor(s, 12, -2, 3), dy = RandomTensor(s, 13);
        const Tensor xl = testing::ToChannelsLast(x);
        const Tensor y = RunForward(*layers[0], {x}, s, ctx);
        const Tensor yl = RunForward(*layers[1], {xl}, s, ctx);
        EXPECT_LE(MaxAbsDiff(testing::FromChannelsLast(yl), y), 1e-12);
        for (int b = 0; b < 2; ++b) {
          EXPECT_LE(MaxAbsDiff(layers[1]->buffers()[b].value, layers[0]->buffers()[b].value),
                    1e-12);
        }
        Tensor dx = Tensor::Empty(s, DType::kF64), dxl = Tensor::Empty(s, DType::kF64);
        layers[0]->Backward({&x}, y, dy, {&dx});
        const Tensor dyl = testing::ToChannelsLast(dy);
        layers[1]->Backward({&xl}, yl, dyl, {&dxl});
        EXPECT_LE(MaxAbsDiff(testing::FromChannelsLast(dxl), dx), 1e-12);
        for (int p = 0; p < 2; ++p) {
          EXPECT_LE(MaxAbsDiff(layers[1]->parameters()[p].grad, layers[0]->parameters()[p].grad),
                    1e-12);
        }
        EXPECT_EQ(calls, mode == 2 ? 6 : 0);  // two forward and one backward call each
      }
    }
}

TEST(BatchNormSync, ErrorsAreTheSameOnEveryReplica) {
  // One value per channel over all replicas: every replica throws (after
  // the same sync call), so none is left waiting.
  const Tensor x = RandomTensor({2, 4}, 1, -1, 1, DType::kF32);
  const Tensor dy = RandomTensor({2, 4}, 2, -1, 1, DType::kF32);
  try {
    SyncedSteps(x, dy, {0, 1, 1});  // shards of 1 and 0 rows: global count 1
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("over the synced replicas"), std::string::npos)
        << e.what();
  }
  // An empty std::function is a caller bug, reported with the layer name.
  auto layer = MakeLayer("batchnorm", BnArgs(), {Shape{4}});
  const SyncFn empty;
  ForwardContext ctx = Mode(true);
  ctx.sync_sum = &empty;
  EXPECT_THROW(RunForward(*layer, {RandomTensor({3, 4}, 1)}, {3, 4}, ctx), Error);
}

}  // namespace
}  // namespace cnnflow
