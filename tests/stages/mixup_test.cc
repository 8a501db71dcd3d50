// The mixup and cutmix stages (stages/mixup.cc): rows mixed with their
// mirror row, the same draws on a second run.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "pipeline/executor.h"
#include "tests/testing/stage_test_util.h"

namespace cnnflow {
namespace {

using testing::g_captured;
using testing::Graph;
using MixupTest = testing::StageGraphTest;

// mixup: row i = lam * row i + (1 - lam) * row N-1-i, target lam of its
// label and the rest of row N-1-i's; the same draws on a second run (keyed
// by the batch's position); cutmix: a box of row N-1-i, lam the area kept.
TEST_F(MixupTest, MixupAndCutmixMixRowsWithTheirMirrorAndSayHowMuch) {
  for (const char* type : {"mixup", "cutmix"}) {
    SCOPED_TRACE(type);
    std::vector<std::vector<BatchMessage>> runs;
    for (int again = 0; again < 2; ++again) {
      g_captured.clear();
      run.seed = 5;
      RunGraph(Graph(StrCat("train:\n  nodes:\n    sample: {stage: sampler, batch: 5}\n"
                            "    load: {stage: load_batch}\n    mix: {stage: ",
                            type,
                            ", alpha: 1.0}\n    keep: {stage: test_capture}\n"
                            "  edges: [sample -> load -> mix -> keep]\n")),
               run, *pass);
      runs.push_back(g_captured);
    }
    ASSERT_EQ(runs[0].size(), 40u);
    std::set<float> lams;
    for (size_t b = 0; b < runs[0].size(); ++b) {
      const BatchMessage& m = runs[0][b];
      const int64_t n = static_cast<int64_t>(m.labels.size());
      ASSERT_EQ(static_cast<int64_t>(m.mix_labels.size()), n);
      const float lam = m.mix_weights[0];
      lams.insert(lam);
      EXPECT_EQ(runs[1][b].mix_weights, m.mix_weights) << "the second run drew differently";
      for (int64_t i = 0; i < n; ++i) {
        const int64_t j = n - 1 - i;
        EXPECT_EQ(m.mix_labels[i], m.labels[j]);
        EXPECT_FLOAT_EQ(m.mix_weights[i], i == j ? 1.0f : lam);
        // JitterDataset's sample `index` holds 4 copies of its index.
        const double vi = static_cast<double>(m.sample_ids[i]);
        const double vj = static_cast<double>(m.sample_ids[j]);
        int64_t from_j = 0;
        for (int e = 0; e < 4; ++e) {
          const double got = m.inputs.At(i * 4 + e);
          if (std::string(type) == "mixup") {
            EXPECT_NEAR(got, lam * vi + (1 - lam) * vj, 1e-4) << "batch " << b << " row " << i;
          } else {
            EXPECT_TRUE(got == vi || got == vj) << got;
            from_j += got == vj && vi != vj;
          }
        }
        if (std::string(type) == "cutmix" && i != j) {
          EXPECT_NEAR(1.0 - from_j / 4.0, lam, 1e-6) << "lam is not the area kept";
        }
      }
    }
    EXPECT_GT(lams.size(), 3u) << "lam is not drawn per batch";
  }
}

}  // namespace
}  // namespace cnnflow
