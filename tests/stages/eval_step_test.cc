// eval_step's test-time augmentation (stages/eval_step.cc): a linear model
// (flatten, linear without bias), so the loss of the averaged logits can be
// computed here in f64 from views built independently (numpy.pad 'reflect'
// on a padded copy, then a crop), for none, flip and flip_translate.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "ops/model.h"
#include "pipeline/executor.h"
#include "tests/testing/helpers.h"
#include "tests/testing/stage_test_util.h"

namespace cnnflow {
namespace {

using testing::g_captured;
using testing::Graph;

constexpr int kC = 2, kH = 3, kW = 4, kClasses = 5;

// Sample i: pixels that differ everywhere, so every view is another image.
class VaryingImages : public Dataset {
 public:
  int64_t size() const override { return 14; }
  Shape sample_shape() const override { return {kC, kH, kW}; }
  int num_classes() const override { return kClasses; }
  ReadResult Read(int64_t index, const ReadContext&, float* dst) const override {
    for (int j = 0; j < kC * kH * kW; ++j) dst[j] = static_cast<float>(Pixel(index, j));
    return {index % kClasses, ""};
  }
  std::string Key(int64_t index) const override { return StrCat("v", index); }
  std::string description() const override { return "varying"; }
  static double Pixel(int64_t index, int j) {
    return std::sin(0.7 * index + 1.3 * j + 0.1 * j * j);
  }
};

// The view by its definition: reflect-pad the image by 1 on every side,
// take the window starting at (1 - shift, 1 - shift), then mirror.
std::vector<double> View(int64_t index, int shift, bool flip) {
  constexpr int kPh = kH + 2, kPw = kW + 2;
  std::vector<double> padded(kC * kPh * kPw), out(kC * kH * kW);
  auto reflect = [](int i, int n) { return i < 0 ? -i : (i >= n ? 2 * n - 2 - i : i); };
  for (int c = 0; c < kC; ++c)
    for (int y = 0; y < kPh; ++y)
      for (int x = 0; x < kPw; ++x)
        padded[(c * kPh + y) * kPw + x] =
            VaryingImages::Pixel(index, (c * kH + reflect(y - 1, kH)) * kW + reflect(x - 1, kW));
  for (int c = 0; c < kC; ++c)
    for (int y = 0; y < kH; ++y)
      for (int x = 0; x < kW; ++x) {
        const int px = flip ? kW - 1 - x : x;
        out[(c * kH + y) * kW + x] = padded[(c * kPh + y + 1 - shift) * kPw + px + 1 - shift];
      }
  return out;
}

struct ViewWeight {
  int shift;
  bool flip;
  double weight;
};

// The mean cross-entropy of the batch's rows, logits averaged over views.
double ReferenceLoss(const BatchMessage& m, const Tensor& weight,
                     const std::vector<ViewWeight>& views) {
  double sum = 0;
  for (size_t r = 0; r < m.sample_ids.size(); ++r) {
    std::vector<double> logits(kClasses, 0.0);
    for (const ViewWeight& v : views) {
      const std::vector<double> x = View(m.sample_ids[r], v.shift, v.flip);
      for (int k = 0; k < kClasses; ++k)
        for (size_t j = 0; j < x.size(); ++j)
          logits[k] += v.weight * weight.At(k * static_cast<int64_t>(x.size()) + j) * x[j];
    }
    double mx = logits[0], z = 0;
    for (double l : logits) mx = std::max(mx, l);
    for (double l : logits) z += std::exp(l - mx);
    sum += std::log(z) + mx - logits[m.labels[r]];
  }
  return sum / static_cast<double>(m.sample_ids.size());
}

struct EvalStepTest : testing::StageGraphTest {
  void SetUp() override {
    run.datasets["train"] = std::make_shared<VaryingImages>();
    model =
        Model::Build({testing::Spec("flatten", "flatten"),
                      testing::Spec("fc", "linear", {{"out", int64_t{kClasses}}, {"bias", false}})},
                     Shape{kC, kH, kW}, {.seed = 3});
    run.model = model.get();
    pass->pass = "eval";
  }
  // The captured batches of an evaluation with `tta`, 4 rows each, two at a time.
  std::vector<BatchMessage> Run(const std::string& tta) {
    g_captured.clear();
    RunGraph(
        Graph(StrCat("train:\n  nodes:\n    sample: {stage: sampler, batch: 4, shuffle: false}\n"
                     "    load: {stage: load_batch}\n"
                     "    step: {stage: eval_step, micro_batch: 2, tta: ",
                     tta, "}\n    keep: {stage: test_capture}\n",
                     "  edges: [sample -> load -> step -> keep]\n")),
        run, *pass);
    return g_captured;
  }
  std::unique_ptr<Model> model;
};

TEST_F(EvalStepTest, TtaAveragesTheLogitsOfFlippedAndTranslatedViews) {
  const Tensor& w = model->FindLayer("fc")->parameters()[0].value;
  const std::vector<std::pair<std::string, std::vector<ViewWeight>>> cases = {
      {"none", {{0, false, 1}}},
      {"flip", {{0, false, 0.5}, {0, true, 0.5}}},
      {"flip_translate",
       {{0, false, 0.25},
        {0, true, 0.25},
        {1, false, 0.125},
        {1, true, 0.125},
        {-1, false, 0.125},
        {-1, true, 0.125}}}};
  std::vector<double> first_batch;
  for (const auto& [tta, views] : cases) {
    SCOPED_TRACE(tta);
    const std::vector<BatchMessage> batches = Run(tta);
    ASSERT_EQ(batches.size(), 4u);  // 14 samples, batches of 4
    for (const BatchMessage& m : batches) {
      const double want = ReferenceLoss(m, w, views);
      EXPECT_NEAR(m.loss, want, 1e-5 * (1 + std::abs(want))) << "batch " << m.index;
    }
    first_batch.push_back(batches[0].loss);
  }
  // The views change the answer: each mode is another loss.
  EXPECT_GT(std::abs(first_batch[1] - first_batch[0]), 1e-3);
  EXPECT_GT(std::abs(first_batch[2] - first_batch[1]), 1e-3);
}

}  // namespace
}  // namespace cnnflow
