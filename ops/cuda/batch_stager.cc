#include "ops/cuda/batch_stager.h"

#include <cstring>

#include "ops/cuda/context.h"
#include "ops/cuda/cuda_check.h"

namespace cnnflow {

struct BatchStager::Slot {
  size_t capacity = 0;  // bytes of inputs + labels (+ a mix's other labels and weights)
  void* pinned = nullptr;
  std::shared_ptr<Storage> device;
  cudaEvent_t copied = nullptr;    // the copy into `device` is done
  cudaEvent_t released = nullptr;  // the compute stream is past its readers
  bool copy_issued = false;
  bool release_recorded = false;
};

namespace {
size_t Align(size_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }
}  // namespace

BatchStager::BatchStager(Device device) : device_(device), lane_(CurrentGpuLane()) {
  CNNFLOW_ENFORCE(device.is_cuda(), "BatchStager stages to a GPU, not ", device.ToString());
  CudaContext::For(device);
  cudaStream_t s = nullptr;
  CNNFLOW_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  copy_stream_ = s;
}

BatchStager::~BatchStager() {
  const GpuLaneScope lane(lane_);
  cudaSetDevice(device_.index);
  cudaStreamSynchronize(static_cast<cudaStream_t>(copy_stream_));
  // Device buffers go back to the pool: the compute stream must be past them.
  cudaStreamSynchronize(CudaContext::Get(device_.index).stream());
  for (auto& s : slots_) {
    if (s->pinned) cudaFreeHost(s->pinned);
    if (s->copied) cudaEventDestroy(s->copied);
    if (s->released) cudaEventDestroy(s->released);
  }
  cudaStreamDestroy(static_cast<cudaStream_t>(copy_stream_));
}

int BatchStager::slots() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(slots_.size());
}

std::unique_ptr<BatchStager::Staged> BatchStager::Stage(const Tensor& inputs, const int64_t* labels,
                                                        const LabelMix* mix) {
  CNNFLOW_ENFORCE(inputs.device().is_cpu() && inputs.is_contiguous(),
                  "BatchStager stages contiguous host tensors, got one on ",
                  inputs.device().ToString());
  const int64_t n = inputs.dim(0);
  // One buffer: rows | labels | (mix) other labels | (mix) weights.
  const size_t x_bytes = Align(inputs.nbytes());
  const size_t label_bytes = Align(static_cast<size_t>(n) * sizeof(int64_t));
  const size_t weight_bytes = Align(static_cast<size_t>(n) * sizeof(float));
  const size_t need = x_bytes + label_bytes + (mix != nullptr ? label_bytes + weight_bytes : 0);
  const GpuLaneScope lane(lane_);
  CudaContext& ctx = CudaContext::For(device_);
  const auto stream = static_cast<cudaStream_t>(copy_stream_);

  Slot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    } else {
      slots_.push_back(std::make_unique<Slot>());
      slot = slots_.back().get();
    }
  }
  if (slot->capacity < need) {
    if (slot->copy_issued) CNNFLOW_CUDA_CHECK(cudaEventSynchronize(slot->copied));
    if (slot->release_recorded) CNNFLOW_CUDA_CHECK(cudaEventSynchronize(slot->released));
    if (slot->pinned) CNNFLOW_CUDA_CHECK(cudaFreeHost(slot->pinned));
    slot->pinned = nullptr;
    slot->device.reset();
    CNNFLOW_CUDA_CHECK(cudaHostAlloc(&slot->pinned, need, cudaHostAllocPortable));
    // A pool block may have been released with compute work still pending on
    // it; the copy stream is not ordered after that work, so wait for it
    // (once per slot, not per batch). Allocate first, then wait: the replica's
    // thread may free a block between a wait and an allocation, and only work
    // issued before the wait is covered.
    slot->device = std::make_shared<Storage>(device_, need);
    ctx.Synchronize();
    if (!slot->copied)
      CNNFLOW_CUDA_CHECK(cudaEventCreateWithFlags(&slot->copied, cudaEventDisableTiming));
    if (!slot->released)
      CNNFLOW_CUDA_CHECK(cudaEventCreateWithFlags(&slot->released, cudaEventDisableTiming));
    slot->capacity = need;
    slot->copy_issued = slot->release_recorded = false;
  }
  // The pinned buffer is free once its last copy is done (long ago, mostly).
  if (slot->copy_issued) CNNFLOW_CUDA_CHECK(cudaEventSynchronize(slot->copied));
  auto* host = static_cast<char*>(slot->pinned);
  std::memcpy(host, inputs.raw_data(), inputs.nbytes());
  std::memcpy(host + x_bytes, labels, static_cast<size_t>(n) * sizeof(int64_t));
  if (mix != nullptr) {
    std::memcpy(host + x_bytes + label_bytes, mix->other, static_cast<size_t>(n) * sizeof(int64_t));
    std::memcpy(host + x_bytes + 2 * label_bytes, mix->weight,
                static_cast<size_t>(n) * sizeof(float));
  }
  // The device buffer is free once the compute stream is past its readers.
  if (slot->release_recorded) CNNFLOW_CUDA_CHECK(cudaStreamWaitEvent(stream, slot->released, 0));
  auto* dev = static_cast<char*>(slot->device->data());
  CNNFLOW_CUDA_CHECK(cudaMemcpyAsync(dev, host, need, cudaMemcpyHostToDevice, stream));
  CNNFLOW_CUDA_CHECK(cudaEventRecord(slot->copied, stream));
  slot->copy_issued = true;

  auto staged = std::make_unique<Staged>();
  staged->owner_ = this;
  staged->slot_ = slot;
  staged->inputs_ = Tensor::FromStorage(slot->device, inputs.shape(), inputs.dtype());
  staged->labels_ = reinterpret_cast<const int64_t*>(dev + x_bytes);
  if (mix != nullptr) {
    staged->mix_.other = reinterpret_cast<const int64_t*>(dev + x_bytes + label_bytes);
    staged->mix_.weight = reinterpret_cast<const float*>(dev + x_bytes + 2 * label_bytes);
  }
  return staged;
}

void BatchStager::Staged::WaitForCopy() const {
  CNNFLOW_ENFORCE(slot_ != nullptr, "a released batch was used");
  const GpuLaneScope lane(owner_->lane_);
  CudaContext& ctx = CudaContext::For(owner_->device_);
  CNNFLOW_CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), slot_->copied, 0));
}

void BatchStager::Staged::Release() {
  if (slot_ == nullptr) return;
  const GpuLaneScope lane(owner_->lane_);
  CudaContext& ctx = CudaContext::For(owner_->device_);
  if (cudaEventRecord(slot_->released, ctx.stream()) == cudaSuccess) {
    slot_->release_recorded = true;
    owner_->Free(slot_);
  }  // else the slot is not reused: the run is failing anyway
  slot_ = nullptr;
}

void BatchStager::Free(Slot* slot) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(slot);
}

}  // namespace cnnflow
