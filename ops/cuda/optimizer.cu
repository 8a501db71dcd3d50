// Fused optimizer steps on a GPU (ops/cuda/kernels.h): torch.optim.SGD and
// Adam/AdamW with ops/train/optimizer.cc's exact order of operations, over many
// parameters in a few launches; and the loss scaler's unscale-and-check of
// the gradients (UnscaleAndFindNonFinite), the same way. As PyTorch's multi_tensor_apply, a launch
// gets a table (by value, in its kernel parameters) of up to kMaxTensors
// parameters and kMaxBlocks (parameter, chunk) pairs, one block per chunk.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/kernels.h"

namespace cnnflow::cuda {
namespace {

constexpr int64_t kChunk = 16384;  // elements per block
constexpr int kMaxBlocks = 320;

// kDepth pointers per parameter: value, grad, state0[, state1]. Sized so a
// table stays under the classic 4 KB kernel-parameter limit.
template <int kDepth, int kMaxTensors>
struct TensorTable {
  float* ptr[kDepth][kMaxTensors];
  int64_t numel[kMaxTensors];
  unsigned char first[kMaxTensors];
  unsigned char block_tensor[kMaxBlocks];
  int block_chunk[kMaxBlocks];
};

using SgdTable = TensorTable<3, 48>;
using AdamTable = TensorTable<4, 36>;
using UnscaleTable = TensorTable<1, 110>;

struct SgdScalars {
  float wd, mu, one_minus_d, neg_lr;
  bool nesterov;
};

struct AdamScalars {
  float decay, l2, one_minus_b1, b2, one_minus_b2, eps, neg_step, bc2_sqrt;
};

static_assert(sizeof(SgdTable) + sizeof(SgdScalars) < 4000, "SGD table too large for a launch");
static_assert(sizeof(AdamTable) + sizeof(AdamScalars) < 4000, "Adam table too large for a launch");
static_assert(sizeof(UnscaleTable) + sizeof(float) + sizeof(int*) < 4000,
              "unscale table too large for a launch");

static_assert(sizeof(SgdScalars) <= kFusedStepScalarBytes &&
                  sizeof(AdamScalars) <= kFusedStepScalarBytes,
              "kFusedStepScalarBytes too small");

// ops/train/optimizer.cc's SgdRange, one element. The scalars are read from
// GPU memory, so a step captured as a CUDA graph takes each step's.
__global__ void SgdKernel(SgdTable t, const SgdScalars* scalars) {
  const SgdScalars s = *scalars;
  const int ti = t.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(t.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(t.numel[ti], begin + kChunk);
  float* __restrict__ p = t.ptr[0][ti];
  const float* __restrict__ grad = t.ptr[1][ti];
  float* __restrict__ buf = t.ptr[2][ti];  // null: no momentum
  const bool first = t.first[ti] != 0;
  for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
    float g = grad[k] + s.wd * p[k];
    if (buf != nullptr) {
      // torch: buf = clone(grad) at the first step, then mu * buf + (1 - d) * g.
      const float b = first ? g : buf[k] * s.mu + s.one_minus_d * g;
      buf[k] = b;
      g = s.nesterov ? g + s.mu * b : b;
    }
    p[k] = p[k] + s.neg_lr * g;
  }
}

// ops/train/optimizer.cc's AdamRange, one element.
__global__ void AdamKernel(AdamTable t, const AdamScalars* scalars) {
  const AdamScalars s = *scalars;
  const int ti = t.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(t.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(t.numel[ti], begin + kChunk);
  float* __restrict__ p = t.ptr[0][ti];
  const float* __restrict__ grad = t.ptr[1][ti];
  float* __restrict__ m = t.ptr[2][ti];
  float* __restrict__ v = t.ptr[3][ti];
  for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
    const float p0 = p[k];
    const float pk = p0 * s.decay;        // AdamW: p *= 1 - lr * wd (decay is 1 for Adam)
    const float g = grad[k] + s.l2 * pk;  // Adam: L2 on the grad (l2 is 0 for AdamW)
    const float mk = m[k] + s.one_minus_b1 * (g - m[k]);  // exp_avg.lerp_(grad, 1 - beta1)
    const float vk = v[k] * s.b2 + s.one_minus_b2 * g * g;
    m[k] = mk;
    v[k] = vk;
    const float denom = sqrtf(vk) / s.bc2_sqrt + s.eps;  // sqrtf, / : correctly rounded
    p[k] = p0 * s.decay + s.neg_step * (mk / denom);
  }
}

// g *= inv_scale for every element, and *found = 1 if any element was inf
// or NaN before. Every element is scaled whatever is found (as PyTorch's
// _amp_foreach_non_finite_check_and_unscale_; the step is skipped anyway).
__global__ void UnscaleKernel(UnscaleTable t, float inv_scale, int* found) {
  const int ti = t.block_tensor[blockIdx.x];
  const int64_t begin = static_cast<int64_t>(t.block_chunk[blockIdx.x]) * kChunk;
  const int64_t end = min(t.numel[ti], begin + kChunk);
  float* __restrict__ g = t.ptr[0][ti];
  bool bad = false;
  for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
    const float v = g[k];
    bad |= !isfinite(v);
    g[k] = v * inv_scale;
  }
  if (bad) *found = 1;  // any writer of the same 1 will do
}

// Packs the slots into tables and launches `launch(table, blocks)` whenever
// a table's parameters or blocks are full; a parameter whose chunks span
// two launches moves to entry 0 of the next table.
template <typename Table, int kDepth, int kMaxTensors, typename Launch>
void MultiTensorApply(const std::vector<ParamSlot>& slots, Launch launch) {
  Table t{};
  int nt = 0, nb = 0;
  auto set_entry = [&](int i, const ParamSlot& s) {
    float* ptrs[4] = {s.value, const_cast<float*>(s.grad), s.state0, s.state1};
    for (int d = 0; d < kDepth; ++d) t.ptr[d][i] = ptrs[d];
    t.numel[i] = s.numel;
    t.first[i] = s.first ? 1 : 0;
  };
  for (const ParamSlot& s : slots) {
    if (s.numel == 0) continue;
    set_entry(nt, s);
    const int64_t chunks = (s.numel + kChunk - 1) / kChunk;
    for (int64_t c = 0; c < chunks; ++c) {
      t.block_tensor[nb] = static_cast<unsigned char>(nt);
      t.block_chunk[nb] = static_cast<int>(c);
      ++nb;
      const bool last_chunk = c == chunks - 1;
      if (nb == kMaxBlocks || (last_chunk && nt + 1 == kMaxTensors)) {
        launch(t, nb);
        nb = 0;
        if (last_chunk) {
          nt = -1;  // a fresh table; ++nt below makes it 0
        } else {
          set_entry(0, s);
          nt = 0;
        }
      }
    }
    ++nt;
  }
  if (nb > 0) launch(t, nb);
}

void CheckSlots(const char* what, Device device, const std::vector<ParamSlot>& slots,
                bool need_state0, bool need_state1) {
  CNNFLOW_ENFORCE(device.is_cuda(), what, " on ", device.ToString(), ": not a GPU");
  for (size_t i = 0; i < slots.size(); ++i) {
    const ParamSlot& s = slots[i];
    CNNFLOW_ENFORCE(s.numel >= 0, what, ": slot ", i, " has ", s.numel, " elements");
    if (s.numel == 0) continue;
    CNNFLOW_ENFORCE(s.value != nullptr && s.grad != nullptr, what, ": slot ", i, " (", s.numel,
                    " elements) has no value or gradient");
    CNNFLOW_ENFORCE(!need_state0 || s.state0 != nullptr, what, ": slot ", i, " has no state0");
    CNNFLOW_ENFORCE(!need_state1 || s.state1 != nullptr, what, ": slot ", i, " has no state1");
  }
}

}  // namespace

void UploadSgdScalars(void* scalars, Device device, double lr, double momentum, double dampening,
                      bool nesterov, double weight_decay) {
  // The same float scalars as ops/train/optimizer.cc's SgdUpdate.
  SgdScalars s;
  s.wd = static_cast<float>(weight_decay);
  s.mu = static_cast<float>(momentum);
  s.one_minus_d = static_cast<float>(1 - dampening);
  s.neg_lr = static_cast<float>(-lr);
  s.nesterov = nesterov;
  // From pageable memory: the copy has taken `s` when it returns.
  CNNFLOW_CUDA_CHECK(cudaMemcpyAsync(scalars, &s, sizeof s, cudaMemcpyHostToDevice,
                                     CudaContext::For(device).stream()));
}

void LaunchSgdStep(Device device, const std::vector<ParamSlot>& slots, const void* scalars) {
  CheckSlots("SgdStep", device, slots, false, false);
  CudaContext& c = CudaContext::For(device);
  const auto* s = static_cast<const SgdScalars*>(scalars);
  MultiTensorApply<SgdTable, 3, 48>(slots, [&](const SgdTable& t, int blocks) {
    SgdKernel<<<blocks, kCudaThreads, 0, c.stream()>>>(t, s);
    CNNFLOW_CUDA_CHECK_LAUNCH();
  });
}

void UploadAdamScalars(void* scalars, Device device, double lr, double beta1, double beta2,
                       double eps, double weight_decay, bool decoupled, int64_t step) {
  CNNFLOW_ENFORCE(step >= 1, "AdamStep: step ", step, " (counted from 1)");
  // The same scalars as ops/train/optimizer.cc's Adam::Step / AdamUpdate.
  const double t = static_cast<double>(step);
  const double decay_factor = decoupled ? 1 - lr * weight_decay : 1;
  const double l2 = decoupled ? 0 : weight_decay;
  const double step_size = lr / (1 - std::pow(beta1, t));
  const double bc2_sqrt = std::sqrt(1 - std::pow(beta2, t));
  AdamScalars s;
  s.decay = static_cast<float>(decay_factor);
  s.l2 = static_cast<float>(l2);
  s.one_minus_b1 = static_cast<float>(1 - beta1);
  s.b2 = static_cast<float>(beta2);
  s.one_minus_b2 = static_cast<float>(1 - beta2);
  s.eps = static_cast<float>(eps);
  s.neg_step = static_cast<float>(-step_size);
  s.bc2_sqrt = static_cast<float>(bc2_sqrt);
  CNNFLOW_CUDA_CHECK(cudaMemcpyAsync(scalars, &s, sizeof s, cudaMemcpyHostToDevice,
                                     CudaContext::For(device).stream()));
}

void LaunchAdamStep(Device device, const std::vector<ParamSlot>& slots, const void* scalars) {
  CheckSlots("AdamStep", device, slots, true, true);
  CudaContext& c = CudaContext::For(device);
  const auto* s = static_cast<const AdamScalars*>(scalars);
  MultiTensorApply<AdamTable, 4, 36>(slots, [&](const AdamTable& tab, int blocks) {
    AdamKernel<<<blocks, kCudaThreads, 0, c.stream()>>>(tab, s);
    CNNFLOW_CUDA_CHECK_LAUNCH();
  });
}

bool UnscaleAndFindNonFinite(const std::vector<Tensor*>& grads, float inv_scale) {
  std::vector<ParamSlot> slots;
  slots.reserve(grads.size());
  Device device;
  bool have_device = false;
  for (size_t i = 0; i < grads.size(); ++i) {
    const Tensor* g = grads[i];
    CNNFLOW_ENFORCE(g != nullptr && g->defined(), "UnscaleAndFindNonFinite: gradient ", i,
                    " is missing");
    if (!g->device().is_cuda() || g->dtype() != DType::kF32) {
      throw Error(StrCat("UnscaleAndFindNonFinite: gradient ", i, " ", g->shape(), " is ",
                         DTypeName(g->dtype()), " on ", g->device().ToString(),
                         "; it takes f32 GPU tensors"));
    }
    CNNFLOW_ENFORCE(g->is_contiguous(), "UnscaleAndFindNonFinite: gradient ", i, " ", g->shape(),
                    " is not contiguous");
    if (!have_device) {
      device = g->device();
      have_device = true;
    }
    CNNFLOW_ENFORCE(g->device() == device, "UnscaleAndFindNonFinite: gradient ", i, " is on ",
                    g->device().ToString(), ", gradient 0 on ", device.ToString());
    ParamSlot s;
    s.value = g->data<float>();
    s.numel = g->numel();
    slots.push_back(s);
  }
  if (!have_device) return false;
  CudaContext& c = CudaContext::For(device);
  Storage flag(device, sizeof(int));
  int* found = static_cast<int*>(flag.data());
  CNNFLOW_CUDA_CHECK(cudaMemsetAsync(found, 0, sizeof(int), c.stream()));
  MultiTensorApply<UnscaleTable, 1, 110>(slots, [&](const UnscaleTable& t, int blocks) {
    UnscaleKernel<<<blocks, kCudaThreads, 0, c.stream()>>>(t, inv_scale, found);
    CNNFLOW_CUDA_CHECK_LAUNCH();
  });
  int host = 0;
  CNNFLOW_CUDA_CHECK(
      cudaMemcpyAsync(&host, found, sizeof(int), cudaMemcpyDeviceToHost, c.stream()));
  c.Synchronize();
  return host != 0;
}

}  // namespace cnnflow::cuda
