// Softmax cross-entropy on a GPU (ops/cuda/kernels.h): the math of
// ops/cpu/softmax_cross_entropy.cc (double accumulation, label smoothing,
// mixed labels (LabelMix: mixup, cutmix), grad_scale < 0 = 1/N) with a warp
// per row, on f32, f16 or bf16 logits
// (read exactly into f32; dlogits rounded once into the logits' type). Deterministic: each row's
// loss goes to a per-row buffer that one block then sums in a fixed order (no float atomics); the
// sums and the first bad label come back in one small copy into pinned memory, which the host
// reads when it needs them (PendingLoss).
#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <type_traits>
#include <vector>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"
#include "ops/cuda/elementwise.h"
#include "ops/cuda/kernels.h"

namespace cnnflow::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = kCudaThreads / kWarp;
constexpr int kReduceThreads = 256;

// What comes back to the host. bad_row starts at all ones (memset) and
// takes the smallest row with a label outside [0, K) (or, with a mix, a
// mixed-in label outside it or a weight outside [0, 1]).
struct LossOut {
  double loss_sum;
  long long correct;
  unsigned long long bad_row;
  long long bad_label;
  long long bad_other;  // with a mix: the bad row's mixed-in label and weight
  float bad_weight;
};
static_assert(sizeof(LossOut) <= kLossResultBytes, "kLossResultBytes too small");

struct LossScalars {
  double scale;  // of the gradient
  double eps;    // label smoothing
  double off;    // target mass of every class: eps / K
  double on;     // of the label: 1 - eps + off
};

// The larger value; on a tie the lower index (the CPU's first argmax).
__device__ __forceinline__ void ArgMaxCombine(float& v, int64_t& i, float v2, int64_t i2) {
  if (v2 > v || (v2 == v && i2 < i)) {
    v = v2;
    i = i2;
  }
}

// A butterfly sum: every lane ends with the same value (a + b == b + a).
__device__ __forceinline__ double WarpSum(double v) {
  for (int s = kWarp / 2; s > 0; s /= 2) v += __shfl_xor_sync(0xffffffffu, v, s);
  return v;
}

// Whether row r's mixed-in label and weight are usable (as the CPU checks).
__device__ __forceinline__ bool MixOk(const LabelMix& mix, int64_t r, int64_t k) {
  if (mix.other == nullptr) return true;
  const int64_t y2 = mix.other[r];
  const float w = mix.weight[r];
  return y2 >= 0 && y2 < k && w >= 0 && w <= 1;  // false for a NaN weight
}

template <typename T>
__global__ void SoftmaxCrossEntropyRows(const T* z, const int64_t* labels, LabelMix mix, T* dz,
                                        int64_t n, int64_t k, LossScalars s, double* row_loss,
                                        int* row_correct, LossOut* out) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kRowsPerBlock;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp; r < n;
       r += warps) {
    const T* row = z + r * k;
    T* drow = dz != nullptr ? dz + r * k : nullptr;
    const int64_t y = labels[r];
    // A bad label: reported by the host after the wait; the row's dlogits stay unwritten.
    if (y < 0 || y >= k || !MixOk(mix, r, k)) {  // warp-uniform
      if (lane == 0) {
        atomicMin(&out->bad_row, static_cast<unsigned long long>(r));
        row_loss[r] = 0;
        row_correct[r] = 0;
      }
      continue;
    }
    // Lane 0 starts at element 0 and only moves to real elements, so its
    // index is valid whatever the values (NaN, -inf); all lanes take it.
    float best = lane < k ? ToFloat(row[lane]) : -INFINITY;
    int64_t arg = lane < k ? lane : LLONG_MAX;
    for (int64_t j = lane + kWarp; j < k; j += kWarp) ArgMaxCombine(best, arg, ToFloat(row[j]), j);
    for (int s2 = kWarp / 2; s2 > 0; s2 /= 2) {
      const float v2 = __shfl_xor_sync(0xffffffffu, best, s2);
      const int64_t i2 = __shfl_xor_sync(0xffffffffu, arg, s2);
      ArgMaxCombine(best, arg, v2, i2);
    }
    arg = __shfl_sync(0xffffffffu, arg, 0);
    const double mx = static_cast<double>(ToFloat(row[arg]));
    double sum_exp = 0, sum_z = 0;
    for (int64_t j = lane; j < k; j += kWarp) {
      const double v = static_cast<double>(ToFloat(row[j]));
      sum_exp += exp(v - mx);
      sum_z += v;
    }
    sum_exp = WarpSum(sum_exp);
    sum_z = WarpSum(sum_z);
    const double lse = mx + log(sum_exp);
    // The mixed-in label and its weight, as the CPU takes them.
    int64_t y2 = y;
    double w2 = 0;
    if (mix.other != nullptr) {
      y2 = mix.other[r];
      w2 = 1.0 - static_cast<double>(mix.weight[r]);
    }
    if (lane == 0) {
      // -sum_j target_j * log p_j with log p_j = z_j - lse.
      double nll = lse - static_cast<double>(ToFloat(row[y]));
      if (mix.other != nullptr) {
        nll = (1.0 - w2) * nll + w2 * (lse - static_cast<double>(ToFloat(row[y2])));
      }
      row_loss[r] =
          s.eps > 0 ? (1.0 - s.eps) * nll + s.off * (static_cast<double>(k) * lse - sum_z) : nll;
      row_correct[r] = arg == (w2 > 0.5 ? y2 : y) ? 1 : 0;
    }
    if (drow != nullptr) {
      for (int64_t j = lane; j < k; j += kWarp) {
        const double p = exp(static_cast<double>(ToFloat(row[j])) - lse);
        double target = j == y ? s.on : s.off;
        if (mix.other != nullptr) {
          target = s.off;
          if (j == y) target += (1.0 - s.eps) * (1.0 - w2);
          if (j == y2) target += (1.0 - s.eps) * w2;
        }
        drow[j] = FromFloat<T>(static_cast<float>(s.scale * (p - target)));
      }
    }
  }
}

// One block: thread t sums rows t, t + T, ... in order, then a tree over the
// threads; the order depends on n alone, so the sum is the same every run.
__global__ void SumRows(const double* row_loss, const int* row_correct, const int64_t* labels,
                        LabelMix mix, int64_t n, LossOut* out) {
  __shared__ double loss[kReduceThreads];
  __shared__ long long correct[kReduceThreads];
  const int t = threadIdx.x;
  double l = 0;
  long long c = 0;
  for (int64_t r = t; r < n; r += kReduceThreads) {
    l += row_loss[r];
    c += row_correct[r];
  }
  loss[t] = l;
  correct[t] = c;
  __syncthreads();
  for (int s = kReduceThreads / 2; s > 0; s /= 2) {
    if (t < s) {
      loss[t] += loss[t + s];
      correct[t] += correct[t + s];
    }
    __syncthreads();
  }
  if (t == 0) {
    out->loss_sum = loss[0];
    out->correct = correct[0];
    const unsigned long long bad = out->bad_row;
    const bool any = bad < static_cast<unsigned long long>(n);
    out->bad_label = any ? labels[bad] : 0;
    out->bad_other = any && mix.other != nullptr ? mix.other[bad] : 0;
    out->bad_weight = any && mix.weight != nullptr ? mix.weight[bad] : 0.f;
  }
}

// Pinned landing places for results on their way back, with the event that
// says they arrived; reused (cudaHostAlloc and event creation are slow). An
// event belongs to the device current at its creation and can be recorded
// only on that device's streams, so the free slots are kept per device.
struct ResultSlot {
  int device = 0;
  LossOut* host = nullptr;
  cudaEvent_t done = nullptr;
};

std::mutex slots_mu;
// By device index; never freed.
std::map<int, std::vector<ResultSlot*>>* free_slots = new std::map<int, std::vector<ResultSlot*>>();

// A slot of `device`, which must be the current device.
ResultSlot* AcquireSlot(int device) {
  {
    std::lock_guard<std::mutex> lock(slots_mu);
    std::vector<ResultSlot*>& free = (*free_slots)[device];
    if (!free.empty()) {
      ResultSlot* s = free.back();
      free.pop_back();
      return s;
    }
  }
  auto s = std::make_unique<ResultSlot>();
  s->device = device;
  CNNFLOW_CUDA_CHECK(
      cudaHostAlloc(reinterpret_cast<void**>(&s->host), sizeof(LossOut), cudaHostAllocPortable));
  CNNFLOW_CUDA_CHECK(cudaEventCreateWithFlags(&s->done, cudaEventDisableTiming));
  return s.release();
}

void ReleaseSlot(ResultSlot* s) {
  std::lock_guard<std::mutex> lock(slots_mu);
  (*free_slots)[s->device].push_back(s);
}

// Throws unless `p` (for logits on `device`) is memory a kernel on that
// device reads: device memory of that GPU, managed or pinned memory.
void CheckReadable(const void* p, const Tensor& logits, const char* what) {
  cudaPointerAttributes attr{};
  CNNFLOW_CUDA_CHECK(cudaPointerGetAttributes(&attr, p));
  if (attr.type == cudaMemoryTypeUnregistered) {
    throw Error(StrCat("GPU softmax cross-entropy: the ", what, " of logits ", logits.shape(),
                       " are in pageable host memory; they must be in GPU memory"));
  }
  // Another GPU's memory is not readable here (no peer access is enabled).
  if (attr.type == cudaMemoryTypeDevice && attr.device != logits.device().index) {
    throw Error(StrCat("GPU softmax cross-entropy: the ", what, " of logits ", logits.shape(),
                       " on ", logits.device().ToString(), " are on cuda:", attr.device));
  }
}

}  // namespace

struct PendingLoss::Impl {
  int64_t rows = 0, classes = 0;
  bool mixed = false;
  Shape shape;
  ResultSlot* slot = nullptr;
};

void SoftmaxCrossEntropyInto(void* result, const Tensor& logits, const int64_t* labels,
                             Tensor* dlogits, double grad_scale, double label_smoothing,
                             const LabelMix* mix) {
  if (logits.rank() != 2) {
    throw ShapeError(StrCat("softmax cross-entropy expects logits [N, K], got ", logits.shape()));
  }
  const DType type = logits.dtype();
  if (!logits.device().is_cuda() ||
      (type != DType::kF32 && type != DType::kF16 && type != DType::kBF16)) {
    throw Error(StrCat("GPU softmax cross-entropy takes f32, f16 or bf16 logits on a GPU, got ",
                       DTypeName(logits.dtype()), " on ", logits.device().ToString()));
  }
  CNNFLOW_ENFORCE(logits.is_contiguous(), "softmax cross-entropy: logits ", logits.shape(),
                  " are not contiguous");
  const int64_t n = logits.dim(0), k = logits.dim(1);
  CNNFLOW_ENFORCE(k > 0, "softmax cross-entropy over ", k, " classes");
  CNNFLOW_ENFORCE(label_smoothing >= 0.0 && label_smoothing <= 1.0,
                  "label_smoothing must be in [0, 1], got ", label_smoothing);
  if (dlogits != nullptr) {
    CNNFLOW_ENFORCE(dlogits->shape() == logits.shape() && dlogits->dtype() == logits.dtype() &&
                        dlogits->device() == logits.device() && dlogits->is_contiguous(),
                    "dlogits ", dlogits->shape(), " ", DTypeName(dlogits->dtype()), " on ",
                    dlogits->device().ToString(), " for logits ", logits.shape(), " ",
                    DTypeName(logits.dtype()), " on ", logits.device().ToString());
  }
  if (n == 0) return;
  CudaContext& c = CudaContext::For(logits.device());
  // Where the pointers point is checked on the host, which a stream that
  // is being captured (a CUDA graph) may not ask: its step was checked
  // when it ran before the capture.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  CNNFLOW_CUDA_CHECK(cudaStreamIsCapturing(c.stream(), &capturing));
  const bool check = capturing == cudaStreamCaptureStatusNone;
  CNNFLOW_ENFORCE(labels != nullptr, "softmax cross-entropy: no labels for ", n, " rows");
  if (check) CheckReadable(labels, logits, "labels");
  // Mixed targets in device memory; none (nulls): the labels alone.
  LabelMix dmix;
  if (mix != nullptr) {
    CNNFLOW_ENFORCE(mix->other != nullptr && mix->weight != nullptr,
                    "softmax cross-entropy: a label mix without its labels or weights for ", n,
                    " rows");
    if (check) {
      CheckReadable(mix->other, logits, "mixed-in labels");
      CheckReadable(mix->weight, logits, "mix weights");
    }
    dmix = *mix;
  }
  LossScalars s;
  s.scale = grad_scale < 0 ? 1.0 / static_cast<double>(n) : grad_scale;
  s.eps = label_smoothing;
  s.off = s.eps / static_cast<double>(k);
  s.on = 1.0 - s.eps + s.off;

  // Scratch: the per-row losses and correct flags. Back to the pool at the
  // end of this call: only work on this stream reuses it.
  const size_t bytes = static_cast<size_t>(n) * (sizeof(double) + sizeof(int));
  Storage scratch(logits.device(), bytes);
  auto* out = static_cast<LossOut*>(result);
  auto* row_loss = static_cast<double*>(scratch.data());
  auto* row_correct = reinterpret_cast<int*>(row_loss + n);
  CNNFLOW_CUDA_CHECK(cudaMemsetAsync(&out->bad_row, 0xff, sizeof(out->bad_row), c.stream()));
  const int64_t blocks64 = (n + kRowsPerBlock - 1) / kRowsPerBlock;
  const unsigned blocks = static_cast<unsigned>(blocks64 < 65535 * 4 ? blocks64 : 65535 * 4);
  auto launch = [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    SoftmaxCrossEntropyRows<T><<<blocks, kCudaThreads, 0, c.stream()>>>(
        static_cast<const T*>(logits.raw_data()), labels, dmix,
        dlogits != nullptr ? static_cast<T*>(dlogits->raw_data()) : nullptr, n, k, s, row_loss,
        row_correct, out);
    CNNFLOW_CUDA_CHECK_LAUNCH();
  };
  switch (type) {
    case DType::kF16:
      launch(static_cast<__half*>(nullptr));
      break;
    case DType::kBF16:
      launch(static_cast<__nv_bfloat16*>(nullptr));
      break;
    default:
      launch(static_cast<float*>(nullptr));
      break;
  }
  SumRows<<<1, kReduceThreads, 0, c.stream()>>>(row_loss, row_correct, labels, dmix, n, out);
  CNNFLOW_CUDA_CHECK_LAUNCH();
}

std::unique_ptr<PendingLoss> ReadBackLoss(const void* result, Device device,
                                          const Shape& logits_shape, bool mixed) {
  auto impl = std::make_unique<PendingLoss::Impl>();
  impl->rows = logits_shape[0];
  impl->classes = logits_shape[1];
  impl->shape = logits_shape;
  impl->mixed = mixed;
  if (impl->rows == 0) return std::make_unique<PendingLoss>(std::move(impl));
  CudaContext& c = CudaContext::For(device);
  impl->slot = AcquireSlot(c.device());
  CNNFLOW_CUDA_CHECK(cudaMemcpyAsync(impl->slot->host, result, sizeof(LossOut),
                                     cudaMemcpyDeviceToHost, c.stream()));
  CNNFLOW_CUDA_CHECK(cudaEventRecord(impl->slot->done, c.stream()));
  return std::make_unique<PendingLoss>(std::move(impl));
}

std::unique_ptr<PendingLoss> SoftmaxCrossEntropyAsync(const Tensor& logits, const int64_t* labels,
                                                      Tensor* dlogits, double grad_scale,
                                                      double label_smoothing, const LabelMix* mix) {
  // The result's own block: the read-back is issued before it goes back to
  // the pool, and only work on this stream reuses it.
  Storage result(logits.device(), kLossResultBytes);
  cuda::SoftmaxCrossEntropyInto(result.data(), logits, labels, dlogits, grad_scale, label_smoothing,
                                mix);
  return cuda::ReadBackLoss(result.data(), logits.device(), logits.shape(), mix != nullptr);
}

PendingLoss::PendingLoss(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

PendingLoss::~PendingLoss() {
  if (impl_ && impl_->slot) {
    cudaEventSynchronize(impl_->slot->done);  // the copy must not land in a reused slot
    ReleaseSlot(impl_->slot);
  }
}

LossResult PendingLoss::Get() {
  if (done_) return result_;
  done_ = true;
  if (impl_->slot == nullptr) return result_;  // no rows
  CNNFLOW_CUDA_CHECK(cudaEventSynchronize(impl_->slot->done));
  const LossOut host = *impl_->slot->host;
  ReleaseSlot(impl_->slot);
  impl_->slot = nullptr;
  const int64_t n = impl_->rows;
  const bool bad_label =
      host.bad_label < 0 || host.bad_label >= static_cast<long long>(impl_->classes);
  if (host.bad_row < static_cast<unsigned long long>(n) && impl_->mixed && !bad_label) {
    throw Error(StrCat("mixed label ", host.bad_other, " with weight ", host.bad_weight,
                       " at index ", host.bad_row, " is out of range ([0, ", impl_->classes,
                       "), [0, 1])"));
  }
  if (host.bad_row < static_cast<unsigned long long>(n)) {
    throw Error(StrCat("label ", host.bad_label, " at index ", host.bad_row,
                       " is out of range [0, ", impl_->classes, ") for logits ", impl_->shape));
  }
  result_.loss = host.loss_sum / static_cast<double>(n);
  result_.correct = host.correct;
  return result_;
}

LossResult SoftmaxCrossEntropy(const Tensor& logits, const int64_t* labels, Tensor* dlogits,
                               double grad_scale, double label_smoothing, const LabelMix* mix) {
  return cuda::SoftmaxCrossEntropyAsync(logits, labels, dlogits, grad_scale, label_smoothing, mix)
      ->Get();
}

}  // namespace cnnflow::cuda
