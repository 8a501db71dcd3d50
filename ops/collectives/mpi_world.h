// The processes of the job (MpiWorld): collectives across processes over MPI.
//
// MPI is initialised only when the process was started by a launcher
// (mpirun/mpiexec, srun, hydra): a plain single process never calls MPI_Init
// (Open MPI's singleton start-up is slow) and sees a world of size 1 in
// which every collective is a no-op.
//
// Threads: MPI is initialised with MPI_THREAD_MULTIPLE requested; when the
// library provides less (SERIALIZED), every MPI call made here is
// serialised by a mutex, so any thread may call. Collectives across
// processes are matched by the order in which they are started, as in MPI:
// every process must start the same sequence.
//
// Timeouts: every collective is non-blocking underneath (MPI_I*) and polled
// against a deadline. A collective that does not complete in time throws
// CollectiveTimeout naming this rank, the tag and the timeout (at start-up
// the start-up deadline instead: BeginStartup). MPI cannot cancel a started
// collective, so the world is then broken: later calls throw, and at exit
// the job is ended with MPI_Abort (MPI_Finalize would hang on the peer that
// never came), so a stalled or dead peer never turns into a hang.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/collectives/reduction_tree.h"

namespace cnnflow {

// A started MPI collective; complete it with MpiWorld::Wait.
class MpiRequest {
 public:
  MpiRequest();
  MpiRequest(MpiRequest&&) noexcept;
  MpiRequest& operator=(MpiRequest&&) noexcept;
  ~MpiRequest();  // an unfinished request is leaked: MPI cannot cancel it

 private:
  friend class MpiWorld;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The processes of the job (MPI_COMM_WORLD, duplicated so that our
// collectives never mix with anyone else's).
class MpiWorld {
 public:
  // The process's world; the first call initialises MPI when launched by a
  // launcher (LaunchedByMpi()). Call it first from the main thread, before
  // starting others (MPI wants MPI_Init on the main thread).
  static MpiWorld& Get();

  // Whether a launcher started this process: one of OMPI_COMM_WORLD_SIZE
  // (Open MPI), PMIX_RANK (PMIx, srun --mpi=pmix), PMI_SIZE/PMI_RANK (hydra,
  // srun --mpi=pmi2), or SLURM_STEP_NUM_TASKS > 1 (an srun step) is set.
  // CNNFLOW_MPI=0 / =1 overrides the detection.
  static bool LaunchedByMpi();

  // Whether MPI is initialised and used (false in a plain single process).
  bool active() const { return active_; }
  int rank() const { return rank_; }
  int size() const { return size_; }
  // This process's rank among those on its node, from the launcher
  // (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID); 0 when
  // not launched or not said. Picks the GPU of a one-GPU-per-process job.
  int local_rank() const;
  // "rank 1 of 2": the prefix of every message.
  std::string Where() const;

  // data[0..count) becomes the sum over processes, in place, in tree order
  // over ranks (LocalGroup's: ((r0 + r1) + (r2 + r3)) + r4), whatever the
  // message sizes: MPI_Allreduce picks its algorithm, and so its order, by
  // size and rank count. Bandwidth as a ring all-reduce's where the world
  // is a power of two (recursive halving and doubling); otherwise a tree
  // reduce and broadcast (log2 W times the buffer).
  void AllReduceSum(float* data, int64_t count, const std::string& tag, double timeout_s);
  // The split form, so several collectives can be started in a fixed order
  // and completed later (from any thread).
  MpiRequest StartAllReduceSum(float* data, int64_t count, const std::string& tag);
  // The all-reduce of a run's logical replicas split over the processes
  // (ops/collectives/reduction_tree.h): processes[p] are process p's leaves
  // and `partials` this process's partial sums, one per TreeSegments of its
  // leaves, in leaf order. partials[0] becomes the sum over every leaf, in
  // the one tree's order, on every process; the other partials are scratch.
  MpiRequest StartAllReduceSum(const std::vector<float*>& partials, int64_t count,
                               const std::vector<LeafRange>& processes, const std::string& tag);
  void Wait(MpiRequest& request, double timeout_s);

  // root's data[0..bytes) is copied to every process.
  void BroadcastBytes(void* data, int64_t bytes, int root, const std::string& tag,
                      double timeout_s);
  MpiRequest StartBroadcastBytes(void* data, int64_t bytes, int root, const std::string& tag);
  // Every process's value, indexed by rank.
  std::vector<uint64_t> AllGather(uint64_t value, const std::string& tag, double timeout_s);
  // Every process's values (the same count on each), rank after rank.
  std::vector<uint64_t> AllGather(const std::vector<uint64_t>& values, const std::string& tag,
                                  double timeout_s);
  void Barrier(const std::string& tag, double timeout_s);

  // Start-up check that every process runs the same thing (e.g. a hash of
  // the graph and parameter shapes, `what` = "graph and parameter shapes").
  // On a mismatch every process throws the same Error listing which ranks
  // hold which hash.
  void AgreeOnHash(uint64_t hash, const std::string& what, double timeout_s);

  // The processes whose `color` is this one's, as a world of their own
  // (MPI_Comm_split, ranked as here), e.g. those of one tensor-parallel
  // group. Every process calls it at the same point (it blocks, with no
  // deadline: MPI has no non-blocking split; call it at start-up, after a
  // collective with a deadline such as AgreeOnHash). Its collectives have
  // their own deadlines; a timeout in it breaks this world too, so the job
  // ends with MPI_Abort rather than hanging in MPI_Finalize. `name` follows
  // this world's Where() in its messages ("rank 1 of 4, tensor-parallel
  // group 0: member 1 of 2"). Destroy it before this world is finalized.
  std::unique_ptr<MpiWorld> Split(int color, const std::string& name);

  // Whether a collective timed out (the MPI state is unusable), and why.
  bool broken() const { return broken_.load(); }

  // A collective that waits longer than this (graph.stall_warn_s; 0: never)
  // prints one warning naming it and how long it has waited, long before
  // its deadline fails the run: a slow link or a lagging rank shows in the
  // log while the run goes on. For this world and its splits.
  // May change while collectives wait (the trainer follows the step time).
  void SetStallWarning(double seconds) { stall_warn_s_.store(seconds); }
  double stall_warning() const { return parent_ ? parent_->stall_warning() : stall_warn_s_.load(); }

  // Start-up (graph.startup_timeout_s): from BeginStartup until EndStartup,
  // every collective across processes or GPUs (MPI, in every world; NCCL)
  // waits up to `seconds` instead of the timeout its caller passes, and its
  // timeout error and stall warning name the start-up deadline. The trainer
  // begins it before its first collective and ends it after the first
  // training step, so a rank slow to start (reading data, building
  // primitives) is let through without loosening the deadline of the rest
  // of the run. Process-wide; thread-safe.
  static void BeginStartup(double seconds);
  static void EndStartup();
  // The deadline a collective called with `timeout_s` waits under now.
  struct WaitLimit {
    double seconds = 0;
    bool startup = false;  // the start-up deadline, not the caller's timeout
    // "3 s", or "30 s (the start-up deadline, graph.startup_timeout_s)".
    std::string Text() const;
  };
  static WaitLimit LimitFor(double timeout_s);

  // Ends the whole job now (MPI_Abort; std::_Exit in a plain process). For
  // the program's top level after a collective error; library code throws.
  [[noreturn]] void AbortJob(int exit_code);

  // MPI_Finalize (or MPI_Abort when broken); also run at exit.
  void Finalize();

  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

 private:
  MpiWorld();
  MpiWorld(MpiWorld& parent, int color, std::string name);  // Split's
  MpiRequest StartTreeAllReduce(const std::vector<float*>& partials, int64_t count,
                                const std::vector<LeafRange>* processes, const std::string& tag);
  void MarkBroken(const std::string& reason);
  void CheckUsable(const std::string& op, const std::string& tag) const;
  std::unique_lock<std::mutex> Lock();
  [[noreturn]] void Fail(const char* call, int code) const;

  bool active_ = false;
  bool owned_ = false;  // we called MPI_Init, so we finalize
  bool finalized_ = false;
  bool serialize_ = false;      // provided thread level below MULTIPLE
  MpiWorld* parent_ = nullptr;  // a Split world's; its Lock() and breakage are the root's too
  std::string name_;            // a Split world's
  int rank_ = 0;
  int size_ = 1;
  std::atomic<double> stall_warn_s_{10};      // SetStallWarning
  std::atomic<uint64_t> next_reduce_tag_{0};  // StartAllReduceSum's message tags
  struct Comm;  // the MPI_Comm, kept out of this header (mpi.h is heavy)
  std::unique_ptr<Comm> comm_;
  std::mutex mpi_mu_;
  std::atomic<bool> broken_{false};
  mutable std::mutex broken_mu_;
  std::string broken_reason_;
};

}  // namespace cnnflow
