// The one reduction tree over logical replicas: the segments a process sums,
// the split of G over processes, and the cross-process schedule, run here by
// hand for every split of up to 9 leaves and compared bit for bit with the
// tree-order sum written out independently (tests/testing/collective_data.h).
#include "ops/collectives/reduction_tree.h"

#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "ops/collectives/collective.h"
#include "ops/error.h"
#include "tests/testing/collective_data.h"

namespace cnnflow {
namespace {

using testing::RandomData;
using testing::TreeOrderSum;

std::vector<LeafRange> Ranges(std::initializer_list<std::pair<int, int>> v) {
  std::vector<LeafRange> out;
  for (const auto& [b, e] : v) out.push_back({b, e});
  return out;
}

TEST(ReductionTree, SegmentsAreTheMaximalCompleteSubtreesInARange) {
  EXPECT_EQ(TreeSegments({0, 3}, 8), Ranges({{0, 2}, {2, 3}}));
  EXPECT_EQ(TreeSegments({3, 6}, 8), Ranges({{3, 4}, {4, 6}}));
  EXPECT_EQ(TreeSegments({6, 8}, 8), Ranges({{6, 8}}));
  EXPECT_EQ(TreeSegments({0, 8}, 8), Ranges({{0, 8}}));
  EXPECT_EQ(TreeSegments({0, 6}, 6), Ranges({{0, 6}}));  // the whole clipped tree
  EXPECT_EQ(TreeSegments({4, 6}, 6), Ranges({{4, 6}}));
  EXPECT_EQ(TreeSegments({4, 7}, 7), Ranges({{4, 7}}));  // [4, 8) clipped to 7
  EXPECT_EQ(TreeSegments({1, 7}, 8), Ranges({{1, 2}, {2, 4}, {4, 6}, {6, 7}}));
  EXPECT_EQ(TreeSegments({2, 2}, 8), Ranges({}));
  EXPECT_THROW(TreeSegments({6, 9}, 8), Error);
}

TEST(ReductionTree, ProcessesTakeContiguousNearlyEqualShares) {
  EXPECT_EQ(ProcessLeaves(0, 3, 8), (LeafRange{0, 3}));
  EXPECT_EQ(ProcessLeaves(1, 3, 8), (LeafRange{3, 6}));
  EXPECT_EQ(ProcessLeaves(2, 3, 8), (LeafRange{6, 8}));
  EXPECT_EQ(ProcessLeaves(3, 4, 8), (LeafRange{6, 8}));
  EXPECT_EQ(ProcessLeaves(0, 1, 5), (LeafRange{0, 5}));
  EXPECT_EQ(ProcessLeaves(4, 5, 5), (LeafRange{4, 5}));
}

// Runs every process's PlanTreeAllReduce schedule over in-memory buffers,
// messages delivered round by round as MPI would, and returns each
// process's partial 0 afterwards.
std::vector<std::vector<float>> RunSchedules(const std::vector<LeafRange>& procs,
                                             const std::vector<std::vector<float>>& leaves) {
  const int nproc = static_cast<int>(procs.size());
  const int G = procs.back().end;
  std::vector<std::vector<std::vector<float>>> partials(nproc);
  std::vector<TreeSchedule> plans;
  for (int p = 0; p < nproc; ++p) {
    plans.push_back(PlanTreeAllReduce(procs, p));
    for (const LeafRange& seg : TreeSegments(procs[p], G)) {
      std::vector<std::vector<float>> in(leaves.begin() + seg.begin, leaves.begin() + seg.end);
      partials[p].push_back(TreeOrderSum(in, 0, in.size()));
    }
  }
  const size_t n = leaves[0].size();
  for (size_t round = 0; round < plans[0].reduce.size(); ++round) {
    for (int p = 0; p < nproc; ++p) {
      for (const TreeRound::Add& a : plans[p].reduce[round].local_adds) {
        for (size_t i = 0; i < n; ++i) partials[p][a.into][i] += partials[p][a.from][i];
      }
    }
    // Every receive meets exactly one send of its sender, in this round.
    std::vector<std::vector<std::vector<float>>> sent(nproc);
    std::vector<std::vector<int>> sent_to(nproc);
    for (int p = 0; p < nproc; ++p) {
      for (const TreeRound::Send& s : plans[p].reduce[round].sends) {
        sent[p].push_back(partials[p][s.partial]);
        sent_to[p].push_back(s.to);
      }
    }
    for (int p = 0; p < nproc; ++p) {
      for (const TreeRound::Recv& r : plans[p].reduce[round].recvs) {
        int matches = 0;
        for (size_t k = 0; k < sent_to[r.from].size(); ++k) {
          if (sent_to[r.from][k] != p) continue;
          ++matches;
          for (size_t i = 0; i < n; ++i) partials[p][r.partial][i] += sent[r.from][k][i];
        }
        EXPECT_EQ(matches, 1) << "process " << p << " receives from " << r.from;
      }
    }
  }
  for (size_t round = 0; round < plans[0].broadcast_to.size(); ++round) {
    for (int p = 0; p < nproc; ++p) {
      const int from = plans[p].broadcast_from[round];
      if (from < 0) continue;
      EXPECT_EQ(plans[from].broadcast_to[round], p);
      partials[p][0] = partials[from][0];
    }
  }
  std::vector<std::vector<float>> out;
  for (int p = 0; p < nproc; ++p) out.push_back(partials[p][0]);
  return out;
}

TEST(ReductionTree, EverySplitOfTheLeavesSumsToTheSameBits) {
  for (int G = 1; G <= 9; ++G) {
    std::vector<std::vector<float>> leaves;
    for (int k = 0; k < G; ++k) leaves.push_back(RandomData(37, 1000 + k));
    const std::vector<float> want = TreeOrderSum(leaves, 0, G);
    // Every composition of G into contiguous parts: bit k set cuts after leaf k.
    for (unsigned cuts = 0; cuts < (1u << (G - 1)); ++cuts) {
      std::vector<LeafRange> procs;
      int begin = 0;
      for (int k = 0; k < G; ++k) {
        if (k == G - 1 || (cuts >> k & 1u)) {
          procs.push_back({begin, k + 1});
          begin = k + 1;
        }
      }
      const auto got = RunSchedules(procs, leaves);
      for (size_t p = 0; p < procs.size(); ++p) {
        ASSERT_EQ(0, std::memcmp(got[p].data(), want.data(), want.size() * sizeof(float)))
            << G << " leaves, split " << cuts << ", process " << p;
      }
    }
  }
}

TEST(ReductionTree, ThreeThreeTwoSendsLessThanFourByTwoInAllButMoreFromOneProcess) {
  const int64_t count = 1 << 20;
  const TreeTraffic uneven = TreeAllReduceTraffic(Ranges({{0, 3}, {3, 6}, {6, 8}}), count);
  // [3,4) and [6,8) and [4,8) up, the total down to 2 processes.
  EXPECT_EQ(uneven.total_bytes, 5 * count * 4);
  EXPECT_EQ(uneven.max_process_bytes, 2 * count * 4);
}

// A LocalGroup placed at leaves [0, 3) of 8 hands the root step the sums of
// [0, 2) and [2, 3), in the buffers of ranks 0 and 2.
TEST(ReductionTree, LocalGroupSumsItsSegmentsForTheRootStep) {
  const int n = 3;
  LocalGroup group(n, 10.0);
  group.PlaceInTree(0, 8);
  std::vector<std::vector<float>> in, data;
  for (int r = 0; r < n; ++r) in.push_back(RandomData(1031, 50 + r));
  data = in;
  std::vector<std::vector<float>> seen;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      LocalGroup::PartialsStep step;
      if (r == 0) {
        step = [&](const std::vector<float*>& partials) {
          ASSERT_EQ(partials.size(), 2u);
          EXPECT_EQ(partials[0], data[0].data());
          EXPECT_EQ(partials[1], data[2].data());
          for (float* p : partials) seen.emplace_back(p, p + 1031);
        };
      }
      group.AllReduceSum(r, data[r].data(), 1031, "bucket 0", 1.0f, step);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0], TreeOrderSum(in, 0, 2));
  EXPECT_EQ(seen[1], in[2]);
}

}  // namespace
}  // namespace cnnflow
