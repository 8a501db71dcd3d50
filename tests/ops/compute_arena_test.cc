// cpu::MakeComputeArena: every task of the arena (nested parallel loops, a
// flow graph's nodes, another compute arena inside) treats denormals as
// zero where it flushes them, whatever the calling thread's settings, and
// leaves the calling thread's settings as they were.
#include <gtest/gtest.h>
#include <tbb/flow_graph.h>
#include <tbb/parallel_for.h>
#include <xmmintrin.h>

#include <atomic>

#include "ops/cpu/parallel.h"

namespace cnnflow::cpu {
namespace {

constexpr unsigned kFtzDaz = 0x8040;

// Whether this thread flushes denormals to zero (both MXCSR flags set).
bool FlushesDenormals() { return (_mm_getcsr() & kFtzDaz) == kFtzDaz; }

// Half of the smallest normal f32, times one: denormal under IEEE, 0 flushed.
float HalfOfTheSmallestNormal() {
  volatile float tiny = 5.9e-39f, one = 1.0f;
  return tiny * one;
}

// Runs a parallel loop, a flow graph and a nested compute arena in `arena`;
// counts the tasks whose thread flushes denormals and computes 0 for one.
struct Seen {
  std::atomic<int> tasks{0}, flushed{0}, zero{0};
  void Note() {
    ++tasks;
    if (FlushesDenormals()) ++flushed;
    if (HalfOfTheSmallestNormal() == 0.0f) ++zero;
  }
};
void RunEverywhere(tbb::task_arena& arena, tbb::task_arena& nested, Seen& seen) {
  arena.execute([&] {
    seen.Note();
    tbb::parallel_for(0, 64, [&](int) { seen.Note(); });
    tbb::flow::graph g;
    tbb::flow::function_node<int, int> node(g, tbb::flow::unlimited, [&](int v) {
      seen.Note();
      tbb::parallel_for(0, 16, [&](int) { seen.Note(); });
      nested.execute([&] { tbb::parallel_for(0, 16, [&](int) { seen.Note(); }); });
      return v;
    });
    for (int i = 0; i < 8; ++i) node.try_put(i);
    g.wait_for_all();
  });
}

class ComputeArena : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = _mm_getcsr(); }
  void TearDown() override { _mm_setcsr(saved_); }
  unsigned saved_ = 0;
};

TEST_F(ComputeArena, FlushesDenormalsInEveryTaskFromAnIeeeThread) {
  _mm_setcsr(saved_ & ~kFtzDaz);
  ASSERT_NE(HalfOfTheSmallestNormal(), 0.0f);
  auto arena = MakeComputeArena(2, true), nested = MakeComputeArena(2, true);
  Seen seen;
  RunEverywhere(*arena, *nested, seen);
  EXPECT_EQ(seen.tasks, 1 + 64 + 8 * (1 + 16 + 16));
  EXPECT_EQ(seen.flushed, seen.tasks.load());
  EXPECT_EQ(seen.zero, seen.tasks.load());
  // The calling thread is as it was, and so is TBB's default arena.
  EXPECT_FALSE(FlushesDenormals());
  EXPECT_NE(HalfOfTheSmallestNormal(), 0.0f);
  std::atomic<int> flushed{0};
  tbb::parallel_for(0, 64, [&](int) { flushed += FlushesDenormals() ? 1 : 0; });
  EXPECT_EQ(flushed, 0);
}

TEST_F(ComputeArena, KeepsIeeeUnderflowFromAFlushingThreadWhenTold) {
  _mm_setcsr(saved_ | kFtzDaz);
  ASSERT_EQ(HalfOfTheSmallestNormal(), 0.0f);
  auto arena = MakeComputeArena(2, false), nested = MakeComputeArena(2, false);
  Seen seen;
  RunEverywhere(*arena, *nested, seen);
  EXPECT_EQ(seen.flushed, 0);
  EXPECT_EQ(seen.zero, 0);
  EXPECT_TRUE(FlushesDenormals());
}

}  // namespace
}  // namespace cnnflow::cpu
