// Where each rank's training step goes, and which rank holds the others up
// (and which stage of a pipeline).
//
// Every data-parallel replica of every process is a rank, numbered as the
// collectives number them (ReplicaSet::global_offset() + its local index:
// the MPI rank, with one replica a process). Each sums five phases of its
// steps (ReplicaSet::Counters): the wait for its batch, forward, backward,
// the wait for its peers in the all-reduce, and the optimizer step. At an
// epoch's end every process gathers every rank's sums for the epoch (one
// AllGather), and process 0 prints, when there are several ranks:
//
//   step time per rank (ms/step, 2 ranks)         data   forward  backward  all-reduce  optimizer
//     min                                         0.22      7.39     13.28        0.26       0.37
//     median                                      0.24      7.60     33.18       20.63       0.38
//     max                                         0.26      7.81     53.08       41.01       0.39
//   rank 1 is the straggler: its backward takes 4.0x the other rank's (53.1 vs 13.3 ms per step)
//
// The straggler line only when FindStraggler names one. GPU replicas'
// phases are their GPU's (ReplicaSet::Counters::gpu_busy_seconds: CUDA
// events), not the host's times of issuing their kernels.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/collectives/collective_mpi.h"
#include "ops/parallel/data_parallel.h"

namespace cnnflow {

// The phases of a step, in order.
enum StepPhase { kDataWait, kForward, kBackward, kAllReduce, kOptimizer, kStepPhases };
// "data", "forward", "backward", "all-reduce", "optimizer".
const char* StepPhaseName(int phase);

// One rank's epoch: milliseconds per optimizer step in each phase.
struct RankPhases {
  int rank = 0;
  std::array<double, kStepPhases> ms{};
};

// Across ranks, per phase.
struct PhaseSpread {
  double min = 0, median = 0, max = 0;
};
using RankSpread = std::array<PhaseSpread, kStepPhases>;
RankSpread SpreadOf(const std::vector<RankPhases>& ranks);
// Its epoch scalars: ranks/<phase>_ms_median and ranks/<phase>_ms_max
// (ranks/allreduce_ms_max, ...).
std::vector<std::pair<std::string, double>> RankScalars(const RankSpread& spread);

struct Straggler {
  int rank = 0;
  std::string phase;     // a StepPhaseName, or "compute (forward+backward+optimizer)"
  double ms = 0;         // its ms per step in that phase
  double others_ms = 0;  // the median of the other ranks'
  int ranks = 0;         // how many were compared
  // "rank 1 is the straggler: its backward takes 1.8x ..."
  std::string Line() const;
};

// The rank that holds the others up, if one does. A rank's phase (data
// wait, forward, backward, optimizer, or those three together) is
// compared with the median of the same phase on the OTHER ranks, so that
// with two ranks the slow one is measured against the healthy one, not
// against their mean. It is named when, over the epoch,
//  - it takes at least kStragglerRatio times the others' median,
//  - the excess is at least kStragglerShare of the others' median step
//    (all five phases): a phase of microseconds doubling is noise, and
//  - the others wait for it: their median all-reduce wait exceeds its own
//    by at least half the excess (a rank that is slow but holds nobody up,
//    or a machine slow for all alike, is no straggler).
// Of the single phases that qualify, the one with the largest excess is
// named; if none does, but the three compute phases together do, those.
// Noise on a loaded machine moves two healthy ranks by tens of percent;
// these bounds leave a wide margin above it.
inline constexpr double kStragglerRatio = 1.5;
inline constexpr double kStragglerShare = 0.1;
std::optional<Straggler> FindStraggler(const std::vector<RankPhases>& ranks);

// A pipeline's bottleneck: the stage the others idle for. Its busy time
// per step (forward and backward of its micro-batches) is compared with the
// median of the OTHER stages', and it is named when it takes at least
// kStragglerRatio times that: the pipeline runs at the pace of its slowest
// stage, so the cut (graph.pipeline) should move layers out of it.
struct SlowStage {
  int stage = 0;
  std::string first_layer, last_layer;
  double ms = 0;         // its busy ms per step
  double others_ms = 0;  // the median of the other stages'
  int stages = 0;
  // "stage 1 (conv3 .. fc2) is the bottleneck: busy 2.1x the other stage's
  // (812.0 vs 390.5 ms per step); move layers out of it in graph.pipeline"
  std::string Line() const;
};
// busy_ms[s]: stage s's busy ms per step; stages[s]: its layers in order.
std::optional<SlowStage> FindSlowStage(const std::vector<double>& busy_ms,
                                       const std::vector<std::vector<std::string>>& stages);

// The median over ranks of the whole step (all five phases), in ms.
double MedianStepMs(const std::vector<RankPhases>& ranks);

// The stall warning's threshold for the next epoch: graph.stall_warn_s, or
// kStallWarnSteps of the last epoch's median step where that is longer (a
// collective may wait most of a step for a peer with nothing wrong: a slow
// model must not warn every step). 0 stays 0 (never).
inline constexpr double kStallWarnSteps = 3;
double StallWarnSeconds(double configured_s, const std::vector<RankPhases>& ranks);

// What process 0 prints and logs at an epoch's end.
struct RankReport {
  std::vector<RankPhases> ranks;  // in rank order
  RankSpread spread;
  std::optional<Straggler> straggler;
  std::string Text() const;  // the table, and the straggler's line
};

// The counters of this process's replicas at an epoch's start, and at its
// end every rank's phases for the epoch.
class RankTimes {
 public:
  void Start(const ReplicaSet& replicas);
  // On every process at the same point (it gathers over `world`). Empty
  // when there is nothing to compare: one rank, no steps.
  std::optional<RankReport> Finish(const ReplicaSet& replicas, MpiWorld& world,
                                   double timeout_s) const;

 private:
  std::vector<ReplicaSet::Counters> start_;
};

}  // namespace cnnflow
