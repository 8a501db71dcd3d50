// What a device backend provides to ops/device.cc. CMake compiles exactly one
// CUDA backend: ops/cuda/device_cuda.cc (CNNFLOW_WITH_CUDA) or
// ops/cuda/device_stub.cc (no CUDA: every call says so).
#pragma once

#include <cstddef>
#include <string>

#include "ops/device.h"

namespace cnnflow::detail {

bool CudaBuilt();
int CudaDeviceCountImpl();  // 0 when no driver or no GPU; never throws
MemoryPool& CudaPool(int index);
// Copies with at least one side on a GPU (kind deduced from the devices).
void CudaCopy(Device dst_device, void* dst, Device src_device, const void* src, size_t bytes);
void CudaZero(int index, void* ptr, size_t bytes);
std::string CudaDescription();

}  // namespace cnnflow::detail
