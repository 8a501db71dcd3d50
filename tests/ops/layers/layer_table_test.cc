// Every registered layer type, checked in one table (after ggml's
// tests/test-backend-ops.cpp). Each row is a layer type, its parameters and
// its input sample shapes; every row runs every check:
//   GradientF64   backward against central differences, in f64;
//   F32MatchesF64 the f32 kernels (the fast paths) against the same layer in
//                 f64 on the same values: output, input and parameter
//                 gradients, relative to each tensor's largest value;
//   GPU           the CUDA class against the CPU one (skipped without a GPU).
// ONNX export is checked by tests/cli/export_onnx_test.sh: small networks
// that use every exportable type, trained and exported, and the library
// networks of tests/data/library exported with PyTorch's weights, run by
// onnxruntime (this binary links no ONNX).
//
// How to add a layer type: add rows to MakeCases() in tests/ops/layers/layer_table.cc (a few small
// shapes, each option that changes the kernel). EveryLayerTypeHasARow fails until a registered type
// has one.
#include "tests/ops/layers/layer_table.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "ops/device.h"
#include "tests/ops/gpu_check.h"
#include "tests/ops/gradient_check.h"

namespace cnnflow::testing {
namespace {

// max |a - b| / max(max |ref|, floor): scale-free, so one tolerance fits
// every row.
double RelError(const Tensor& ref, const Tensor& got, double floor = 1e-3) {
  const Tensor g = got.To(Device::Cpu());
  EXPECT_EQ(ref.shape(), g.shape());
  double diff = 0, scale = floor;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    diff = std::max(diff, std::abs(ref.At(i) - g.At(i)));
    scale = std::max(scale, std::abs(ref.At(i)));
  }
  return diff / scale;
}

class LayerTable : public ::testing::TestWithParam<LayerCase> {};

TEST_P(LayerTable, GradientF64) {
  const LayerCase& c = GetParam();
  if (!c.grad_check) GTEST_SKIP() << c.Label() << ": " << c.why_no_grad_check;
  LayerRun run(c, DType::kF64, Device::Cpu());
  GradCheckOptions opt;
  opt.ctx = c.Context();
  opt.rel_tol = c.grad_rel_tol;
  opt.abs_tol = c.grad_abs_tol;
  CheckGradients(run.layer(), run.inputs(), run.output_shape(), opt);
}

TEST_P(LayerTable, F32MatchesF64) {
  const LayerCase& c = GetParam();
  LayerRun ref(c, DType::kF64, Device::Cpu());
  LayerRun f32(c, DType::kF32, Device::Cpu(), &ref);
  ref.ForwardBackward();
  f32.ForwardBackward();
  EXPECT_LE(RelError(ref.y(), f32.y()), c.f32_tol) << c.Label() << " output";
  for (size_t k = 0; k < ref.dx().size(); ++k)
    EXPECT_LE(RelError(ref.dx()[k], f32.dx()[k]), c.f32_tol) << c.Label() << " input " << k;
  auto& pr = ref.layer().parameters();
  auto& pf = f32.layer().parameters();
  ASSERT_EQ(pr.size(), pf.size());
  for (size_t k = 0; k < pr.size(); ++k)
    EXPECT_LE(RelError(pr[k].grad, pf[k].grad), c.f32_tol) << c.Label() << " grad " << pr[k].name;
}

TEST_P(LayerTable, GPUMatchesCpu) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const LayerCase& c = GetParam();
  LayerRun cpu(c, DType::kF32, Device::Cpu());
  LayerRun gpu(c, DType::kF32, Device::Cuda(0), &cpu);
  cpu.ForwardBackward();
  gpu.ForwardBackward();
  EXPECT_LE(RelError(cpu.y(), gpu.y()), c.gpu_tol) << c.Label() << " output";
  for (size_t k = 0; k < cpu.dx().size(); ++k)
    EXPECT_LE(RelError(cpu.dx()[k], gpu.dx()[k]), c.gpu_tol) << c.Label() << " input " << k;
  auto& pc = cpu.layer().parameters();
  auto& pg = gpu.layer().parameters();
  for (size_t k = 0; k < pc.size(); ++k)
    EXPECT_LE(RelError(pc[k].grad, pg[k].grad), c.gpu_tol) << c.Label() << " grad " << pc[k].name;
}

INSTANTIATE_TEST_SUITE_P(Rows, LayerTable, ::testing::ValuesIn(LayerCases()),
                         [](const ::testing::TestParamInfo<LayerCase>& info) {
                           return info.param.TestName(info.index);
                         });

TEST(LayerTableCoverage, EveryLayerTypeHasARow) {
  std::set<std::string> covered;
  for (const LayerCase& c : LayerCases()) covered.insert(c.type);
  for (const std::string& type : LayerRegistry::Get().Names())
    EXPECT_TRUE(covered.count(type))
        << "layer type '" << type << "' has no row in tests/ops/layers/layer_table.cc";
}

}  // namespace
}  // namespace cnnflow::testing
