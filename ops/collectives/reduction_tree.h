// The one reduction tree over a run's G logical replicas (its leaves), and
// how a split of them over processes sums by it.
//
// The tree: the node of level l at leaf a (a a multiple of 2^l) holds the
// leaves [a, a + 2^l) (clipped to G) and adds its right half to its left;
// so the sum over 0..n-1 is ((x0 + x1) + (x2 + x3)) + ..., the left operand
// of n summands the first largest power of two below n of them. A process
// carries a contiguous range of leaves (any split: 3 + 3 + 2 of 8); it sums
// the maximal complete subtrees inside its range itself (TreeSegments) and
// the processes add those partial sums across along the same tree, so
// every split gives the same bits.
#pragma once

#include <cstdint>
#include <vector>

namespace cnnflow {

// Leaves [begin, end) of the tree.
struct LeafRange {
  int begin = 0, end = 0;
  int size() const { return end - begin; }
  bool operator==(const LeafRange&) const = default;
};

// The left operand's share of n > 1 summands: the largest power of two
// below n.
int LeftShare(int n);

// The maximal complete subtrees of the tree over `leaves` leaves that lie
// inside `range`, in leaf order: [0, 3) of 8 is [0, 2), [2, 3); [0, 8) of 8
// is itself. Their partial sums are what a process holding `range` sends.
std::vector<LeafRange> TreeSegments(LeafRange range, int leaves);

// Process p's share of `leaves` logical replicas over `processes` processes:
// contiguous, the first leaves % processes processes one more (8 over 3:
// 3 + 3 + 2).
LeafRange ProcessLeaves(int p, int processes, int leaves);

// What one process does to all-reduce across processes, given each
// process's leaf range (contiguous, in rank order, covering [0, G)): adds
// and messages level by level up the tree to the process that holds leaf
// 0, then the sum back down a binomial broadcast. Buffers are named by the
// partial (TreeSegments index of this process) they start as.
struct TreeRound {
  struct Recv {
    int from;     // process
    int partial;  // this process's partial that receives the sender's sum (added)
  };
  struct Send {
    int to;       // process
    int partial;  // this process's partial that is sent
  };
  struct Add {
    int into, from;  // this process's partials: into += from
  };
  std::vector<Add> local_adds;  // before this round's messages
  std::vector<Send> sends;
  std::vector<Recv> recvs;  // summed into their partial once received
};
struct TreeSchedule {
  std::vector<TreeRound> reduce;  // level by level; the total ends in partial 0 of process 0
  // The broadcast of process 0's total (partial 0) down a binomial tree of
  // processes: per round, whom this process sends to or receives from (-1: none).
  std::vector<int> broadcast_to, broadcast_from;
};
TreeSchedule PlanTreeAllReduce(const std::vector<LeafRange>& processes, int rank);

// Bytes one all-reduce of `count` floats sends, over all processes, by
// PlanTreeAllReduce (reduce and broadcast), and the most one process sends.
struct TreeTraffic {
  int64_t total_bytes = 0, max_process_bytes = 0;
};
TreeTraffic TreeAllReduceTraffic(const std::vector<LeafRange>& processes, int64_t count);

}  // namespace cnnflow
