// Data parallelism in one process (ops/parallel/data_parallel.h): the invariants of
// DESIGN.md that hold without a graph around them.
//  1. N replicas x batch B == 1 replica x batch N*B (SGD and Adam, dropout
//     included: masks are keyed by sample id).
//  3. Accumulating K micro-batches of B == one step of K*B.
// Bucketing: with small buckets, the first reduction starts before backward
// ends. Replicas stay bitwise identical.
#include "ops/parallel/data_parallel.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <iostream>
#include <thread>

#include "ops/device_ops.h"
#include "ops/random.h"
#include "tests/ops/gpu_check.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

using testing::Spec;

// A small CNN of every kind of layer the invariant covers (no BatchNorm:
// its batch statistics depend on the shard).
std::vector<LayerSpec> Net() {
  return {
      Spec("conv1", "conv2d", {{"out", int64_t{6}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("relu1", "relu"),
      Spec("pool1", "maxpool2d", {{"kernel", int64_t{2}}}),
      Spec("flatten", "flatten"),
      Spec("fc1", "linear", {{"out", int64_t{16}}}),
      Spec("relu2", "relu"),
      Spec("drop", "dropout", {{"p", 0.25}}),
      Spec("fc2", "linear", {{"out", int64_t{5}}})};
}
const Shape kInput{2, 8, 8};

struct Data {
  Tensor x;
  std::vector<int64_t> labels, ids;
};
Data Batch(int64_t n, uint64_t seed) {
  Data d;
  d.x = Tensor::Empty(kInput.WithBatch(n), DType::kF32);
  Rng rng(seed);
  for (int64_t i = 0; i < d.x.numel(); ++i)
    d.x.data<float>()[i] = static_cast<float>(rng.Uniform() * 2 - 1);
  for (int64_t i = 0; i < n; ++i) {
    d.labels.push_back(static_cast<int64_t>(rng.NextU64() % 5));
    d.ids.push_back(static_cast<int64_t>(seed * 1000 + i));
  }
  return d;
}

Args Opt(const std::string& type) {
  Args a;
  a.Set("lr", 0.05);
  if (type == "sgd") a.Set("momentum", 0.9);
  a.FillDefaults(OptimizerSchema(type));
  return a;
}

std::unique_ptr<ReplicaSet> Make(int replicas, const std::string& opt, double bucket_mb = 25,
                                 const std::vector<LayerSpec>& net = Net(), bool sync_bn = false,
                                 int tensor_parallel = 1,
                                 std::map<std::string, TensorSplit> split = {},
                                 std::vector<Device> devices = {}) {
  DataParallelOptions o;
  o.replicas = replicas;
  o.devices = std::move(devices);
  o.sync_bn = sync_bn;
  o.bucket_mb = bucket_mb;
  o.timeout_s = 20;
  o.tensor_parallel = tensor_parallel;
  o.split_layers = std::move(split);
  return std::make_unique<ReplicaSet>(net, kInput, 7, InitScheme::kPytorchDefault,
                                      OptimizerSpec{opt, Opt(opt), {}}, o, MpiWorld::Get());
}

// One optimizer step of `set` on `micro` micro-batches (each cut into equal
// shards, one per data-parallel replica, run on the replicas' own threads;
// the members of a tensor-parallel group share a shard, as
// stages/forward_backward.cc runs them).
void TrainStep(ReplicaSet& set, const std::vector<Data>& micro, int64_t step) {
  int64_t total = 0;
  for (const Data& d : micro) total += d.x.dim(0);
  const int n = set.data_parallel(), tp = set.tensor_parallel();
  std::vector<std::thread> threads;
  for (int r = 0; r < set.size(); ++r) {
    threads.emplace_back([&, r] {
      const int g = r / tp;
      for (size_t k = 0; k < micro.size(); ++k) {
        const Data& d = micro[k];
        const int64_t b = d.x.dim(0) * g / n, e = d.x.dim(0) * (g + 1) / n;
        ForwardContext ctx{true, 3, step, d.ids.data() + b};
        set.ForwardBackward(r, d.x.Slice(b, e), d.labels.data() + b, ctx,
                            1.0 / (static_cast<double>(total) * tp), 0,
                            /*reduce=*/k + 1 == micro.size());
      }
      set.Step(r, 0.05);
    });
  }
  for (auto& t : threads) t.join();
}

double MaxRelDiff(Model& a, Model& b) {
  double worst = 0;
  auto pa = a.NamedParameters(), pb = b.NamedParameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    const Tensor x = pa[i].param->value.To(Device::Cpu());  // either model may be on a GPU
    const Tensor y = pb[i].param->value.To(Device::Cpu());
    double scale = 0;
    for (int64_t j = 0; j < x.numel(); ++j)
      scale = std::max(scale, std::fabs(double(x.data<float>()[j])));
    for (int64_t j = 0; j < x.numel(); ++j) {
      worst = std::max(worst, std::fabs(double(x.data<float>()[j]) - y.data<float>()[j]) / scale);
    }
  }
  return worst;
}

bool Bitwise(Model& a, Model& b) {
  auto pa = a.NamedParameters(), pb = b.NamedParameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    if (std::memcmp(pa[i].param->value.raw_data(), pb[i].param->value.raw_data(),
                    pa[i].param->value.nbytes()) != 0)
      return false;
  }
  return true;
}

TEST(DataParallel, BucketsGoInReverseLayerOrderAndRespectTheSize) {
  // 250 floats: fc2 (85) and fc1.bias (16) fit together, fc1.weight (1536)
  // is a bucket of its own (never split), then conv1 (6 + 108).
  auto set = Make(1, "sgd", /*bucket_mb=*/0.001);
  const auto& b = set->buckets();
  ASSERT_EQ(b.size(), 3u);
  EXPECT_EQ(b[0].tag, "bucket 0 (fc2.bias..fc1.bias)");
  EXPECT_EQ(b[1].tag, "bucket 1 (fc1.weight..fc1.weight)");
  EXPECT_EQ(b[2].tag, "bucket 2 (conv1.bias..conv1.weight)");
  EXPECT_EQ(b[1].numel, 1536);
  int64_t total = 0;
  for (const Bucket& k : b) total += k.numel;
  EXPECT_EQ(total, set->model().NumParameters());
  auto one = Make(1, "sgd");
  ASSERT_EQ(one->buckets().size(), 1u);
  EXPECT_EQ(one->buckets()[0].tag, "bucket 0 (fc2.bias..conv1.weight)");
}

// Invariant 1, for SGD with momentum and for Adam, over several steps, with
// several bucket sizes; the replicas stay bitwise identical to each other.
// In one process the replicas agree on a stop without a collective: the
// first to agree on a step takes the request flag as it reads it, and every
// other replica gets that answer for the step, whatever the flag says by
// then (a signal arriving between their reads), so all stop after the same
// step. A step's answer is forgotten once every replica has read it.
TEST(DataParallel, OneProcessAgreesOnAStopByTheFirstReplicasRead) {
  auto set = Make(3, "sgd");
  EXPECT_FALSE(set->AgreeStop(1, 5, false));
  EXPECT_FALSE(set->AgreeStop(0, 5, true));  // asked to stop after 1 read: not this step
  EXPECT_FALSE(set->AgreeStop(2, 5, true));
  EXPECT_TRUE(set->AgreeStop(2, 6, true));
  EXPECT_TRUE(set->AgreeStop(0, 6, false));
  EXPECT_TRUE(set->AgreeStop(1, 6, false));
  EXPECT_TRUE(set->AgreeStop(0, 5, true));  // step 5's answer (false) was forgotten: a new vote
}

TEST(DataParallel, NReplicasOfBEqualOneReplicaOfNB) {
  for (const std::string opt : {"sgd", "adam"}) {
    for (int n : {2, 3}) {
      SCOPED_TRACE(opt + " x" + std::to_string(n));
      auto single = Make(1, opt);
      auto multi = Make(n, opt, /*bucket_mb=*/0.002);
      for (int step = 0; step < 4; ++step) {
        const std::vector<Data> batch = {Batch(6 * n, 100 + step)};
        TrainStep(*single, batch, step);
        TrainStep(*multi, batch, step);
      }
      // Float sums in a different order: a few ulps per step.
      EXPECT_LT(MaxRelDiff(single->model(), multi->model()), 2e-5);
      auto fresh = Make(1, opt);
      EXPECT_GT(MaxRelDiff(single->model(), fresh->model()), 1e-3) << "training moved the weights";
      for (int r = 1; r < n; ++r) EXPECT_TRUE(Bitwise(multi->model(0), multi->model(r))) << r;
    }
  }
}

std::vector<LayerSpec> NetWithBatchNorm() {
  return {
      Spec("conv1", "conv2d", {{"out", int64_t{6}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("bn1", "batchnorm"),
      Spec("relu1", "relu"),
      Spec("pool1", "maxpool2d", {{"kernel", int64_t{2}}}),
      Spec("flatten", "flatten"),
      Spec("fc", "linear", {{"out", int64_t{5}}})};
}

// Invariant 1 with BatchNorm: with sync_bn the replicas normalise with the
// global batch's statistics, so they match one replica on the whole batch
// (weights and running statistics).
TEST(DataParallel, SyncBatchNormReplicasEqualOneReplicaOfTheWholeBatch) {
  auto single = Make(1, "sgd", 25, NetWithBatchNorm());
  auto multi = Make(2, "sgd", 0.002, NetWithBatchNorm(), /*sync_bn=*/true);
  auto plain = Make(2, "sgd", 0.002, NetWithBatchNorm(), /*sync_bn=*/false);
  for (int step = 0; step < 4; ++step) {
    const std::vector<Data> batch = {Batch(10, 400 + step)};
    TrainStep(*single, batch, step);
    TrainStep(*multi, batch, step);
    TrainStep(*plain, batch, step);
  }
  EXPECT_LT(MaxRelDiff(single->model(), multi->model()), 2e-5);
  EXPECT_GT(MaxRelDiff(single->model(), plain->model()), 1e-4)
      << "without sync, shard statistics differ: the check above has teeth";
  auto stats = [](Model& m) { return m.FindLayer("bn1")->buffers()[0].value; };  // running_mean
  for (int64_t c = 0; c < 6; ++c) {
    EXPECT_NEAR(stats(single->model()).At(c), stats(multi->model()).At(c), 1e-5) << c;
  }
  // broadcast_buffers: replica 1 holds replica 0's running statistics.
  EXPECT_EQ(std::memcmp(stats(plain->model(0)).raw_data(), stats(plain->model(1)).raw_data(),
                        stats(plain->model(0)).nbytes()),
            0);
}

// The same on one GPU listed twice (issue 55): SyncBN's kernels
// (ops/cuda/batch_norm_kernels.h) over two GPU lanes reduced on the device
// (ops/cuda/lane_group.h) equal SyncBN over two CPU replicas, and one GPU
// replica of the whole batch (full f32: TF32 off).
TEST(DataParallelGPU, SyncBatchNormOnTwoGpuLanesEqualsTwoCpuReplicas) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  SetGpuMath(Device::Cuda(0), {.tf32 = false});
  const std::vector<Device> two_gpus = {Device::Cuda(0), Device::Cuda(0)};
  auto cpu = Make(2, "sgd", 0.002, NetWithBatchNorm(), /*sync_bn=*/true);
  auto gpu = Make(2, "sgd", 0.002, NetWithBatchNorm(), /*sync_bn=*/true, 1, {}, two_gpus);
  auto one = Make(1, "sgd", 25, NetWithBatchNorm(), false, 1, {}, {Device::Cuda(0)});
  EXPECT_EQ(gpu->lane(1), 1);
  for (int step = 0; step < 4; ++step) {
    const std::vector<Data> batch = {Batch(10, 400 + step)};
    TrainStep(*cpu, batch, step);
    TrainStep(*gpu, batch, step);
    TrainStep(*one, batch, step);
  }
  SetGpuMath(Device::Cuda(0), {});
  EXPECT_LT(MaxRelDiff(cpu->model(), gpu->model()), 1e-4);
  EXPECT_LT(MaxRelDiff(one->model(), gpu->model()), 1e-4);
  EXPECT_EQ(MaxRelDiff(gpu->model(0), gpu->model(1)), 0) << "the lanes' weights differ";
  auto stats = [](Model& m) { return m.FindLayer("bn1")->buffers()[1].value.To(Device::Cpu()); };
  for (int64_t c = 0; c < 6; ++c) {  // running_var: the global batch's, unbiased
    EXPECT_NEAR(stats(cpu->model()).At(c), stats(gpu->model()).At(c), 1e-5) << c;
  }
}

// Invariant 3: two micro-batches of B then one step == one step of 2B.
TEST(DataParallel, AccumulatingKMicroBatchesEqualsOneBigBatch) {
  for (int n : {1, 2}) {
    SCOPED_TRACE(n);
    auto big = Make(n, "sgd");
    auto acc = Make(n, "sgd");
    for (int step = 0; step < 3; ++step) {
      const Data whole = Batch(8 * n, 200 + step);
      Data a, b;
      a.x = whole.x.Slice(0, 4 * n);
      b.x = whole.x.Slice(4 * n, 8 * n);
      a.labels.assign(whole.labels.begin(), whole.labels.begin() + 4 * n);
      b.labels.assign(whole.labels.begin() + 4 * n, whole.labels.end());
      a.ids.assign(whole.ids.begin(), whole.ids.begin() + 4 * n);
      b.ids.assign(whole.ids.begin() + 4 * n, whole.ids.end());
      TrainStep(*big, {whole}, step);
      TrainStep(*acc, {a, b}, step);
    }
    EXPECT_LT(MaxRelDiff(big->model(), acc->model()), 2e-5);
  }
}

TEST(DataParallel, FirstBucketIsReducedBeforeBackwardEnds) {
  // Two wide convolutions: backward goes on for milliseconds after the
  // small last layer's bucket is full.
  const std::vector<LayerSpec> net = {
      Spec("conv1", "conv2d", {{"out", int64_t{32}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("relu1", "relu"),
      Spec("conv2", "conv2d", {{"out", int64_t{32}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Spec("relu2", "relu"),
      Spec("flatten", "flatten"),
      Spec("fc", "linear", {{"out", int64_t{5}}})};
  auto set = Make(2, "sgd", /*bucket_mb=*/0.001, net);
  for (int step = 0; step < 3; ++step) TrainStep(*set, {Batch(256, 300 + step)}, step);
  const StepTimeline& t0 = set->timeline(0);
  const StepTimeline& t1 = set->timeline(1);
  const double first_reduce = std::min(t0.reduce_begin[0], t1.reduce_begin[0]);
  const double backward_end = std::max(t0.backward_end, t1.backward_end);
  EXPECT_LT(first_reduce, backward_end);
  const size_t last = set->buckets().size() - 1;
  EXPECT_GE(t0.reduce_begin[last], t0.reduce_begin[0]);
}

// The counters split each replica's time into the five phases of a step
// (pipeline/rank_times.h reads them): the wait for its batch counts from
// StartPass or its last step, not from before StartPass.
TEST(DataParallel, CountersSplitTheStepIntoItsPhases) {
  auto set = Make(2, "sgd");
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // before the pass: not counted
  set->StartPass();
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  TrainStep(*set, {Batch(8, 500)}, 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  TrainStep(*set, {Batch(8, 501)}, 1);
  for (int r = 0; r < 2; ++r) {
    const ReplicaSet::Counters& c = set->counters(r);
    EXPECT_EQ(c.steps, 2);
    EXPECT_GE(c.data_wait_seconds, 0.055) << "replica " << r;
    EXPECT_LT(c.data_wait_seconds, 0.2) << "replica " << r;
    EXPECT_GT(c.forward_seconds, 0);
    EXPECT_GT(c.backward_seconds, 0);
    EXPECT_GT(c.optimizer_seconds, 0);
    EXPECT_GE(c.reduce_wait_seconds, 0);
    EXPECT_DOUBLE_EQ(c.compute_seconds(),
                     c.forward_seconds + c.backward_seconds + c.optimizer_seconds);
  }
}

TEST(DataParallel, AFailingReplicaAbortsTheOthersInsteadOfHanging) {
  auto set = Make(2, "sgd");
  Data d = Batch(8, 5);
  d.labels[1] = 99;  // in replica 0's shard: the loss fails
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        ForwardContext ctx{true, 3, 0, d.ids.data() + 4 * r};
        set->ForwardBackward(r, d.x.Slice(4 * r, 4 * r + 4), d.labels.data() + 4 * r, ctx, 0.125, 0,
                             true);
        set->Step(r, 0.1);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_NE(errors[0].find("99"), std::string::npos) << errors[0];
  EXPECT_NE(errors[1].find("replica 0 failed: "), std::string::npos) << errors[1];
  EXPECT_NE(errors[1].find("99"), std::string::npos) << errors[1];
}

// ------------------------------------------------- tensor parallelism
// (ops/parallel/tensor_parallel.h's layers in replicas)

// Net() with a second conv: every layer type that splits, both splits.
// conv1 (column) feeds conv2 (row) through a relu, so they pair (no
// all-gather between); fc1 (column) and fc2 (row) have a dropout between
// them, so each gathers.
std::vector<LayerSpec> NetToSplit() {
  std::vector<LayerSpec> net = Net();
  net.insert(
      net.begin() + 2,
      Spec("conv2", "conv2d", {{"out", int64_t{7}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}));
  return net;
}
const std::map<std::string, TensorSplit> kSplits = {{"conv1", TensorSplit::kColumn},
                                                    {"conv2", TensorSplit::kRow},
                                                    {"fc1", TensorSplit::kColumn},
                                                    {"fc2", TensorSplit::kRow}};

TensorParallelLayer& Split(Model& m, const std::string& name) {
  auto* l = dynamic_cast<TensorParallelLayer*>(m.FindLayer(name));
  CNNFLOW_ENFORCE(l != nullptr, name, " is not split");
  return *l;
}

// A whole model after k steps, split over T members (2, and 3 with uneven
// shards), equals the unsplit one; every member keeps the unsplit weights,
// identical on all.
TEST(TensorParallel, SplitModelTrainsAsTheUnsplitOne) {
  for (const std::string opt : {"sgd", "adam"}) {
    for (int t : {2, 3}) {
      SCOPED_TRACE(opt + " T=" + std::to_string(t));
      auto single = Make(1, opt, 25, NetToSplit());
      auto split = Make(t, opt, 0.002, NetToSplit(), false, t, kSplits);
      EXPECT_TRUE(Split(split->model(), "conv1").shard().local_output())
          << "conv1 pairs with conv2";
      EXPECT_TRUE(Split(split->model(), "conv2").shard().local_input());
      EXPECT_FALSE(Split(split->model(), "fc1").shard().local_output()) << "a dropout between";
      EXPECT_EQ(split->model().NumParameters(), single->model().NumParameters());
      EXPECT_LT(MaxRelDiff(single->model(), split->model()), 1e-7) << "the same initial values";
      for (int step = 0; step < 4; ++step) {
        const std::vector<Data> batch = {Batch(12, 500 + step)};
        TrainStep(*single, batch, step);
        TrainStep(*split, batch, step);
      }
      // Partial sums in another order, and x T / T for T = 3: a few ulps a step.
      EXPECT_LT(MaxRelDiff(single->model(), split->model()), 2e-5);
      auto fresh = Make(1, opt, 25, NetToSplit());
      EXPECT_GT(MaxRelDiff(single->model(), fresh->model()), 1e-3) << "training moved the weights";
      for (int r = 1; r < t; ++r) EXPECT_TRUE(Bitwise(split->model(0), split->model(r))) << r;
    }
  }
}

// Both convs split by rows (the stem and a mid conv, their halos at the
// member boundary) beside a column fc1: the whole model trains as unsplit.
TEST(TensorParallel, SpatiallySplitModelTrainsAsTheUnsplitOne) {
  const std::map<std::string, TensorSplit> splits = {{"conv1", TensorSplit::kSpatial},
                                                     {"conv2", TensorSplit::kSpatial},
                                                     {"fc1", TensorSplit::kColumn}};
  for (int t : {2, 3}) {
    SCOPED_TRACE("T=" + std::to_string(t));
    auto single = Make(1, "sgd", 25, NetToSplit());
    auto split = Make(t, "sgd", 0.002, NetToSplit(), false, t, splits);
    EXPECT_LT(MaxRelDiff(single->model(), split->model()), 1e-7) << "the same initial values";
    for (int step = 0; step < 4; ++step) {
      const std::vector<Data> batch = {Batch(12, 700 + step)};
      TrainStep(*single, batch, step);
      TrainStep(*split, batch, step);
    }
    EXPECT_LT(MaxRelDiff(single->model(), split->model()), 2e-5);
    auto fresh = Make(1, "sgd", 25, NetToSplit());
    EXPECT_GT(MaxRelDiff(single->model(), fresh->model()), 1e-3) << "training moved the weights";
    for (int r = 1; r < t; ++r) EXPECT_TRUE(Bitwise(split->model(0), split->model(r))) << r;
  }
}

// DP x TP: 2 data-parallel replicas of 2 members each == 2 replicas == 1
// replica of the whole batch; accumulation included.
TEST(TensorParallel, DataTimesTensorParallelEqualsDataParallel) {
  auto dp = Make(2, "sgd", 0.002, NetToSplit());
  auto dptp = Make(4, "sgd", 0.002, NetToSplit(), false, 2, kSplits);
  EXPECT_EQ(dptp->data_parallel(), 2);
  for (int step = 0; step < 3; ++step) {
    const Data whole = Batch(12, 600 + step);
    Data a, b;
    a.x = whole.x.Slice(0, 8);
    b.x = whole.x.Slice(8, 12);
    a.labels.assign(whole.labels.begin(), whole.labels.begin() + 8);
    b.labels.assign(whole.labels.begin() + 8, whole.labels.end());
    a.ids.assign(whole.ids.begin(), whole.ids.begin() + 8);
    b.ids.assign(whole.ids.begin() + 8, whole.ids.end());
    TrainStep(*dp, {a, b}, step);
    TrainStep(*dptp, {a, b}, step);
  }
  EXPECT_LT(MaxRelDiff(dp->model(), dptp->model()), 2e-5);
  for (int r = 1; r < 4; ++r) EXPECT_TRUE(Bitwise(dptp->model(0), dptp->model(r))) << r;
}

// Inference through every member of group 0 gives the unsplit logits.
TEST(TensorParallel, InferEqualsTheUnsplitForward) {
  auto single = Make(1, "sgd", 25, NetToSplit());
  auto split = Make(2, "sgd", 25, NetToSplit(), false, 2, kSplits);
  const Data d = Batch(5, 700);
  ForwardContext ctx;
  ctx.training = false;
  ctx.keep_activations = false;
  const Tensor want = single->model().Forward(d.x, ctx);
  const Tensor got = split->Infer(d.x, ctx);
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got.At(i), want.At(i), 1e-5) << i;
}

TEST(TensorParallel, BadSplitsAreNamedErrors) {
  testing::ExpectContains(
      testing::ErrorOf([] { Make(3, "sgd", 25, NetToSplit(), false, 2, kSplits); }),
      {"size 2 neither divides nor is a multiple of the 3 devices"});
  // A group bigger than the devices spans processes: a plain process has one.
  testing::ExpectContains(
      testing::ErrorOf([] { Make(2, "sgd", 25, NetToSplit(), false, 4, kSplits); }),
      {"makes groups of 2 processes, but this job has 1 process(es)", "mpirun -n 2"});
  testing::ExpectContains(
      testing::ErrorOf([] {
        Make(2, "sgd", 25, NetToSplit(), false, 2, {{"conv9", TensorSplit::kColumn}});
      }),
      {"'conv9', which is not a layer of the model"});
  testing::ExpectContains(
      testing::ErrorOf([] {
        Make(2, "sgd", 25, NetToSplit(), false, 2, {{"pool1", TensorSplit::kColumn}});
      }),
      {"layer 'pool1' (maxpool2d) cannot be split"});
}

// ------------------------------------------------------------ GPU replicas
// (skipped without a GPU; see tests/ops/gpu_check.h)

// Net() with a BatchNorm after conv1 (one replica: no shard statistics).
// conv1 has no bias, as convolutions before a BN have: training-mode BN
// cancels a bias's gradient (it is 0 up to rounding), and Adam would step
// on that rounding noise, differently on each device.
std::vector<LayerSpec> NetWithBn() {
  std::vector<LayerSpec> net = Net();
  net[0].args.Set("bias", false);
  net.insert(net.begin() + 1, Spec("bn1", "batchnorm"));
  return net;
}

std::unique_ptr<ReplicaSet> MakeOnGpu(const std::string& opt, DType compute,
                                      const std::vector<LayerSpec>& net,
                                      LossScalerOptions scaler = {}, int gpus = 1) {
  DataParallelOptions o;
  o.replicas = gpus;
  for (int g = 0; g < gpus; ++g) o.devices.push_back(Device::Cuda(g));
  o.bucket_mb = 0.002;  // several buckets: reductions overlap backward
  o.compute = compute;
  o.loss_scaler = scaler;
  o.timeout_s = 20;
  return std::make_unique<ReplicaSet>(net, kInput, 7, InitScheme::kPytorchDefault,
                                      OptimizerSpec{opt, Opt(opt), {}}, o, MpiWorld::Get());
}

// Host copies of every parameter, in order.
std::vector<Tensor> HostParams(Model& m) {
  std::vector<Tensor> out;
  for (auto& p : m.NamedParameters()) out.push_back(p.param->value.To(Device::Cpu()));
  return out;
}

// The largest |a - b| of a tensor over its largest |a|, over the tensors;
// `worst`, when given, gets the index of the tensor where it is.
double MaxRelDiff(const std::vector<Tensor>& a, const std::vector<Tensor>& b,
                  size_t* worst_at = nullptr) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double scale = 1e-12;
    for (int64_t j = 0; j < a[i].numel(); ++j) scale = std::max(scale, std::fabs(a[i].At(j)));
    for (int64_t j = 0; j < a[i].numel(); ++j) {
      const double d = std::fabs(a[i].At(j) - b[i].At(j)) / scale;
      if (d > worst && worst_at) *worst_at = i;
      worst = std::max(worst, d);
    }
  }
  return worst;
}

// How far `gpu` is from `cpu` against how far training moved `cpu` from
// `initial`: the largest over the tensors of max |gpu - cpu| / max |cpu -
// initial|. Scaled by the movement, not the values: a tensor that starts at
// 0 (a BN bias) has no value scale of its own.
double DriftAgainstMovement(const std::vector<Tensor>& initial, const std::vector<Tensor>& cpu,
                            const std::vector<Tensor>& gpu, size_t* worst_at) {
  double worst = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    double moved = 1e-12, drift = 0;
    for (int64_t j = 0; j < cpu[i].numel(); ++j) {
      moved = std::max(moved, std::fabs(cpu[i].At(j) - initial[i].At(j)));
      drift = std::max(drift, std::fabs(gpu[i].At(j) - cpu[i].At(j)));
    }
    if (drift / moved > worst) *worst_at = i;
    worst = std::max(worst, drift / moved);
  }
  return worst;
}

// Issue 6: 1 GPU replica == the CPU replica after a few steps (TF32
// convolutions: float noise well under 1e-2). In bf16 the steps round
// activations and gradients to 8 bits, and rounded values tie in maxpool
// windows where the CPU's f32 ones do not (the gradient goes to another
// cell): SGD must stay within half of how far the steps moved the weights
// (0.29 measured on an H200). Adam's per-element step turns a rounded
// near-zero gradient into a full step either way (0.84 measured), so in bf16
// Adam is checked to move the weights and stay finite only.
TEST(DataParallelGPU, OneGpuReplicaTracksTheCpuReplica) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  for (const std::string opt : {"sgd", "adam"}) {
    for (DType compute : {DType::kF32, DType::kBF16}) {
      auto cpu = Make(1, opt, 25, NetWithBn());
      auto gpu = MakeOnGpu(opt, compute, NetWithBn());
      const std::vector<Tensor> initial = HostParams(cpu->model());
      for (int64_t step = 0; step < 4; ++step) {
        const std::vector<Data> batch = {Batch(16, 50 + step)};
        TrainStep(*cpu, batch, step);
        TrainStep(*gpu, batch, step);
      }
      const std::vector<Tensor> after = HostParams(cpu->model());
      const std::vector<Tensor> on_gpu = HostParams(gpu->model());
      EXPECT_GT(MaxRelDiff(initial, after), 1e-2) << opt << ": the steps moved the weights";
      EXPECT_GT(MaxRelDiff(initial, on_gpu), 1e-2) << opt << ": and on the GPU too";
      for (const Tensor& t : on_gpu) {
        for (int64_t j = 0; j < t.numel(); ++j) ASSERT_TRUE(std::isfinite(t.At(j))) << opt;
      }
      const bool f32 = compute == DType::kF32;
      if (!f32 && opt == "adam") continue;
      size_t worst = 0;
      const double drift = f32 ? MaxRelDiff(after, on_gpu, &worst)
                               : DriftAgainstMovement(initial, after, on_gpu, &worst);
      const std::string what = StrCat(opt, " ", DTypeName(compute),
                                      ", worst: ", cpu->model().NamedParameters()[worst].name);
      std::cout << what << ": " << drift << "\n";
      EXPECT_LT(drift, f32 ? 3e-3 : 0.5) << what;
      // BN running statistics came along too (running_mean, against its values).
      EXPECT_LT(MaxRelDiff({cpu->model().FindLayer("bn1")->buffers()[0].value},
                           {gpu->model().FindLayer("bn1")->buffers()[0].value.To(Device::Cpu())}),
                f32 ? 3e-3 : 5e-2)
          << what;
    }
  }
}

// fp16's dynamic loss scaling: a scale that overflows f16 makes every step's
// gradients inf, so each step is skipped (weights unchanged) and the scale
// halved; a sane scale trains.
TEST(DataParallelGPU, Fp16LossScalerSkipsOverflowingStepsAndBacksOff) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  LossScalerOptions huge;
  huge.init_scale = std::ldexp(1.0, 100);
  auto gpu = MakeOnGpu("sgd", DType::kF16, Net(), huge);
  const std::vector<Tensor> initial = HostParams(gpu->model());
  for (int64_t step = 0; step < 3; ++step) TrainStep(*gpu, {Batch(16, 70 + step)}, step);
  EXPECT_EQ(gpu->counters(0).steps, 3);
  EXPECT_EQ(gpu->counters(0).skipped_steps, 3);
  EXPECT_EQ(gpu->loss_scale(0), std::ldexp(1.0, 97));
  EXPECT_EQ(MaxRelDiff(initial, HostParams(gpu->model())), 0.0);

  // PyTorch's default start (2^16) may overflow a step or two, as there.
  auto sane = MakeOnGpu("sgd", DType::kF16, Net());
  for (int64_t step = 0; step < 6; ++step) TrainStep(*sane, {Batch(16, 70 + step)}, step);
  const int64_t skipped = sane->counters(0).skipped_steps;
  EXPECT_LT(skipped, 3);
  EXPECT_EQ(sane->loss_scale(0), std::ldexp(65536.0, -static_cast<int>(skipped)));
  EXPECT_GT(MaxRelDiff(initial, HostParams(sane->model())), 1e-3);
}

// Two GPUs in one process (NCCL between them) == one GPU on the whole batch.
TEST(DataParallelGPU, TwoGpusInOneProcessEqualOneGpuOnTheWholeBatch) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs, found " << CudaDeviceCount();
  auto one = MakeOnGpu("sgd", DType::kF32, Net());
  auto two = MakeOnGpu("sgd", DType::kF32, Net(), {}, 2);
  EXPECT_GT(two->buckets().size(), 1u);
  for (int64_t step = 0; step < 4; ++step) {
    const std::vector<Data> batch = {Batch(16, 90 + step)};
    TrainStep(*one, batch, step);
    TrainStep(*two, batch, step);
  }
  EXPECT_LT(MaxRelDiff(HostParams(one->model()), HostParams(two->model(0))), 3e-3);
  // The replicas stay identical: the same reduced gradients, the same step.
  EXPECT_EQ(MaxRelDiff(HostParams(two->model(0)), HostParams(two->model(1))), 0.0);
}

}  // namespace
}  // namespace cnnflow
