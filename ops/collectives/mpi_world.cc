// The processes of the job over MPI (see ops/collectives/mpi_world.h).
#define OMPI_SKIP_MPICXX 1  // the C API is enough; the C++ bindings are deprecated
#include "ops/collectives/mpi_world.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <thread>

#include "ops/collectives/collective.h"
#include "ops/collectives/reduction_tree.h"

namespace cnnflow {
namespace {

using Clock = std::chrono::steady_clock;

// MPI counts are int: larger buffers go in pieces.
constexpr int64_t kMaxPiece = int64_t{1} << 30;
// Polling: MPI_Test drives Open MPI's progress, so poll hard for a while
// (a bucket usually completes within it), then sleep between polls so a
// process waiting for a slow peer does not steal a core from the peer's
// compute on the same machine.
constexpr auto kBusyPoll = std::chrono::milliseconds(2);
constexpr auto kPollSleep = std::chrono::microseconds(50);

const char* EnvOrNull(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

// MPI's text for an error code.
std::string MpiErrorText(int code) {
  char text[MPI_MAX_ERROR_STRING] = {0};
  int len = 0;
  MPI_Error_string(code, text, &len);
  return std::string(text, len);
}

std::string Hex(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

struct MpiWorld::Comm {
  MPI_Comm comm = MPI_COMM_NULL;
};

struct MpiRequest::Impl {
  std::vector<MPI_Request> requests;
  std::string op;
  std::string tag;
  std::string size;  // "1000 floats"
  bool done = false;
  // The rank this round exchanges with (a collective of rounds; -1: any),
  // named when it waits too long.
  int peer = -1;
  // A collective of several rounds: called once `requests` are complete, it
  // does the round's arithmetic and starts the next round's requests in
  // `requests`; false when there is none (the collective is done).
  std::function<bool()> next_round;
};

// The all-reduce in tree order across processes (StartAllReduceSum), from
// point-to-point messages, one round at a time. The tree is LocalGroup's:
// the subtree of ranks [p, p + 2d) adds [p + d, p + 2d) to [p, p + d). A
// power-of-two world runs it as recursive halving (a reduce-scatter whose
// rounds pair ranks at distances 1, 2, 4, ..., so each keeps half of its
// range and adds its partner's half) then recursive doubling (the
// all-gather, in reverse): each process sends and receives 2 (W - 1) / W of
// the buffer, as a ring all-reduce does. Other world sizes reduce to rank 0
// over the binomial tree and broadcast back down it.
class TreeAllReduce {
 public:
  TreeAllReduce(float* data, int64_t count, int rank, int size, int mpi_tag, MPI_Comm comm)
      : data_(data), rank_(rank), size_(size), tag_(mpi_tag), comm_(comm), hi_(count) {
    halving_ = (size & (size - 1)) == 0;
    scratch_.resize(halving_ ? (count + 1) / 2 : count);
  }

  // Does the finished round's arithmetic and starts the next round's
  // messages into `requests`; false when the all-reduce is complete.
  bool Next(std::vector<MPI_Request>& requests) {
    requests.clear();
    FinishRound();
    while (requests.empty()) {
      if (!(halving_ ? StartHalvingRound(requests) : StartTreeRound(requests))) return false;
    }
    return true;
  }

  // The rank of this round's messages.
  int peer() const { return peer_; }

 private:
  enum class Add { kNone, kKept, kAll };

  void FinishRound() {
    if (add_ == Add::kNone) return;
    float* __restrict dst = data_ + (add_ == Add::kKept ? lo_ : 0);
    const float* __restrict src = scratch_.data();
    for (int64_t i = 0; i < add_count_; ++i) dst[i] += src[i];
    add_ = Add::kNone;
  }

  void Send(std::vector<MPI_Request>& rq, const float* p, int64_t n, int to) {
    peer_ = to;
    rq.emplace_back();
    Check(MPI_Isend(p, static_cast<int>(n), MPI_FLOAT, to, tag_, comm_, &rq.back()), "MPI_Isend");
  }
  void Recv(std::vector<MPI_Request>& rq, float* p, int64_t n, int from) {
    peer_ = from;
    rq.emplace_back();
    Check(MPI_Irecv(p, static_cast<int>(n), MPI_FLOAT, from, tag_, comm_, &rq.back()), "MPI_Irecv");
  }
  static void Check(int rc, const char* call) {
    if (rc != MPI_SUCCESS) throw Error(StrCat(call, " failed: ", MpiErrorText(rc)));
  }

  // Recursive halving, distances 1, 2, ..., size / 2; then doubling back.
  bool StartHalvingRound(std::vector<MPI_Request>& rq) {
    if (!doubling_ && d_ >= size_) {
      doubling_ = true;
      d_ = size_ / 2;
    }
    if (doubling_) {
      if (d_ < 1) return false;
      const Range parent = stack_.back();
      stack_.pop_back();
      const int partner = rank_ ^ d_;
      Send(rq, data_ + lo_, hi_ - lo_, partner);
      if (parent.kept_lower) {
        Recv(rq, data_ + hi_, parent.hi - hi_, partner);
      } else {
        Recv(rq, data_ + parent.lo, lo_ - parent.lo, partner);
      }
      lo_ = parent.lo;
      hi_ = parent.hi;
      d_ /= 2;
      return true;
    }
    const int partner = rank_ ^ d_;
    const int64_t mid = lo_ + (hi_ - lo_) / 2;
    const bool lower = (rank_ & d_) == 0;
    stack_.push_back({lo_, hi_, lower});
    if (lower) {
      Send(rq, data_ + mid, hi_ - mid, partner);
      hi_ = mid;
    } else {
      Send(rq, data_ + lo_, mid - lo_, partner);
      lo_ = mid;
    }
    Recv(rq, scratch_.data(), hi_ - lo_, partner);
    add_ = Add::kKept;
    add_count_ = hi_ - lo_;
    d_ *= 2;
    return true;
  }

  // Binomial tree: reduce to rank 0 (distances 1, 2, 4, ...), then
  // broadcast back down.
  bool StartTreeRound(std::vector<MPI_Request>& rq) {
    const int64_t n = hi_;
    if (!doubling_) {
      if (d_ >= size_) {
        doubling_ = true;
        d_ = 1;
        while (d_ * 2 < size_) d_ *= 2;
        return true;  // no messages this round; the caller asks again
      }
      const int d = d_;
      d_ *= 2;
      if (rank_ % (2 * d) == d) {
        Send(rq, data_, n, rank_ - d);
      } else if (rank_ % (2 * d) == 0 && rank_ + d < size_) {
        Recv(rq, scratch_.data(), n, rank_ + d);
        add_ = Add::kAll;
        add_count_ = n;
      }
      return true;
    }
    if (d_ < 1) return false;
    const int d = d_;
    d_ /= 2;
    if (rank_ % (2 * d) == 0 && rank_ + d < size_) {
      Send(rq, data_, n, rank_ + d);
    } else if (rank_ % (2 * d) == d) {
      Recv(rq, data_, n, rank_ - d);
    }
    return true;
  }

  struct Range {
    int64_t lo, hi;
    bool kept_lower;
  };
  float* data_;
  int rank_, size_, tag_;
  int peer_ = -1;
  MPI_Comm comm_;
  int64_t lo_ = 0, hi_;    // the range this rank holds (halving)
  int d_ = 1;              // this round's distance
  bool halving_ = false;   // a power-of-two world
  bool doubling_ = false;  // the second half: all-gather / broadcast
  std::vector<Range> stack_;
  std::vector<float> scratch_;
  Add add_ = Add::kNone;
  int64_t add_count_ = 0;
};

// The all-reduce of a split of the run's logical replicas that is not one
// block of equal size per process (3 + 3 + 2 of 8): this process's partial
// sums (TreeSegments of its leaves) go up the tree, level by level, by the
// schedule of PlanTreeAllReduce to process 0, whose total comes back down a
// binomial broadcast into partial 0 of every process.
class PartialTreeAllReduce {
 public:
  PartialTreeAllReduce(std::vector<float*> partials, int64_t count, TreeSchedule schedule,
                       int mpi_tag, MPI_Comm comm)
      : partials_(std::move(partials)),
        count_(count),
        schedule_(std::move(schedule)),
        tag_(mpi_tag),
        comm_(comm) {}

  // As TreeAllReduce::Next.
  bool Next(std::vector<MPI_Request>& rq) {
    rq.clear();
    for (size_t i = 0; i < pending_.size(); ++i) {
      float* __restrict dst = partials_[pending_[i]];
      const float* __restrict src = scratch_[i].data();
      for (int64_t k = 0; k < count_; ++k) dst[k] += src[k];
    }
    pending_.clear();
    while (rq.empty()) {
      if (round_ < schedule_.reduce.size()) {
        StartReduceRound(schedule_.reduce[round_++], rq);
      } else if (down_ < schedule_.broadcast_to.size()) {
        const int to = schedule_.broadcast_to[down_], from = schedule_.broadcast_from[down_];
        ++down_;
        if (to >= 0) Post(rq, MPI_Isend, partials_[0], to);
        if (from >= 0) Post(rq, MPI_Irecv, partials_[0], from);
      } else {
        return false;
      }
    }
    return true;
  }

  int peer() const { return peer_; }

 private:
  template <typename Fn, typename Ptr>
  void Post(std::vector<MPI_Request>& rq, Fn fn, Ptr p, int peer) {
    peer_ = peer;
    rq.emplace_back();
    const int rc = fn(p, static_cast<int>(count_), MPI_FLOAT, peer, tag_, comm_, &rq.back());
    if (rc != MPI_SUCCESS) throw Error(StrCat("MPI point-to-point failed: ", MpiErrorText(rc)));
  }

  void StartReduceRound(const TreeRound& round, std::vector<MPI_Request>& rq) {
    for (const TreeRound::Add& a : round.local_adds) {
      float* __restrict dst = partials_[a.into];
      const float* __restrict src = partials_[a.from];
      for (int64_t k = 0; k < count_; ++k) dst[k] += src[k];
    }
    for (const TreeRound::Send& s : round.sends) Post(rq, MPI_Isend, partials_[s.partial], s.to);
    if (scratch_.size() < round.recvs.size()) scratch_.resize(round.recvs.size());
    for (size_t i = 0; i < round.recvs.size(); ++i) {
      scratch_[i].resize(count_);
      Post(rq, MPI_Irecv, scratch_[i].data(), round.recvs[i].from);
      pending_.push_back(round.recvs[i].partial);
    }
  }

  std::vector<float*> partials_;
  int64_t count_;
  TreeSchedule schedule_;
  int tag_;
  MPI_Comm comm_;
  size_t round_ = 0, down_ = 0;
  std::vector<std::vector<float>> scratch_;  // one per receive of a round
  std::vector<int> pending_;                 // the partial each scratch is added to
  int peer_ = -1;
};

MpiRequest::MpiRequest() = default;
MpiRequest::MpiRequest(MpiRequest&&) noexcept = default;
MpiRequest& MpiRequest::operator=(MpiRequest&&) noexcept = default;
MpiRequest::~MpiRequest() {
  // A collective of rounds abandoned midway (a timeout): MPI may still
  // write into its scratch buffer, so that is never freed.
  if (impl_ && !impl_->done && impl_->next_round) (void)impl_.release();
}

bool MpiWorld::LaunchedByMpi() {
  if (const char* force = EnvOrNull("CNNFLOW_MPI")) {
    return !(std::strcmp(force, "0") == 0 || std::strcmp(force, "off") == 0 ||
             std::strcmp(force, "false") == 0);
  }
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE", "PMI_RANK"}) {
    if (EnvOrNull(v)) return true;
  }
  // An sbatch script also sets SLURM_NTASKS, even for a plain process; only a
  // job step started by srun sets the step's task count.
  const char* step_tasks = EnvOrNull("SLURM_STEP_NUM_TASKS");
  return step_tasks != nullptr && std::atoi(step_tasks) > 1;
}

MpiWorld& MpiWorld::Get() {
  static MpiWorld world;
  return world;
}

MpiWorld::MpiWorld() : comm_(std::make_unique<Comm>()) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (finalized) return;
  int provided = MPI_THREAD_SINGLE;
  if (!initialized) {
    if (!LaunchedByMpi()) return;  // a plain process: no MPI_Init, size 1
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) Fail("MPI_Init_thread", rc);
    owned_ = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_SERIALIZED) {
    throw Error(StrCat("MPI was initialised with thread level ", provided,
                       "; cnnflow calls MPI from worker threads and needs "
                       "MPI_THREAD_SERIALIZED or MPI_THREAD_MULTIPLE"));
  }
  serialize_ = provided < MPI_THREAD_MULTIPLE;
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm_->comm);
  if (rc != MPI_SUCCESS) Fail("MPI_Comm_dup", rc);
  MPI_Comm_set_errhandler(comm_->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_->comm, &rank_);
  MPI_Comm_size(comm_->comm, &size_);
  active_ = true;
  const char* step_tasks = EnvOrNull("SLURM_STEP_NUM_TASKS");
  if (step_tasks != nullptr && std::atoi(step_tasks) > size_ && !EnvOrNull("CNNFLOW_MPI")) {
    throw Error(StrCat("srun started ", step_tasks, " tasks but MPI sees a world of ", size_,
                       ": Open MPI was not wired up by srun; launch with `srun --mpi=pmix` "
                       "(or pmi2) or with mpirun"));
  }
}

MpiWorld::MpiWorld(MpiWorld& parent, int color, std::string name)
    : active_(true),
      serialize_(parent.serialize_),
      parent_(&parent),
      name_(std::move(name)),
      comm_(std::make_unique<Comm>()) {
  {
    auto lock = parent.Lock();
    const int rc = MPI_Comm_split(parent.comm_->comm, color, parent.rank_, &comm_->comm);
    if (rc != MPI_SUCCESS) parent.Fail("MPI_Comm_split", rc);
    MPI_Comm_set_errhandler(comm_->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_->comm, &rank_);
    MPI_Comm_size(comm_->comm, &size_);
  }
}

std::unique_ptr<MpiWorld> MpiWorld::Split(int color, const std::string& name) {
  CheckUsable("Split", name);
  CNNFLOW_ENFORCE(active_, "MpiWorld::Split needs MPI (a job started by a launcher)");
  return std::unique_ptr<MpiWorld>(new MpiWorld(*this, color, name));
}

MpiWorld::~MpiWorld() {
  try {
    Finalize();
  } catch (...) {
  }
}

void MpiWorld::Finalize() {
  if (!active_ || finalized_) return;
  finalized_ = true;
  active_ = false;
  if (parent_ != nullptr) {
    // A broken one is left for the root's Finalize to MPI_Abort: ending the
    // job here, during the unwinding, would lose the error's message.
    if (!broken()) MPI_Comm_free(&comm_->comm);
    return;
  }
  if (broken()) {
    // A collective is still pending on a peer that never came: MPI_Finalize
    // would wait for it forever. End the whole job instead.
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }
  MPI_Comm_free(&comm_->comm);
  if (owned_) MPI_Finalize();
}

void MpiWorld::AbortJob(int exit_code) {
  if (active_) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

int MpiWorld::local_rank() const {
  if (!active_) return 0;
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}) {
    if (const char* v = std::getenv(var)) return std::atoi(v);
  }
  return 0;
}

std::string MpiWorld::Where() const {
  if (parent_ != nullptr)
    return StrCat(parent_->Where(), ", ", name_, ": member ", rank_, " of ", size_);
  return StrCat("rank ", rank_, " of ", size_);
}

void MpiWorld::Fail(const char* call, int code) const {
  throw Error(StrCat(Where(), ": ", call, " failed: ", MpiErrorText(code)));
}

std::unique_lock<std::mutex> MpiWorld::Lock() {
  if (parent_ != nullptr) return parent_->Lock();  // SERIALIZED is per process, not per comm
  return serialize_ ? std::unique_lock<std::mutex>(mpi_mu_)
                    : std::unique_lock<std::mutex>(mpi_mu_, std::defer_lock);
}

void MpiWorld::MarkBroken(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(broken_mu_);
    if (!broken_.load()) broken_reason_ = reason;
    broken_.store(true);
  }
  if (parent_ != nullptr) parent_->MarkBroken(reason);
}

void MpiWorld::CheckUsable(const std::string& op, const std::string& tag) const {
  if (!broken()) return;
  std::lock_guard<std::mutex> lock(broken_mu_);
  throw CollectiveAborted(StrCat(Where(), ": MPI ", op, " '", tag,
                                 "' refused, an earlier collective failed: ", broken_reason_));
}

MpiRequest MpiWorld::StartAllReduceSum(float* data, int64_t count, const std::string& tag) {
  return StartTreeAllReduce({data}, count, nullptr, tag);
}

MpiRequest MpiWorld::StartAllReduceSum(const std::vector<float*>& partials, int64_t count,
                                       const std::vector<LeafRange>& processes,
                                       const std::string& tag) {
  return StartTreeAllReduce(partials, count, &processes, tag);
}

MpiRequest MpiWorld::StartTreeAllReduce(const std::vector<float*>& partials, int64_t count,
                                        const std::vector<LeafRange>* processes,
                                        const std::string& tag) {
  CheckUsable("AllReduceSum", tag);
  if (count < 0 || partials.empty() ||
      (count > 0 && std::count(partials.begin(), partials.end(), nullptr) > 0)) {
    throw Error(StrCat(Where(), ": MPI AllReduceSum '", tag, "': bad buffer (", count,
                       " floats in ", partials.size(), " partial sums)"));
  }
  if (processes != nullptr && static_cast<int>(processes->size()) != size_) {
    throw Error(StrCat(Where(), ": MPI AllReduceSum '", tag, "': a layout of ", processes->size(),
                       " processes in a world of ", size_));
  }
  if (count > std::numeric_limits<int>::max()) {
    throw Error(StrCat(Where(), ": MPI AllReduceSum '", tag, "': ", count,
                       " floats, more than one all-reduce takes (2^31 - 1)"));
  }
  MpiRequest r;
  r.impl_ = std::make_unique<MpiRequest::Impl>();
  r.impl_->op = "AllReduceSum";
  r.impl_->tag = tag;
  r.impl_->size = StrCat(count, " floats");
  if (!active_ || size_ == 1) return r;
  // Every process starts its all-reduces in the same order, so the n-th
  // one's messages carry the same tag everywhere and never match another's.
  const int mpi_tag = static_cast<int>(next_reduce_tag_++ % 32768);  // MPI_TAG_UB >= 32767
  // One block of leaves of the same size per process: the tree over the
  // processes is the leaves' (and a power-of-two world halves and doubles).
  bool equal_blocks = processes == nullptr;
  if (!equal_blocks) {
    const int leaves = processes->back().end;
    equal_blocks = leaves % size_ == 0 &&
                   std::all_of(processes->begin(), processes->end(), [&](const LeafRange& p) {
                     return p.size() == leaves / size_ && TreeSegments(p, leaves).size() == 1;
                   });
  }
  // Each round: complete the last one's arithmetic, start the next's messages.
  std::function<bool(std::vector<MPI_Request>&, int&)> next;
  auto rounds_of = [&next](auto reduce) {
    next = [reduce](std::vector<MPI_Request>& rq, int& peer) {
      const bool more = reduce->Next(rq);
      peer = reduce->peer();
      return more;
    };
  };
  if (equal_blocks) {
    if (partials.size() != 1) {
      throw Error(StrCat(Where(), ": MPI AllReduceSum '", tag, "': ", partials.size(),
                         " partial sums for one block of leaves"));
    }
    rounds_of(
        std::make_shared<TreeAllReduce>(partials[0], count, rank_, size_, mpi_tag, comm_->comm));
  } else {
    const LeafRange mine = (*processes)[rank_];
    if (TreeSegments(mine, processes->back().end).size() != partials.size()) {
      throw Error(StrCat(Where(), ": MPI AllReduceSum '", tag, "': ", partials.size(),
                         " partial sums for leaves [", mine.begin, ", ", mine.end, ")"));
    }
    rounds_of(std::make_shared<PartialTreeAllReduce>(
        partials, count, PlanTreeAllReduce(*processes, rank_), mpi_tag, comm_->comm));
  }
  MpiRequest::Impl* impl = r.impl_.get();
  impl->next_round = [this, next, impl] {
    auto lock = Lock();
    return next(impl->requests, impl->peer);
  };
  try {
    if (!impl->next_round()) impl->done = true;
  } catch (const Error& e) {
    throw Error(StrCat(Where(), ": MPI AllReduceSum '", tag, "': ", e.what()));
  }
  return r;
}

MpiRequest MpiWorld::StartBroadcastBytes(void* data, int64_t bytes, int root,
                                         const std::string& tag) {
  CheckUsable("Broadcast", tag);
  if (root < 0 || root >= size_ || bytes < 0 || (bytes > 0 && data == nullptr)) {
    throw Error(StrCat(Where(), ": MPI Broadcast '", tag, "': bad arguments (root ", root, ", ",
                       bytes, " bytes at ", data, ")"));
  }
  MpiRequest r;
  r.impl_ = std::make_unique<MpiRequest::Impl>();
  r.impl_->op = "Broadcast";
  r.impl_->tag = tag;
  r.impl_->size = StrCat(bytes, " bytes from rank ", root);
  if (!active_ || size_ == 1) return r;
  auto lock = Lock();
  for (int64_t off = 0; off < bytes; off += kMaxPiece) {
    const int n = static_cast<int>(std::min(kMaxPiece, bytes - off));
    MPI_Request req;
    const int rc = MPI_Ibcast(static_cast<char*>(data) + off, n, MPI_BYTE, root, comm_->comm, &req);
    if (rc != MPI_SUCCESS) Fail("MPI_Ibcast", rc);
    r.impl_->requests.push_back(req);
  }
  return r;
}

std::string MpiWorld::WaitLimit::Text() const {
  return startup ? StrCat(seconds, " s (the start-up deadline, graph.startup_timeout_s)")
                 : StrCat(seconds, " s");
}

namespace {
std::atomic<double> startup_deadline_s{0};  // BeginStartup's; 0: not starting up
}  // namespace

void MpiWorld::BeginStartup(double seconds) { startup_deadline_s.store(seconds); }
void MpiWorld::EndStartup() { startup_deadline_s.store(0); }

MpiWorld::WaitLimit MpiWorld::LimitFor(double timeout_s) {
  WaitLimit limit;
  const double startup_s = startup_deadline_s.load();
  limit.startup = startup_s > 0;
  limit.seconds = limit.startup ? startup_s : timeout_s;
  return limit;
}

void MpiWorld::Wait(MpiRequest& request, double timeout_s) {
  MpiRequest::Impl* r = request.impl_.get();
  if (r == nullptr || r->done) return;
  if (r->requests.empty()) {
    r->done = true;
    return;
  }
  const auto start = Clock::now();
  const WaitLimit limit = LimitFor(timeout_s);
  const auto deadline = DeadlineIn(limit.seconds);
  const double warn_s = stall_warning();
  bool warned = false;
  for (;;) {
    int flag = 0;
    {
      auto lock = Lock();
      const int rc = MPI_Testall(static_cast<int>(r->requests.size()), r->requests.data(), &flag,
                                 MPI_STATUSES_IGNORE);
      if (rc != MPI_SUCCESS) Fail("MPI_Testall", rc);
    }
    if (flag) {
      if (r->next_round) {
        bool more;
        try {
          more = r->next_round();
        } catch (const Error& e) {
          MarkBroken(e.what());
          throw Error(StrCat(Where(), ": MPI ", r->op, " '", r->tag, "': ", e.what()));
        }
        if (more) continue;
      }
      r->done = true;
      return;
    }
    const auto now = Clock::now();
    // "1000 floats, waiting on rank 3"
    const std::string what =
        r->peer >= 0 ? StrCat(r->size, ", waiting on rank ", r->peer) : r->size;
    if (now >= deadline) {
      const std::string msg = StrCat(
          Where(), ": MPI ", r->op, " '", r->tag, "' (", what, ") did not complete within ",
          limit.Text(),
          limit.startup ? ": a peer process did not start, died, stalled or started a different "
                          "collective; the MPI state is now unusable and the job must end"
                        : ": a peer process died, stalled or started a different collective; the "
                          "MPI state is now unusable and the job must end");
      MarkBroken(msg);
      throw CollectiveTimeout(msg);
    }
    const double waited = std::chrono::duration<double>(now - start).count();
    if (!warned && warn_s > 0 && waited >= warn_s) {
      warned = true;
      std::fprintf(stderr,
                   "%s: warning: MPI %s '%s' (%s) has waited %.1f s (stall warning at %g s; it "
                   "fails the run at %s %g): a peer process is %s, stalled or its link is "
                   "down\n",
                   Where().c_str(), r->op.c_str(), r->tag.c_str(), what.c_str(), waited, warn_s,
                   limit.startup ? "the start-up deadline graph.startup_timeout_s"
                                 : "graph.collective_timeout_s",
                   limit.seconds, limit.startup ? "slow to start" : "slow");
    }
    if (now - start > kBusyPoll) std::this_thread::sleep_for(kPollSleep);
  }
}

void MpiWorld::AllReduceSum(float* data, int64_t count, const std::string& tag, double timeout_s) {
  MpiRequest r = StartAllReduceSum(data, count, tag);
  Wait(r, timeout_s);
}

void MpiWorld::BroadcastBytes(void* data, int64_t bytes, int root, const std::string& tag,
                              double timeout_s) {
  MpiRequest r = StartBroadcastBytes(data, bytes, root, tag);
  Wait(r, timeout_s);
}

std::vector<uint64_t> MpiWorld::AllGather(uint64_t value, const std::string& tag,
                                          double timeout_s) {
  return AllGather(std::vector<uint64_t>{value}, tag, timeout_s);
}

std::vector<uint64_t> MpiWorld::AllGather(const std::vector<uint64_t>& values,
                                          const std::string& tag, double timeout_s) {
  CheckUsable("AllGather", tag);
  if (!active_ || size_ == 1) return values;
  const int count = static_cast<int>(values.size());
  std::vector<uint64_t> all(static_cast<size_t>(size_) * values.size());
  MpiRequest r;
  r.impl_ = std::make_unique<MpiRequest::Impl>();
  r.impl_->op = "AllGather";
  r.impl_->tag = tag;
  r.impl_->size = StrCat(count, " uint64 per rank");
  {
    auto lock = Lock();
    MPI_Request req;
    const int rc = MPI_Iallgather(values.data(), count, MPI_UINT64_T, all.data(), count,
                                  MPI_UINT64_T, comm_->comm, &req);
    if (rc != MPI_SUCCESS) Fail("MPI_Iallgather", rc);
    r.impl_->requests.push_back(req);
  }
  Wait(r, timeout_s);
  return all;
}

void MpiWorld::Barrier(const std::string& tag, double timeout_s) {
  CheckUsable("Barrier", tag);
  if (!active_ || size_ == 1) return;
  MpiRequest r;
  r.impl_ = std::make_unique<MpiRequest::Impl>();
  r.impl_->op = "Barrier";
  r.impl_->tag = tag;
  r.impl_->size = "no data";
  {
    auto lock = Lock();
    MPI_Request req;
    const int rc = MPI_Ibarrier(comm_->comm, &req);
    if (rc != MPI_SUCCESS) Fail("MPI_Ibarrier", rc);
    r.impl_->requests.push_back(req);
  }
  Wait(r, timeout_s);
}

void MpiWorld::AgreeOnHash(uint64_t hash, const std::string& what, double timeout_s) {
  const std::vector<uint64_t> all = AllGather(hash, StrCat("hash of ", what), timeout_s);
  // Group the ranks by hash, in order of first appearance (rank 0's first).
  std::vector<std::pair<uint64_t, std::vector<int>>> groups;
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == all[r]; });
    if (it == groups.end()) {
      groups.push_back({all[r], {r}});
    } else {
      it->second.push_back(r);
    }
  }
  if (groups.size() <= 1) return;
  std::string msg = StrCat(Where(), ": ", what, " differ across the ", size_, " processes: ");
  std::vector<int> differ;
  for (size_t g = 0; g < groups.size(); ++g) {
    const std::vector<int>& ranks = groups[g].second;
    msg += g ? "; " : "";
    msg += ranks.size() == 1 ? "rank " : "ranks ";
    for (size_t i = 0; i < ranks.size(); ++i) msg += (i ? ", " : "") + std::to_string(ranks[i]);
    msg += StrCat(ranks.size() == 1 ? " has " : " have ", Hex(groups[g].first));
    if (g > 0) differ.insert(differ.end(), ranks.begin(), ranks.end());
  }
  std::sort(differ.begin(), differ.end());
  msg += differ.size() == 1 ? ". Rank " : ". Ranks ";
  for (size_t i = 0; i < differ.size(); ++i) msg += (i ? ", " : "") + std::to_string(differ[i]);
  msg += StrCat(" differ", differ.size() == 1 ? "s" : "",
                " from rank 0; every process must run the same configuration");
  throw Error(msg);
}

}  // namespace cnnflow
