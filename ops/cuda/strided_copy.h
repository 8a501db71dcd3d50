// Runs of floats between two strided layouts on a GPU, for the tensor
// parallel shards (ops/parallel/tensor_parallel.cc): a member's channels or
// rows cut out of a whole tensor, put back into it, or its gradients added
// into the whole one. Plain C++, so host code calls it; a build without
// CUDA has a stub (ops/cuda/device_stub.cc).
#pragma once

#include <cstdint>

#include "ops/device.h"

namespace cnnflow::cuda {

// For each of `height` runs: dst[i * dst_pitch + j] = alpha * src[i *
// src_pitch + j] for j < width (added to dst with `accumulate`), on the
// calling thread's lane of `device` (after the work issued there).
void StridedCopy(Device device, float* dst, int64_t dst_pitch, const float* src, int64_t src_pitch,
                 int64_t width, int64_t height, float alpha, bool accumulate);

}  // namespace cnnflow::cuda
