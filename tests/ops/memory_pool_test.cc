// The caching pool's reservations (ops/device.h), which keep the blocks a
// CUDA graph replays into from being handed to anyone else. The logic is
// the same for every device, so a pool of host memory tests it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <thread>
#include <vector>

#include "ops/device.h"
#include "ops/error.h"

namespace cnnflow {
namespace {

// Host memory from aligned_alloc, freed with the pool.
class MallocPool final : public CachingPool {
 public:
  ~MallocPool() override {
    for (void* p : raw_) std::free(p);
  }
  int raw_allocations() const { return static_cast<int>(raw_.size()); }

 protected:
  void* RawAllocate(size_t bytes) override {
    raw_.push_back(std::aligned_alloc(kAlignment, bytes));
    return raw_.back();
  }
  std::string name() const override { return "test"; }

 private:
  std::vector<void*> raw_;
};

constexpr size_t kBytes = 4096;

TEST(MemoryPool, AReservationKeepsTheBlocksInUseWhenItBeganAsideUntilItEnds) {
  MallocPool pool;
  void* a = pool.Allocate(kBytes);
  const int id = pool.Reserve();
  pool.Release(a, kBytes);
  EXPECT_EQ(pool.bytes_kept_aside(), kBytes);
  void* b = pool.Allocate(kBytes);
  EXPECT_NE(b, a) << "a block a graph may replay into was handed out again";
  pool.Unreserve(id);
  EXPECT_EQ(pool.bytes_kept_aside(), 0u);
  void* c = pool.Allocate(kBytes);
  EXPECT_EQ(c, a) << "the block should be free again once the reservation ended";
  pool.Release(b, kBytes);
  pool.Release(c, kBytes);
}

TEST(MemoryPool, BlocksFreeBeforeAReservationStayFreeForEveryone) {
  MallocPool pool;
  void* a = pool.Allocate(kBytes);
  pool.Release(a, kBytes);
  const int id = pool.Reserve();
  void* b = pool.Allocate(kBytes);
  EXPECT_EQ(b, a);
  pool.Release(b, kBytes);
  EXPECT_EQ(pool.bytes_kept_aside(), 0u);
  pool.Unreserve(id);
}

TEST(MemoryPool, TheCapturingThreadsBlocksJoinAndReuseWhatTheCaptureFreed) {
  MallocPool pool;
  const int id = pool.Reserve();
  void* b = nullptr;
  {
    const MemoryPool::CaptureScope capture(pool, id);
    b = pool.Allocate(kBytes);
    pool.Release(b, kBytes);  // freed in the captured work: kept, and served again to it
    EXPECT_EQ(pool.bytes_kept_aside(), kBytes);
    void* c = pool.Allocate(kBytes);
    EXPECT_EQ(c, b);
    EXPECT_EQ(pool.bytes_kept_aside(), 0u);
    pool.Release(c, kBytes);
  }
  // After the capture the block belongs to the graph: nobody else gets it.
  void* d = pool.Allocate(kBytes);
  EXPECT_NE(d, b);
  pool.Release(d, kBytes);
  EXPECT_EQ(pool.bytes_kept_aside(), kBytes);
  pool.Unreserve(id);
  void* e = pool.Allocate(kBytes);
  EXPECT_TRUE(e == b || e == d);
  pool.Release(e, kBytes);
}

TEST(MemoryPool, AnotherThreadsBlocksDuringACaptureAreNotReserved) {
  MallocPool pool;
  const int id = pool.Reserve();
  void* other = nullptr;
  {
    const MemoryPool::CaptureScope capture(pool, id);
    std::thread([&] {
      other = pool.Allocate(kBytes);  // a loader staging its next batch, say
      pool.Release(other, kBytes);
    }).join();
  }
  EXPECT_EQ(pool.bytes_kept_aside(), 0u);
  void* again = pool.Allocate(kBytes);
  EXPECT_EQ(again, other);
  pool.Release(again, kBytes);
  pool.Unreserve(id);
}

TEST(MemoryPool, EndingAReservationLeavesItsBlocksInUseToTheirHolders) {
  MallocPool pool;
  void* a = pool.Allocate(kBytes);
  const int id = pool.Reserve();
  pool.Unreserve(id);
  pool.Release(a, kBytes);  // no longer anybody's: free for all
  EXPECT_EQ(pool.bytes_kept_aside(), 0u);
  void* b = pool.Allocate(kBytes);
  EXPECT_EQ(b, a);
  pool.Release(b, kBytes);
  EXPECT_EQ(pool.raw_allocations(), 1);
}

TEST(MemoryPool, OneCaptureAtATimeAndOnlyForAReservationThatExists) {
  MallocPool pool;
  EXPECT_THROW({ const MemoryPool::CaptureScope scope(pool, 7); }, Error);
  const int id = pool.Reserve();
  const MemoryPool::CaptureScope capture(pool, id);
  EXPECT_THROW({ const MemoryPool::CaptureScope again(pool, id); }, Error);
}

}  // namespace
}  // namespace cnnflow
