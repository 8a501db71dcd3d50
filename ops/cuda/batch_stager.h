// Batches to a GPU ahead of their use (the host-to-device half of
// prefetching, as DALI and PyTorch's pin_memory + non_blocking copies do):
// the rows are copied into a pinned host buffer, then to the GPU on a copy
// stream of the stager's own, so the copy of batch k + 1 runs while the GPU
// computes batch k. The compute stream waits for the copy on the GPU (an
// event), never the host.
//
// Slots (a pinned buffer and a device buffer each) are reused once the
// compute stream is past the work that read them (Release records an
// event that the next copy into the slot waits for). A slot is taken per
// staged batch and a new one made when all are taken, so there are as many
// as batches in flight (the prefetch depth).
//
// Plain C++, so code built without CUDA includes it: ops/cuda/batch_stager.cc
// implements it, ops/cuda/device_stub.cc in a build without CUDA.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "ops/loss.h"
#include "ops/tensor.h"

namespace cnnflow {

class BatchStager {
 public:
  explicit BatchStager(Device device);
  ~BatchStager();
  BatchStager(const BatchStager&) = delete;
  BatchStager& operator=(const BatchStager&) = delete;

  struct Slot;
  // One batch on the GPU. Use it only after WaitForCopy(); call Release()
  // once every kernel that reads it has been issued (or drop it unused).
  class Staged {
   public:
    const Tensor& inputs() const { return inputs_; }
    const int64_t* labels() const { return labels_; }  // device memory
    // The mixed targets (mixup, cutmix) in device memory; null when none
    // were staged.
    const LabelMix* mix() const { return mix_.other != nullptr ? &mix_ : nullptr; }
    // Makes the device's compute stream wait for the copy.
    void WaitForCopy() const;
    void Release();
    ~Staged() {
      try {
        Release();
      } catch (...) {  // a failing GPU: the run is ending with its own error
      }
    }

   private:
    friend class BatchStager;
    BatchStager* owner_ = nullptr;
    Slot* slot_ = nullptr;
    Tensor inputs_;
    const int64_t* labels_ = nullptr;
    LabelMix mix_;
  };

  // Starts copying `inputs` (host, contiguous) and its `labels` (n =
  // inputs.dim(0) values) to the GPU, with `mix` (host: n other labels and
  // n weights) in the same copy when not null; returns at once.
  std::unique_ptr<Staged> Stage(const Tensor& inputs, const int64_t* labels,
                                const LabelMix* mix = nullptr);

  Device device() const { return device_; }
  int slots() const;

 private:
  void Free(Slot* slot);

  Device device_;
  int lane_;                     // the GPU lane it was made in (ops/device.h): its replica's
  void* copy_stream_ = nullptr;  // cudaStream_t
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::vector<Slot*> free_;
};

}  // namespace cnnflow
