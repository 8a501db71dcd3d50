// The CUDA classes of adaptive_avgpool2d/1d, upsample, conv_transpose2d and
// drop_path against their CPU classes (gpu_check.h's CompareWithCpu), in f32
// and, for the layers with half kernels, f16/bf16 mixed precision. Written
// without a GPU at hand: they skip without one.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"

namespace cnnflow {
namespace {

using namespace ::cnnflow::testing;

void ExpectClose(const GpuCpuComparison& c, double tol) {
  EXPECT_LE(c.output, tol) << Describe(c);
  EXPECT_LE(c.input_grad, tol) << Describe(c);
  EXPECT_LE(c.param_grad, tol) << Describe(c);
}

TEST(AdaptiveAvgPoolGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ExpectClose(CompareWithCpu({Spec("pool", "adaptive_avgpool2d",
                                   {{"out", std::vector<int64_t>{3, 2}}})},
                             Shape{3, 7, 5}, 4),
              1e-6);
  ExpectClose(CompareWithCpu({Spec("pool", "adaptive_avgpool2d", {{"out", int64_t{6}}})},
                             Shape{2, 4, 3}, 3),
              1e-6);
  ExpectClose(CompareWithCpu({Spec("pool", "adaptive_avgpool1d", {{"out", int64_t{4}}})},
                             Shape{3, 10}, 4),
              1e-6);
}

TEST(UpsampleGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ExpectClose(CompareWithCpu({Spec("up", "upsample", {{"scale", 2.0}})}, Shape{3, 4, 5}, 2), 1e-6);
  ExpectClose(CompareWithCpu({Spec("up", "upsample",
                                   {{"size", std::vector<int64_t>{7, 3}}})},
                             Shape{2, 5, 4}, 2),
              1e-6);
  ExpectClose(CompareWithCpu({Spec("up", "upsample",
                                   {{"scale", std::vector<double>{2.5, 1.5}},
                                    {"mode", std::string("bilinear")}})},
                             Shape{2, 5, 3}, 2),
              1e-5);
  ExpectClose(CompareWithCpu({Spec("up", "upsample",
                                   {{"scale", 2.0},
                                    {"mode", std::string("bilinear")},
                                    {"align_corners", true}})},
                             Shape{2, 4, 5}, 2),
              1e-5);
}

TEST(ConvTranspose2dGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ExpectClose(CompareWithCpu({Spec("deconv", "conv_transpose2d",
                                   {{"out", int64_t{6}},
                                    {"kernel", int64_t{3}},
                                    {"stride", int64_t{2}},
                                    {"pad", int64_t{1}},
                                    {"output_pad", int64_t{1}},
                                    {"groups", int64_t{2}}})},
                             Shape{4, 5, 6}, 3),
              1e-4);
  ExpectClose(CompareWithCpu({Spec("deconv", "conv_transpose2d",
                                   {{"out", int64_t{3}},
                                    {"kernel", std::vector<int64_t>{2, 3}},
                                    {"dilation", int64_t{2}},
                                    {"bias", false}})},
                             Shape{2, 4, 4}, 2),
              1e-4);
}

TEST(DropPathGPU, TrainingDecisionsAndEvalMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ExpectClose(CompareWithCpu({Spec("drop", "drop_path", {{"p", 0.5}})}, Shape{3, 4, 5}, 16), 1e-6);
  ExpectClose(
      CompareWithCpu({Spec("drop", "drop_path", {{"p", 0.5}})}, Shape{3, 4, 5}, 16, false), 0);
}

class SpatialHalfGPU : public ::testing::TestWithParam<DType> {};

TEST_P(SpatialHalfGPU, PoolUpsampleAndDropPath) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const auto c = CompareWithCpu(
      {Spec("up", "upsample", {{"scale", 2.0}, {"mode", std::string("bilinear")}}),
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
