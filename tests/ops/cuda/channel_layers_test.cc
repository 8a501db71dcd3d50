// The CUDA classes of issue 29's layers (concat, mul, layer_scale,
// channel_linear, layernorm, groupnorm) against the CPU, in f32, through
// small models (gpu_check.h's CompareWithCpu). GPU tests skip without a GPU.
#include <gtest/gtest.h>

#include "tests/ops/cuda/util.h"
#include "tests/ops/gpu_check.h"

namespace cnnflow {
namespace {

using namespace ::cnnflow::testing;

void ExpectMatches(const std::vector<LayerSpec>& specs, const Shape& sample, double tol) {
  const auto c = CompareWithCpu(specs, sample, 5);
  EXPECT_LE(c.output, tol) << Describe(c);
  EXPECT_LE(c.input_grad, tol) << Describe(c);
  EXPECT_LE(c.param_grad, tol) << Describe(c);
}

TEST(ConcatGPU, ThreeInputsMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ExpectMatches({Spec("a", "conv2d", {{"out", int64_t{3}}, {"kernel", int64_t{1}}}),
                 Spec("b", "conv2d", {{"out", int64_t{2}}, {"kernel", int64_t{1}}}, {"input"}),
                 Spec("cat", "concat", {}, {"a", "input", "b"})},
                Shape{4, 5, 6}, 1e-5);
}

TEST(MulGPU, GateAndScaleMatchCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ExpectMatches({Spec("gap", "global_avgpool"), Spec("fc", "linear", {{"out", int64_t{4}}}),
                 Spec("gate", "mul", {}, {"input", "fc"}),
                 Spec("scale", "mul", {{"scale", std::vector<double>{0.25}}})},
                Shape{4, 5, 6}, 1e-5);
}

TEST(LayerScaleGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ExpectMatches({Spec("ls", "layer_scale", {{"init", 0.5}})}, Shape{6, 7, 5}, 1e-6);
  ExpectMatches({Spec("ls", "layer_scale", {{"init", 0.5}})}, Shape{6, 9}, 1e-6);
}

TEST(ChannelLinearGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  ExpectMatches({Spec("pw", "channel_linear", {{"out", int64_t{8}}})}, Shape{6, 7, 5}, 1e-5);
  ExpectMatches({Spec("pw", "channel_linear", {{"out", int64_t{3}}, {"bias", false}})}, Shape{6, 9},
                1e-5);
}

TEST(LayerNormGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  for (const Shape& s : {Shape{6, 7, 5}, Shape{6, 9}, Shape{12}}) {
    SCOPED_TRACE(s.ToString());
    ExpectMatches({Spec("fc", "channel_linear", {{"out", int64_t{6}}}), Spec("ln", "layernorm")}, s,
                  1e-4);
  }
}

TEST(GroupNormGPU, MatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  for (const Shape& s : {Shape{6, 7, 5}, Shape{6, 9}, Shape{6}}) {
    SCOPED_TRACE(s.ToString());
    ExpectMatches({Spec("fc", "channel_linear", {{"out", int64_t{6}}}),
                   Spec("gn", "groupnorm", {{"groups", int64_t{3}}})},
                  s, 1e-4);
  }
}

}  // namespace
}  // namespace cnnflow
