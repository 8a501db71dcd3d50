// Tensor parallelism == the unsplit layer: forward, input gradient and
// weight gradients, for conv2d, conv1d and linear, column and row splits,
// and the spatial split of conv2d and conv1d (halos, strides, dilation,
// padding at the edges, depthwise), even and uneven shards; the unsplit weights round-trip exactly;
// a member that never arrives fails the others within the timeout, naming the layer.
#include "ops/parallel/tensor_parallel.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <mutex>

#include "ops/collectives/collective.h"
#include "ops/cuda/lane_group.h"
#include "ops/device_ops.h"
#include "ops/random.h"
#include "tests/ops/run_threads.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

struct Case {
  std::string type;
  Args args;
  Shape input;
};

Case Make(const std::string& type, const Shape& input,
          std::vector<std::pair<std::string, ParamValue>> params) {
  Args a;
  for (auto& [k, v] : params) a.Set(k, v);
  a.FillDefaults(LayerRegistry::Get().Find(type)->schema);
  return {type, a, input};
}

std::vector<Case> Cases() {
  return {
      Make("conv2d", Shape{7, 6, 5},
           {{"out", int64_t{5}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Make("conv2d", Shape{4, 9, 8},
           {{"out", int64_t{6}}, {"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"bias", false}}),
      Make("conv1d", Shape{7, 11},
           {{"out", int64_t{5}}, {"kernel", int64_t{3}}, {"pad", int64_t{1}}}),
      Make("linear", Shape{7}, {{"out", int64_t{5}}}),
  };
}

Tensor Random(const Shape& shape, uint64_t seed) {
  Tensor t = Tensor::Empty(shape);
  Rng rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<float>()[i] = static_cast<float>(rng.Uniform(-1, 1));
  return t;
}

// |a - b| within 1e-5 of the reference's largest magnitude (the sums run in
// another order).
void ExpectClose(const Tensor& a, const Tensor& ref, const std::string& what) {
  ASSERT_EQ(a.shape(), ref.shape()) << what;
  double scale = 1e-30, worst = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) scale = std::max(scale, std::abs(ref.At(i)));
  for (int64_t i = 0; i < ref.numel(); ++i) worst = std::max(worst, std::abs(a.At(i) - ref.At(i)));
  EXPECT_LE(worst, 1e-5 * scale) << what;
}

// On `device` (a GPU: member r in lane r of it, the members summing with
// the lanes' group; full f32 math, deterministic algorithms).
void CheckAgainstUnsplit(const Case& c, TensorSplit split, int members,
                         Device device = Device::Cpu()) {
  SCOPED_TRACE(::testing::Message() << c.type << " " << c.input << " " << TensorSplitName(split)
                                    << " over " << members << " on " << device.ToString());
  const bool gpu = device.is_cuda();
  const int64_t n = 3;
  auto full = LayerRegistry::Get().Find(c.type)->create("tp", c.args);
  const Shape out = full->Build({c.input}, DType::kF32);
  Rng rng(11);
  full->ResetParameters(rng);
  const Tensor x = Random(c.input.WithBatch(n), 1), dy = Random(out.WithBatch(n), 2);
  Tensor y = Tensor::Empty(out.WithBatch(n)), dx = Tensor::Empty(x.shape());
  full->Forward({&x}, y, ForwardContext{});
  full->Backward({&x}, y, dy, {&dx});

  std::vector<Parameter> gathered;  // on the device, written by one member at a time
  for (const Parameter& p : full->parameters()) {
    gathered.push_back({p.name, Tensor::Zeros(p.value.shape(), DType::kF32, device),
                        Tensor::Zeros(p.value.shape(), DType::kF32, device)});
  }
  SynchronizeDevice(device);  // the zeros, before other lanes write
  LocalGroup local(members, 30, "tp group");
  std::unique_ptr<Collective> lanes = gpu ? MakeLaneGroup(device.index, members, 30) : nullptr;
  Collective& group = gpu ? *lanes : local;
  std::vector<Tensor> ys(members), dxs(members);
  const auto errors = testing::RunRanks(members, [&](int r) {
    const GpuLaneScope lane(gpu ? r : 0);
    SetGpuMath(device, {.tf32 = false, .deterministic = true});
    std::vector<Parameter> unsplit;  // the member's copy of the unsplit tensors
    for (const Parameter& p : full->parameters())
      unsplit.push_back({p.name, p.value.To(device), p.grad.To(device)});
    TensorParallelShard shard("tp", c.type, c.args, c.input, split, group, r, DType::kF32, device);
    EXPECT_EQ(shard.output_shape(), out);
    shard.LoadFull(unsplit);
    Tensor y_r = Tensor::Empty(out.WithBatch(n), DType::kF32, device);
    Tensor dx_r = Tensor::Empty(x.shape(), DType::kF32, device);
    shard.Forward(x.To(device), y_r, ForwardContext{});
    shard.Backward(x.To(device), dy.To(device), &dx_r);
    ys[r] = y_r.To(Device::Cpu());
    dxs[r] = dx_r.To(Device::Cpu());
    // One member at a time: whole tensors (a spatial shard's weights, a row
    // shard's bias) are written by every member.
    static std::mutex mu;
    std::lock_guard<std::mutex> lock(mu);
    shard.StoreFull(gathered, /*grads=*/false);
    if (split == TensorSplit::kSpatial) {  // partial sums over each member's rows
      shard.AddGradsToFull(gathered, 1.0f);
    } else {
      shard.StoreFull(gathered, /*grads=*/true);
    }
    SynchronizeDevice(device);  // done before the next member writes
  });
  for (int r = 0; r < members; ++r) {
    if (errors[r]) std::rethrow_exception(errors[r]);
    ExpectClose(ys[r], y, StrCat("y of member ", r));
    ExpectClose(dxs[r], dx, StrCat("dx of member ", r));
    // Every member ends with the same tensors.
    EXPECT_EQ(std::memcmp(ys[r].data<float>(), ys[0].data<float>(), ys[0].nbytes()), 0);
    EXPECT_EQ(std::memcmp(dxs[r].data<float>(), dxs[0].data<float>(), dxs[0].nbytes()), 0);
  }
  for (size_t i = 0; i < gathered.size(); ++i) {
    const Parameter& p = full->parameters()[i];
    const Tensor value = gathered[i].value.To(Device::Cpu());
    EXPECT_EQ(std::memcmp(value.data<float>(), p.value.data<float>(), p.value.nbytes()), 0)
        << p.name << ": the unsplit weights do not round-trip";
    ExpectClose(gathered[i].grad.To(Device::Cpu()), p.grad, p.name + " gradient");
  }
}

// The halo: a window of (kernel - 1) / 2 rows a side for a "same" conv,
// more with dilation, none past the edges (the padding), and a stride
// that skips rows; the first K % T members take a row more.
std::vector<Case> SpatialCases() {
  return {
      Make("conv2d", Shape{3, 10, 6},
           {{"out", int64_t{4}},
            {"kernel", std::vector<int64_t>{5, 3}},
            {"pad", std::vector<int64_t>{2, 1}}}),
      Make("conv2d", Shape{4, 9, 8},
           {{"out", int64_t{6}}, {"kernel", int64_t{3}}, {"stride", int64_t{2}}, {"bias", false}}),
      Make("conv2d", Shape{2, 11, 5},
           {{"out", int64_t{3}},
            {"kernel", int64_t{3}},
            {"pad", int64_t{2}},
            {"dilation", int64_t{2}},
            {"stride", std::vector<int64_t>{2, 1}}}),
      Make("conv2d", Shape{4, 8, 7},  // depthwise
           {{"out", int64_t{4}},
            {"kernel", int64_t{3}},
            {"pad", int64_t{1}},
            {"groups", int64_t{4}}}),
      Make("conv1d", Shape{3, 13},
           {{"out", int64_t{5}}, {"kernel", int64_t{5}}, {"pad", int64_t{2}}}),
  };
}

TEST(TensorParallel, ShardsAreAsEvenAsTheyGo) {
  EXPECT_EQ(ShardOf(5, 0, 2).begin, 0);
  EXPECT_EQ(ShardOf(5, 0, 2).end, 3);
  EXPECT_EQ(ShardOf(5, 1, 2).begin, 3);
  EXPECT_EQ(ShardOf(5, 1, 2).end, 5);
  int64_t next = 0;
  for (int r = 0; r < 4; ++r) {
    const ShardRange s = ShardOf(7, r, 4);
    EXPECT_EQ(s.begin, next);
    EXPECT_GE(s.size(), 1);
    next = s.end;
  }
  EXPECT_EQ(next, 7);
}

TEST(TensorParallel, ColumnSplitEqualsTheUnsplitLayer) {
  for (const Case& c : Cases()) {
    for (int members : {2, 3}) CheckAgainstUnsplit(c, TensorSplit::kColumn, members);
  }
}

TEST(TensorParallel, RowSplitEqualsTheUnsplitLayer) {
  for (const Case& c : Cases()) {
    for (int members : {2, 3}) CheckAgainstUnsplit(c, TensorSplit::kRow, members);
  }
}

TEST(TensorParallel, SpatialSplitEqualsTheUnsplitLayer) {
  for (const Case& c : SpatialCases()) {
    for (int members : {2, 3, 4}) CheckAgainstUnsplit(c, TensorSplit::kSpatial, members);
  }
}

// The shards of a layer sharing one GPU, each in a lane of it, summing with
// the lanes' group (issue 60): every split as on the CPU, to 1e-5.
TEST(TensorParallelGPU, SplitsOnLanesOfOneGpuEqualTheUnsplitLayer) {
  if (!CudaAvailable()) GTEST_SKIP() << "no GPU found: GPU test skipped";
  for (int members : {2, 3}) {
    for (const Case& c : Cases()) {
      CheckAgainstUnsplit(c, TensorSplit::kColumn, members, Device::Cuda(0));
      CheckAgainstUnsplit(c, TensorSplit::kRow, members, Device::Cuda(0));
    }
    for (const Case& c : SpatialCases())
      CheckAgainstUnsplit(c, TensorSplit::kSpatial, members, Device::Cuda(0));
  }
}

TEST(TensorParallel, WhatCannotBeSplitIsAnErrorNamingTheLayer) {
  LocalGroup group(4, 5, "tp group");
  const Case small = Make("linear", Shape{3}, {{"out", int64_t{3}}});
  testing::ExpectContains(testing::ErrorOf([&] {
                            TensorParallelShard("fc9", small.type, small.args, small.input,
                                                TensorSplit::kColumn, group, 0);
                          }),
                          {"layer 'fc9' has 3 output channels: too few to split over 4 devices"});
  testing::ExpectContains(testing::ErrorOf([&] {
                            TensorParallelShard("fc9", small.type, small.args, small.input,
                                                TensorSplit::kRow, group, 0);
                          }),
                          {"layer 'fc9' has 3 input channels: too few to split over 4 devices"});
  const Case grouped = Make("conv2d", Shape{8, 5, 5},
                            {{"out", int64_t{8}}, {"kernel", int64_t{3}}, {"groups", int64_t{2}}});
  testing::ExpectContains(testing::ErrorOf([&] {
                            TensorParallelShard("conv4", grouped.type, grouped.args, grouped.input,
                                                TensorSplit::kColumn, group, 0);
                          }),
                          {"layer 'conv4' has groups: 2"});
  testing::ExpectContains(testing::ErrorOf([&] {
                            TensorParallelShard("fc9", small.type, small.args, small.input,
                                                TensorSplit::kSpatial, group, 0);
                          }),
                          {"layer 'fc9' (linear) has no rows to split"});
  const Case short_conv =
      Make("conv2d", Shape{2, 3, 9}, {{"out", int64_t{2}}, {"kernel", int64_t{3}}});
  testing::ExpectContains(testing::ErrorOf([&] {
                            TensorParallelShard("conv5", short_conv.type, short_conv.args,
                                                short_conv.input, TensorSplit::kSpatial, group, 0);
                          }),
                          {"layer 'conv5' has 1 output rows: too few to split over 4 devices"});
  Args relu_args;
  testing::ExpectContains(testing::ErrorOf([&] {
                            TensorParallelShard("r1", "relu", relu_args, Shape{4},
                                                TensorSplit::kColumn, group, 0);
                          }),
                          {"layer 'r1' (relu) cannot be split"});
}

// A member that never arrives: the others fail once the collective's
// deadline passes, naming the layer and the step of it.
TEST(TensorParallel, AMissingMemberFailsTheGatherWithinTheTimeoutNamingTheLayer) {
  const Case c = Cases()[0];
  LocalGroup group(2, /*timeout_s=*/0.5, "tp group");
  const auto begin = std::chrono::steady_clock::now();
  const auto errors = testing::RunRanks(2, [&](int r) {
    TensorParallelShard shard("conv7", c.type, c.args, c.input, TensorSplit::kColumn, group, r);
    if (r == 1) return;  // dies before its forward
    Tensor x = Random(c.input.WithBatch(2), 1),
           y = Tensor::Empty(shard.output_shape().WithBatch(2));
    shard.Forward(x, y, ForwardContext{});
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  ASSERT_TRUE(errors[0]);
  try {
    std::rethrow_exception(errors[0]);
  } catch (const CollectiveTimeout& e) {
    EXPECT_NE(std::string(e.what()).find("layer conv7 forward all-gather"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(seconds, 0.5 + 5);
}

}  // namespace
}  // namespace cnnflow
