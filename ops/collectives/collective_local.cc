// In-process collectives over shared memory (see ops/collectives/collective.h).
#include <algorithm>
#include <cstring>
#include <sstream>
#include <thread>

#include "ops/collectives/collective.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace cnnflow {
namespace {

using Clock = std::chrono::steady_clock;

// Busy-wait (pause, then yield) before blocking, for longer than waking a
// blocked thread takes: a shorter spin lets two replicas fall into a
// wake-up ping-pong, and yielding (not pausing) leaves a core busy
// elsewhere to its owner (figures: bench/results/2026-12-07-cpu-kernel-measurements.md).
constexpr auto kSpinTime = std::chrono::microseconds(50);
constexpr int64_t kCacheLine = 64;
// Elements summed at a time for N > 2 (stays in L1).
constexpr int64_t kBlock = 1024;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

const char* OpName(int op) {
  static const char* const kNames[] = {"AllReduceSum", "ReduceSum", "Broadcast", "Barrier"};
  return kNames[op];
}

// "rank 1" / "ranks 1, 3"
std::string RankList(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// [begin, end) of participant p's share of `count` elements of `esize`
// bytes, cut at cache-line boundaries so no two threads write one line.
void ChunkOf(int64_t count, int64_t esize, int p, int n, int64_t* begin, int64_t* end) {
  const int64_t align = std::max<int64_t>(1, kCacheLine / esize);
  auto cut = [&](int q) { return q >= n ? count : (count * q / n) / align * align; };
  *begin = cut(p);
  *end = cut(p + 1);
}

// The tree order of a sum (ops/collectives/reduction_tree.h): a process's
// maximal complete subtrees of the run's tree are summed here, the rest
// across processes, so the sum has the same bits however the replicas are
// spread over processes.
// out[0, m) = the tree sum of p[lo..hi)[i0, i0 + m); m <= kBlock.
void TreeSum(float* __restrict out, float* const* p, int lo, int hi, int64_t i0, int64_t m) {
  if (hi - lo == 1) {
    std::memcpy(out, p[lo] + i0, m * sizeof(float));
    return;
  }
  if (hi - lo == 2) {
    const float* __restrict x = p[lo] + i0;
    const float* __restrict y = p[lo + 1] + i0;
    for (int64_t i = 0; i < m; ++i) out[i] = x[i] + y[i];
    return;
  }
  const int mid = lo + LeftShare(hi - lo);
  TreeSum(out, p, lo, mid, i0, m);
  alignas(64) float right[kBlock];
  TreeSum(right, p, mid, hi, i0, m);
  for (int64_t i = 0; i < m; ++i) out[i] += right[i];
}

// dst[b, e) = the tree sum of p[0..n)[b, e); dst may be one of p.
void SumInto(float* dst, float* const* p, int n, int64_t b, int64_t e) {
  if (n == 1 && dst == p[0]) return;
  alignas(64) float tmp[kBlock];
  for (int64_t i0 = b; i0 < e; i0 += kBlock) {
    const int64_t m = std::min(kBlock, e - i0);
    TreeSum(tmp, p, 0, n, i0, m);
    std::memcpy(dst + i0, tmp, m * sizeof(float));
  }
}

// Every buffer's [b, e) becomes the tree sum of p[0..n)[b, e), times scale.
void SumToAll(float* const* p, int n, int64_t b, int64_t e, float scale) {
  if (n == 2) {
    float* __restrict x = p[0];
    float* __restrict y = p[1];
    if (scale == 1.0f) {
      for (int64_t i = b; i < e; ++i) {
        const float s = x[i] + y[i];
        x[i] = s;
        y[i] = s;
      }
    } else {
      for (int64_t i = b; i < e; ++i) {
        const float s = (x[i] + y[i]) * scale;
        x[i] = s;
        y[i] = s;
      }
    }
    return;
  }
  alignas(64) float tmp[kBlock];
  for (int64_t i0 = b; i0 < e; i0 += kBlock) {
    const int64_t m = std::min(kBlock, e - i0);
    TreeSum(tmp, p, 0, n, i0, m);
    if (scale != 1.0f) {
      for (int64_t i = 0; i < m; ++i) tmp[i] *= scale;
    }
    for (int r = 0; r < n; ++r) std::memcpy(p[r] + i0, tmp, m * sizeof(float));
  }
}

}  // namespace

// One collective in progress. A slot serves the collectives whose sequence
// number is congruent to its index modulo kMaxInFlight, one after another:
// `seq` says which one owns it now.
struct alignas(64) LocalGroup::Slot {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<uint64_t> seq{0};
  std::atomic<int> arrived{0};
  std::atomic<int> reduced{0};  // done with the first phase (two-phase ops)
  std::atomic<bool> step_done{false};
  std::atomic<int> departed{0};

  // Set by the first participant to arrive (under mu), read-only once all have.
  Op op = Op::kBarrier;
  int root = 0;
  int64_t count = 0;
  float scale = 1.0f;
  std::string tag;
  std::vector<void*> ptrs;
  std::vector<char> present;
  const std::function<void()>* root_step = nullptr;       // a broadcast's
  const LocalGroup::PartialsStep* reduce_step = nullptr;  // an all-reduce's
  bool two_phase() const { return root_step != nullptr || reduce_step != nullptr; }
  // Written by the root before step_done.
  bool step_failed = false;
  bool step_timeout = false;
  std::string step_error;
};

LocalGroup::LocalGroup(int size, double timeout_s, std::string name)
    : size_(size), timeout_s_(timeout_s), name_(std::move(name)) {
  if (size < 1) throw Error(StrCat(name_, ": a group needs at least 1 participant, got ", size));
  if (!(timeout_s > 0)) throw Error(StrCat(name_, ": timeout must be > 0 s, got ", timeout_s));
  slots_ = std::make_unique<Slot[]>(kMaxInFlight);
  for (int i = 0; i < kMaxInFlight; ++i) {
    slots_[i].seq.store(i);
    slots_[i].ptrs.assign(size, nullptr);
    slots_[i].present.assign(size, 0);
  }
  next_seq_ = std::make_unique<std::atomic<uint64_t>[]>(size);
  for (int r = 0; r < size; ++r) next_seq_[r].store(0);
}

LocalGroup::~LocalGroup() = default;

void LocalGroup::PlaceInTree(int first_leaf, int leaves) {
  segments_ = TreeSegments({first_leaf, first_leaf + size_}, leaves);
  first_leaf_ = first_leaf;
}

void LocalGroup::AllReduceSum(int rank, float* data, int64_t count, const std::string& tag,
                              float scale, const PartialsStep& root_step) {
  Run({Op::kAllReduce, rank, 0, data, count, scale, &tag, nullptr,
       root_step ? &root_step : nullptr});
}

void LocalGroup::AllReduceMean(int rank, float* data, int64_t count, const std::string& tag) {
  AllReduceSum(rank, data, count, tag, 1.0f / static_cast<float>(size_));
}

void LocalGroup::ReduceSum(int rank, int root, float* data, int64_t count, const std::string& tag) {
  Run({Op::kReduce, rank, root, data, count, 1.0f, &tag, nullptr, nullptr});
}

void LocalGroup::Broadcast(int rank, int root, float* data, int64_t count, const std::string& tag,
                           const std::function<void()>& root_step) {
  if (count < 0) throw Error(StrCat(name_, ": Broadcast '", tag, "': negative count ", count));
  BroadcastBytes(rank, root, data, count * static_cast<int64_t>(sizeof(float)), tag, root_step);
}

void LocalGroup::BroadcastBytes(int rank, int root, void* data, int64_t bytes,
                                const std::string& tag, const std::function<void()>& root_step) {
  Run({Op::kBroadcast, rank, root, data, bytes, 1.0f, &tag, root_step ? &root_step : nullptr,
       nullptr});
}

void LocalGroup::Barrier(int rank, const std::string& tag) {
  Run({Op::kBarrier, rank, 0, nullptr, 0, 1.0f, &tag, nullptr, nullptr});
}

void LocalGroup::Abort(const std::string& reason) { Break(false, reason); }

std::string LocalGroup::broken_reason() const {
  std::lock_guard<std::mutex> lock(broken_mu_);
  return broken_reason_;
}

uint64_t LocalGroup::issued(int rank) const {
  if (rank < 0 || rank >= size_) {
    throw Error(StrCat(name_, ": issued(", rank, "): rank out of range 0..", size_ - 1));
  }
  return next_seq_[rank].load();
}

std::string LocalGroup::Describe(const Call& call, uint64_t seq) const {
  return StrCat(name_, ": ", OpName(static_cast<int>(call.op)), " '", *call.tag, "' (collective #",
                seq, ", rank ", call.rank, " of ", size_, ")");
}

void LocalGroup::Notify(Slot& slot) {
  // Taking the mutex orders this wake-up after a waiter's check of its
  // predicate, so it cannot be lost.
  { std::lock_guard<std::mutex> lock(slot.mu); }
  slot.cv.notify_all();
}

void LocalGroup::Break(bool timeout, const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (broken_.load()) return;  // the first reason wins
    broken_by_timeout_ = timeout;
    broken_reason_ = reason;
    broken_.store(true, std::memory_order_release);
  }
  for (int i = 0; i < kMaxInFlight; ++i) Notify(slots_[i]);
}

void LocalGroup::ThrowBroken(const Call& call, uint64_t seq) const {
  bool timeout;
  std::string reason;
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    timeout = broken_by_timeout_;
    reason = broken_reason_;
  }
  const std::string msg = StrCat(Describe(call, seq), timeout ? " failed: " : " aborted: ", reason);
  if (timeout) throw CollectiveTimeout(msg);
  throw CollectiveAborted(msg);
}

template <typename Pred>
bool LocalGroup::WaitFor(Slot& slot, Pred pred, const Clock::time_point* deadline) {
  const auto spin_end = Clock::now() + kSpinTime;
  for (int i = 1;; ++i) {
    if (pred()) return true;
    if (i < 64) {
      CpuRelax();
    } else {
      // Yielding rather than pausing lets the participant we wait for run
      // when both share a core (more replicas than free cores).
      std::this_thread::yield();
      if (Clock::now() >= spin_end) break;
    }
  }
  std::unique_lock<std::mutex> lock(slot.mu);
  while (!pred()) {
    if (deadline == nullptr) {
      slot.cv.wait(lock);
    } else if (slot.cv.wait_until(lock, *deadline) == std::cv_status::timeout) {
      return pred();
    }
  }
  return true;
}

void LocalGroup::Run(const Call& call) {
  CheckCall(call);
  const uint64_t seq = next_seq_[call.rank].fetch_add(1);
  Slot& slot = slots_[seq % kMaxInFlight];
  const Deadline deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                               std::chrono::duration<double>(timeout_s_));
  TakeSlot(call, seq, slot, deadline);
  Register(call, seq, slot);
  AwaitAll(call, seq, slot, deadline);
  const StepOutcome step = Work(call, slot);
  Leave(call, seq, slot);
  if (step.failed) {
    const std::string msg = StrCat(Describe(call, seq), " failed in the root's step: ", step.error);
    if (step.timeout) throw CollectiveTimeout(msg);
    throw CollectiveAborted(msg);
  }
}

// A wrong call is a bug in the caller, reported before it can block anyone.
void LocalGroup::CheckCall(const Call& call) const {
  if (call.rank < 0 || call.rank >= size_) {
    throw Error(StrCat(name_, ": ", OpName(static_cast<int>(call.op)), " '", *call.tag, "': rank ",
                       call.rank, " out of range 0..", size_ - 1));
  }
  const uint64_t pending_seq = next_seq_[call.rank].load();  // before a number is taken
  if (call.root < 0 || call.root >= size_) {
    throw Error(
        StrCat(Describe(call, pending_seq), ": root ", call.root, " out of range 0..", size_ - 1));
  }
  if (call.count < 0 || (call.count > 0 && call.data == nullptr)) {
    throw Error(StrCat(Describe(call, pending_seq), ": bad buffer (", call.count, " elements at ",
                       call.data, ")"));
  }
  if (broken()) ThrowBroken(call, pending_seq);
}

// 1. Waits until the slot is ours: its previous collective, kMaxInFlight
// calls ago, has completed.
void LocalGroup::TakeSlot(const Call& call, uint64_t seq, Slot& slot, const Deadline& deadline) {
  if (WaitFor(
          slot, [&] { return slot.seq.load() == seq || broken(); }, &deadline) &&
      slot.seq.load() == seq) {
    return;
  }
  if (broken()) ThrowBroken(call, seq);
  std::string busy_tag;
  {
    std::lock_guard<std::mutex> lock(slot.mu);
    busy_tag = slot.tag;
  }
  const std::string msg =
      StrCat(Describe(call, seq), " timed out: could not start within ", timeout_s_,
             " s because collective #", seq - kMaxInFlight, " ('", busy_tag,
             "') is still in progress (more than ", kMaxInFlight, " collectives in flight)");
  Break(true, msg);
  throw CollectiveTimeout(msg);
}

// 2. Registers: the first to arrive describes the collective, the others
// must match it.
void LocalGroup::Register(const Call& call, uint64_t seq, Slot& slot) {
  std::unique_lock<std::mutex> lock(slot.mu);
  if (broken()) {
    lock.unlock();
    ThrowBroken(call, seq);
  }
  const int before = slot.arrived.load();
  if (before == 0) {
    slot.op = call.op;
    slot.root = call.root;
    slot.count = call.count;
    slot.scale = call.scale;
    slot.tag = *call.tag;
  } else if (std::string msg = Mismatch(call, seq, slot); !msg.empty()) {
    lock.unlock();
    Break(false, msg);
    throw CollectiveAborted(msg);
  }
  slot.ptrs[call.rank] = call.data;
  slot.present[call.rank] = 1;
  if (call.rank == call.root) {
    slot.root_step = call.root_step;
    slot.reduce_step = call.reduce_step;
  }
  if (before + 1 == size_) {
    // Overlapping buffers would make the threads race; refuse them before
    // anyone starts.
    if (std::string msg = Overlap(call, seq, slot); !msg.empty()) {
      lock.unlock();
      Break(false, msg);
      throw CollectiveAborted(msg);
    }
  }
  slot.arrived.store(before + 1);
  if (before + 1 == size_) slot.cv.notify_all();
}

std::string LocalGroup::Mismatch(const Call& call, uint64_t seq, const Slot& slot) const {
  if (slot.op == call.op && slot.root == call.root && slot.count == call.count &&
      std::memcmp(&slot.scale, &call.scale, sizeof(float)) == 0 && slot.tag == *call.tag) {
    return "";
  }
  int first = 0;
  while (!slot.present[first]) ++first;
  return StrCat(name_, ": collective #", seq, " does not match across ranks: rank ", first,
                " called ", OpName(static_cast<int>(slot.op)), " '", slot.tag, "' (count ",
                slot.count, ", root ", slot.root, ", scale ", slot.scale, ") but rank ", call.rank,
                " called ", OpName(static_cast<int>(call.op)), " '", *call.tag, "' (count ",
                call.count, ", root ", call.root, ", scale ", call.scale,
                "); every rank must issue the same collectives in the same order");
}

std::string LocalGroup::Overlap(const Call& call, uint64_t seq, const Slot& slot) const {
  if (call.op == Op::kBarrier || call.count == 0) return "";
  const int64_t esize = call.op == Op::kBroadcast ? 1 : static_cast<int64_t>(sizeof(float));
  const int64_t bytes = call.count * esize;
  for (int a = 0; a < size_; ++a) {
    for (int b = a + 1; b < size_; ++b) {
      const char* pa = static_cast<const char*>(slot.ptrs[a]);
      const char* pb = static_cast<const char*>(slot.ptrs[b]);
      if (pa < pb + bytes && pb < pa + bytes) {
        return StrCat(Describe(call, seq), ": the buffers of ranks ", a, " and ", b,
                      " overlap; every rank needs its own buffer");
      }
    }
  }
  return "";
}

// 3. Waits for everyone. Once all have arrived the collective completes even
// if the group breaks meanwhile: the others are already writing into this
// rank's buffer.
void LocalGroup::AwaitAll(const Call& call, uint64_t seq, Slot& slot, const Deadline& deadline) {
  if (WaitFor(
          slot, [&] { return slot.arrived.load() == size_ || broken(); }, &deadline) &&
      slot.arrived.load() == size_) {
    return;
  }
  std::unique_lock<std::mutex> lock(slot.mu);
  if (slot.arrived.load() == size_) return;
  if (broken()) {
    lock.unlock();
    ThrowBroken(call, seq);
  }
  std::vector<int> here, missing;
  for (int r = 0; r < size_; ++r) (slot.present[r] ? here : missing).push_back(r);
  const std::string msg =
      StrCat(name_, ": ", OpName(static_cast<int>(call.op)), " '", *call.tag, "' (collective #",
             seq, ") timed out: ", RankList(missing), " of ", size_, " did not arrive within ",
             timeout_s_, " s (arrived: ", RankList(here), ")");
  // Break under the slot's lock, so no late arrival can complete this
  // collective with the buffers of ranks that are gone.
  {
    std::lock_guard<std::mutex> blk(broken_mu_);
    if (!broken_.load()) {
      broken_by_timeout_ = true;
      broken_reason_ = msg;
      broken_.store(true, std::memory_order_release);
    }
  }
  lock.unlock();
  for (int i = 0; i < kMaxInFlight; ++i) Notify(slots_[i]);
  throw CollectiveTimeout(msg);
}

// 4. The work: phase 0, then (two-phase) the root's step and phase 1.
LocalGroup::StepOutcome LocalGroup::Work(const Call& call, Slot& slot) {
  Compute(slot, call.rank, 0);
  if (!slot.two_phase()) return {};
  if (slot.reduced.fetch_add(1) + 1 == size_) Notify(slot);
  if (call.rank == slot.root) {
    WaitFor(
        slot, [&] { return slot.reduced.load() == size_; }, nullptr);
    try {
      if (slot.reduce_step != nullptr) {
        std::vector<float*> partials;
        for (const LeafRange& seg : segments_) {
          partials.push_back(static_cast<float*>(slot.ptrs[seg.begin - first_leaf_]));
        }
        (*slot.reduce_step)(partials);
      } else {
        (*slot.root_step)();
      }
    } catch (const CollectiveTimeout& e) {
      slot.step_failed = slot.step_timeout = true;
      slot.step_error = e.what();
    } catch (const std::exception& e) {
      slot.step_failed = true;
      slot.step_error = e.what();
    }
    if (slot.step_failed) Break(slot.step_timeout, slot.step_error);
    slot.step_done.store(true);
    Notify(slot);
  } else {
    WaitFor(
        slot, [&] { return slot.step_done.load(); }, nullptr);
  }
  StepOutcome out{slot.step_failed, slot.step_timeout, slot.step_error};
  if (!out.failed) Compute(slot, call.rank, 1);
  return out;
}

// 5. Leaves: the last to leave resets the slot for collective seq +
// kMaxInFlight; the others wait for that while others may still use their
// buffer.
void LocalGroup::Leave(const Call& call, uint64_t seq, Slot& slot) {
  if (slot.departed.fetch_add(1) + 1 == size_) {
    {
      std::lock_guard<std::mutex> lock(slot.mu);
      slot.arrived.store(0);
      slot.reduced.store(0);
      slot.step_done.store(false);
      slot.departed.store(0);
      std::fill(slot.ptrs.begin(), slot.ptrs.end(), nullptr);
      std::fill(slot.present.begin(), slot.present.end(), 0);
      slot.tag.clear();
      slot.root_step = nullptr;
      slot.reduce_step = nullptr;
      slot.step_failed = slot.step_timeout = false;
      slot.step_error.clear();
      slot.seq.store(seq + kMaxInFlight);
    }
    slot.cv.notify_all();
  } else if (call.op != Op::kBarrier) {
    // Others may still be writing into (or reading) this rank's buffer.
    WaitFor(
        slot, [&] { return slot.seq.load() != seq; }, nullptr);
  }
}

// Phase 0: the reduction (fused with the copy-back for a one-phase
// all-reduce) or the broadcast copy; phase 1 (after the root's step): scale
// and copy the root's buffer to every rank.
void LocalGroup::Compute(Slot& slot, int rank, int phase) {
  if (slot.op == Op::kBarrier || slot.count == 0) return;
  const int n = size_;
  const bool two_phase = slot.two_phase();
  if (slot.op == Op::kBroadcast) {
    if (two_phase && phase == 0) return;  // the root's step comes first
    int64_t b, e;
    ChunkOf(slot.count, 1, rank, n, &b, &e);
    const char* src = static_cast<const char*>(slot.ptrs[slot.root]);
    for (int r = 0; r < n; ++r) {
      if (r != slot.root && e > b)
        std::memcpy(static_cast<char*>(slot.ptrs[r]) + b, src + b, e - b);
    }
    return;
  }
  float* on_stack[16];
  std::vector<float*> on_heap;
  float** ptrs = on_stack;
  if (n > 16) {
    on_heap.resize(n);
    ptrs = on_heap.data();
  }
  for (int r = 0; r < n; ++r) ptrs[r] = static_cast<float*>(slot.ptrs[r]);
  int64_t b, e;
  ChunkOf(slot.count, sizeof(float), rank, n, &b, &e);
  if (b >= e) return;
  if (slot.op == Op::kReduce) {
    SumInto(ptrs[slot.root], ptrs, n, b, e);
  } else if (!two_phase) {
    SumToAll(ptrs, n, b, e, slot.scale);
  } else if (phase == 0) {
    for (const LeafRange& seg : segments_) {
      float* const* p = ptrs + (seg.begin - first_leaf_);
      SumInto(p[0], p, seg.size(), b, e);
    }
  } else {
    float* src = ptrs[slot.root];
    if (slot.scale != 1.0f) {
      for (int64_t i = b; i < e; ++i) src[i] *= slot.scale;
    }
    for (int r = 0; r < n; ++r) {
      if (r != slot.root) std::memcpy(ptrs[r] + b, src + b, (e - b) * sizeof(float));
    }
  }
}

}  // namespace cnnflow
