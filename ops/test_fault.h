// A test hook that kills or stops this process mid-step, so the fault tests
// can make a rank die or hang the ways a real one does
// (tests/cli/mpi_fault_test.sh, mpi_tensor_parallel_test.sh):
//
//   CNNFLOW_TEST_FAULT="rank=1,step=5|start,mode=exit0|exit1|abort|stop"
//   CNNFLOW_TEST_FAULT="rank=3,step=25,mode=run,cmd=COMMAND"
//
// The process whose MPI rank is `rank` (0 in a plain process) ends when its
// first replica starts the forward pass of global step `step` (0-based), so
// that its peers are left waiting in that step's gradient all-reduce; with
// step=start it ends once its replicas are built, before the initial
// broadcast of the weights, so that its peers are left waiting in that:
//   exit0, exit1  std::_Exit(0) / std::_Exit(1): no atexit handlers and no
//                 MPI_Finalize, as a process that leaves mid-step does;
//   abort         std::abort() (SIGABRT, as a failed assertion);
//   stop          raise(SIGSTOP): the process hangs, alive, until a SIGCONT,
//                 at a known point (a SIGSTOP from outside lands anywhere);
//   run           runs COMMAND (`/bin/sh -c`, its $PPID this process) and
//                 goes on if still alive: what a test needs of a whole host
//                 dying from inside (its link down, its processes killed:
//                 tests/cli/netns_elastic_test.sh). cmd= comes last and
//                 takes the rest of the value, commas included.
// It prints one line to stderr first ("cnnflow: CNNFLOW_TEST_FAULT: rank 1
// exit1 at step 5", "... at start-up"), which the tests time the survivors
// from. SIGKILL and SIGTERM come from outside (kill), as they do in real
// life. Called by the data-parallel forward_backward stage (pipeline graphs
// do not call it) and by ReplicaSet's constructor (kTestFaultAtStart).
//
// A second hook makes one replica slow instead of dead, so the tests can
// make a straggler (pipeline/rank_times.h names it):
//
//   CNNFLOW_TEST_SLOW_RANK="rank=1,ms=40"
//
// The replica whose global index (ReplicaSet::global_offset() + its local
// index: the MPI rank, with one replica a process) is `rank` sleeps `ms`
// milliseconds at the start of each backward. Called by
// ReplicaSet::ForwardBackward.
//
// A third makes one process slow to start, so the start-up deadline
// (graph.startup_timeout_s, MpiWorld::BeginStartup) can be tested:
//
//   CNNFLOW_TEST_SLOW_START="rank=1,s=6[,step=start|0]"
//
// The process whose MPI rank is `rank` sleeps `s` seconds at step=start
// (the default: in the trainer's constructor, before its first collective)
// or when its first replica starts the forward pass of global step 0, so
// that its peers wait for it in the config check or in the first step's
// gradient all-reduce. Called by the trainer and by the data-parallel
// forward_backward stage, with MaybeInjectTestFault.
//
// Each variable is read once per process (the first call); when it is unset
// a call costs one load and a compare. A malformed value throws Error at
// that first call, naming what is wrong.
#pragma once

#include <cstdint>

namespace cnnflow {

// The `global_step` of step=start.
inline constexpr int64_t kTestFaultAtStart = -1;

// Ends or stops the process as CNNFLOW_TEST_FAULT says when this is its
// rank and step; else returns at once.
void MaybeInjectTestFault(int64_t global_step);

// Sleeps as CNNFLOW_TEST_SLOW_START says when this is its rank and step;
// else returns at once.
void MaybeSlowTestStart(int64_t global_step);

// Sleeps as CNNFLOW_TEST_SLOW_RANK says when this is its replica; else
// returns at once.
void MaybeSlowTestRank(int global_replica);

}  // namespace cnnflow
