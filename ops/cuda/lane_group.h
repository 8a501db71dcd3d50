// The collectives of replicas that share one GPU (graph.devices lists it
// more than once: `[cuda:0, cuda:0]`), each in its own lane (ops/device.h:
// its own compute stream and pool). NCCL cannot put one GPU twice in a
// communicator, so these replicas reduce on the device with a kernel of
// ours, in the fixed order of the CPU collectives' reduction tree
// (ops/collectives/reduction_tree.h: ((x0 + x1) + (x2 + x3)) + x4, then
// times the scale), so the sum is bitwise the same for every replica and
// every run, and the same as the CPU replicas' of the same values.
//
// Calls enqueue (Collective::enqueues, as NCCL's): each member records an
// event on its stream where its buffer is ready; the last member to arrive
// makes its stream wait for every member's event and issues the kernel,
// which writes the result into every member's buffer, then records a done
// event. Wait(rank) blocks the host until the member's collectives are
// issued (a member that never arrives is a CollectiveTimeout after
// timeout_s, naming the collective), then makes the member's stream wait
// for them on the GPU. Calls are matched by order, as every Collective's; a
// member's calls come from its own lane (a GpuLaneScope of lane ==
// first_lane + rank: a tensor-parallel group of a GPU's lanes 2, 3 has
// first_lane 2). One process only: under mpirun a GPU listed twice is
// refused.
#pragma once

#include <memory>

#include "ops/collectives/collective.h"

namespace cnnflow {

std::unique_ptr<Collective> MakeLaneGroup(int device, int lanes, double timeout_s,
                                          int first_lane = 0);

}  // namespace cnnflow
