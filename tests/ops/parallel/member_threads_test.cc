#include "ops/parallel/member_threads.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ops/collectives/collective.h"
#include "tests/testing/helpers.h"

namespace cnnflow {
namespace {

// Every member runs at once (a barrier among them would time out
// otherwise), each call on the same threads as the last.
TEST(MemberThreads, RunsEveryMemberAtOnceOnTheSameThreads) {
  MemberThreads threads(3);
  LocalGroup group(3, /*timeout_s=*/10, "members");
  std::vector<std::set<std::thread::id>> ids(3);
  for (int call = 0; call < 20; ++call) {
    std::vector<int> ran(3, 0);
    threads.Run([&](int m) {
      group.Barrier(m, "together");
      ids[m].insert(std::this_thread::get_id());
      ++ran[m];
    });
    EXPECT_EQ(ran, std::vector<int>({1, 1, 1})) << "call " << call;
  }
  EXPECT_EQ(*ids[0].begin(), std::this_thread::get_id());  // member 0: the caller
  for (int m = 0; m < 3; ++m) EXPECT_EQ(ids[m].size(), 1u) << "member " << m;
  EXPECT_NE(*ids[1].begin(), *ids[2].begin());
}

// A failing member: on_error runs on its thread (here it aborts the group,
// releasing the others from their barrier at once, not at the timeout),
// and Run rethrows the lowest member's error; the threads go on serving.
TEST(MemberThreads, AFailingMemberReleasesTheOthersAndIsRethrown) {
  MemberThreads threads(3);
  LocalGroup group(3, /*timeout_s=*/60, "members");
  std::atomic<int> aborted{0};
  const std::string what = testing::ErrorOf([&] {
    threads.Run(
        [&](int m) {
          if (m == 2) throw std::runtime_error("member 2 broke");
          group.Barrier(m, "never complete");
        },
        [&](int member, const char* e) {
          ++aborted;
          group.Abort(std::string("member ") + std::to_string(member) + ": " + e);
        });
  });
  // Members 0 and 1 failed too (aborted), so the first error is member 0's.
  testing::ExpectContains(what, {"never complete", "member 2: member 2 broke"});
  EXPECT_EQ(aborted.load(), 3);
  std::atomic<int> sum{0};
  threads.Run([&](int m) { sum += m + 1; });
  EXPECT_EQ(sum.load(), 6);
}

}  // namespace
}  // namespace cnnflow
