#include "ops/collectives/reduction_tree.h"

#include <algorithm>

#include "ops/error.h"

namespace cnnflow {

int LeftShare(int n) {
  int left = 1;
  while (left * 2 < n) left *= 2;
  return left;
}

std::vector<LeafRange> TreeSegments(LeafRange range, int leaves) {
  CNNFLOW_ENFORCE(range.begin >= 0 && range.begin <= range.end && range.end <= leaves, "leaves [",
                  range.begin, ", ", range.end, ") outside a tree of ", leaves);
  std::vector<LeafRange> out;
  for (int a = range.begin; a < range.end;) {
    // The highest node starting at a that fits in the range; a node clipped
    // by the tree's end holds the same leaves as its left child, so take
    // the lowest level that reaches its end.
    int width = 1;
    while (a % (2 * width) == 0 && 2 * width < 2 * leaves &&
           std::min(a + 2 * width, leaves) <= range.end && a + width < leaves) {
      width *= 2;
    }
    const int end = std::min(a + width, leaves);
    out.push_back({a, end});
    a = end;
  }
  return out;
}

LeafRange ProcessLeaves(int p, int processes, int leaves) {
  CNNFLOW_ENFORCE(processes > 0 && p >= 0 && p < processes, "process ", p, " of ", processes);
  const int base = leaves / processes, extra = leaves % processes;
  const int begin = p * base + std::min(p, extra);
  return {begin, begin + base + (p < extra ? 1 : 0)};
}

namespace {

// The index of this process's partial that starts at leaf a.
int PartialAt(const std::vector<LeafRange>& partials, int a) {
  for (size_t i = 0; i < partials.size(); ++i) {
    if (partials[i].begin == a) return static_cast<int>(i);
  }
  CNNFLOW_ENFORCE(false, "no partial sum starts at leaf ", a);
  return -1;
}

}  // namespace

TreeSchedule PlanTreeAllReduce(const std::vector<LeafRange>& processes, int rank) {
  const int nproc = static_cast<int>(processes.size());
  CNNFLOW_ENFORCE(nproc > 0 && rank >= 0 && rank < nproc, "rank ", rank, " of ", nproc);
  const int leaves = processes.back().end;
  std::vector<int> owner(leaves, -1);
  for (int p = 0; p < nproc; ++p) {
    CNNFLOW_ENFORCE(
        processes[p].begin == (p == 0 ? 0 : processes[p - 1].end) && processes[p].size() > 0,
        "process ", p, "'s leaves [", processes[p].begin, ", ", processes[p].end,
        ") do not follow the previous process's");
    for (int a = processes[p].begin; a < processes[p].end; ++a) owner[a] = p;
  }
  const std::vector<LeafRange> mine = TreeSegments(processes[rank], leaves);
  TreeSchedule s;
  for (int width = 2; width / 2 < leaves; width *= 2) {
    TreeRound round;
    for (int a = 0; a < leaves; a += width) {
      const int right = a + width / 2, end = std::min(a + width, leaves);
      if (right >= leaves || owner[a] == owner[end - 1]) continue;  // inside one process
      const int left_owner = owner[a], right_owner = owner[right];
      if (left_owner == rank && right_owner == rank) {
        round.local_adds.push_back({PartialAt(mine, a), PartialAt(mine, right)});
      } else if (left_owner == rank) {
        round.recvs.push_back({right_owner, PartialAt(mine, a)});
      } else if (right_owner == rank) {
        round.sends.push_back({left_owner, PartialAt(mine, right)});
      }
    }
    s.reduce.push_back(std::move(round));
  }
  for (int d = nproc > 1 ? LeftShare(nproc) : 0; d >= 1; d /= 2) {
    int to = -1, from = -1;
    if (rank % (2 * d) == 0 && rank + d < nproc) to = rank + d;
    if (rank % (2 * d) == d) from = rank - d;
    s.broadcast_to.push_back(to);
    s.broadcast_from.push_back(from);
  }
  return s;
}

TreeTraffic TreeAllReduceTraffic(const std::vector<LeafRange>& processes, int64_t count) {
  TreeTraffic t;
  const auto bytes = count * static_cast<int64_t>(sizeof(float));
  for (int p = 0; p < static_cast<int>(processes.size()); ++p) {
    const TreeSchedule s = PlanTreeAllReduce(processes, p);
    int64_t sent = 0;
    for (const TreeRound& r : s.reduce) sent += static_cast<int64_t>(r.sends.size()) * bytes;
    for (int to : s.broadcast_to) sent += to >= 0 ? bytes : 0;
    t.total_bytes += sent;
    t.max_process_bytes = std::max(t.max_process_bytes, sent);
  }
  return t;
}

}  // namespace cnnflow
