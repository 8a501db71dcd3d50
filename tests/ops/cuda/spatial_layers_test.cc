// The half-precision (f16/bf16 mixed precision) kernels of upsample,
// adaptive_avgpool2d and drop_path against the CPU (gpu_check.h's
// CompareWithCpu); the layer table checks their f32 CUDA classes, and
// conv_transpose2d's (f32 only). Written without a GPU at hand: they skip
// without one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"

namespace cnnflow {
namespace {

using namespace ::cnnflow::testing;

class SpatialHalfGPU : public ::testing::TestWithParam<DType> {};

TEST_P(SpatialHalfGPU, PoolUpsampleAndDropPath) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const auto c =
      CompareWithCpu({Spec("up", "upsample", {{"scale", 2.0}, {"mode", std::string("bilinear")}}),
                      Spec("pool", "adaptive_avgpool2d", {{"out", std::vector<int64_t>{3, 5}}}),
                      Spec("drop", "drop_path", {{"p", 0.3}})},
                     Shape{2, 4, 5}, 8, true, 5, GetParam());
  EXPECT_LE(c.output, 2e-2) << Describe(c);
  EXPECT_LE(c.input_grad, 2e-2) << Describe(c);
}

INSTANTIATE_TEST_SUITE_P(MixedPrecision, SpatialHalfGPU,
                         ::testing::Values(DType::kF16, DType::kBF16),
                         [](const auto& info) { return std::string(DTypeName(info.param)); });

}  // namespace
}  // namespace cnnflow
