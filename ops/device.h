// Devices and their memory: `cpu:K` is a CPU replica (host memory),
// `cuda:K` a GPU. Memory comes from a caching pool per device, so the
// steady state of training allocates nothing from the system.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace cnnflow {

enum class DeviceType { kCpu, kCuda };

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device Cpu(int index = 0) { return {DeviceType::kCpu, index}; }
  static Device Cuda(int index = 0) { return {DeviceType::kCuda, index}; }
  // Parses "cpu", "cpu:1", "cuda:0"; throws ConfigError naming the text.
  static Device Parse(const std::string& text);

  bool is_cpu() const { return type == DeviceType::kCpu; }
  bool is_cuda() const { return type == DeviceType::kCuda; }
  std::string ToString() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

// Alignment of every buffer: one cache line, and what AVX-512 loads want.
inline constexpr size_t kAlignment = 64;

// A caching allocator for one device. Blocks are rounded up to size classes
// and kept on free lists when released.
class MemoryPool {
 public:
  virtual ~MemoryPool() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Release(void* ptr, size_t bytes) = 0;
  // Bytes handed out now, the most ever handed out, and held from the system.
  virtual size_t bytes_in_use() const = 0;
  virtual size_t peak_bytes_in_use() const = 0;
  virtual size_t bytes_reserved() const = 0;
  // Caps the bytes held from the system (0: no cap): a device's memory
  // budget, and how tests provoke an out-of-memory error.
  virtual void set_limit_bytes(size_t bytes) = 0;
  virtual void ResetPeak() = 0;

  // Reservations, for work captured as a CUDA graph (ops/parallel/step_graph.h):
  // a replay writes the blocks at the addresses it was captured with, so
  // none of them may be handed to anyone else while the graph lives.
  //  - Reserve() begins one: every block in use now joins it (a captured
  //    step reads the parameters, the model's kept activations, the cuDNN
  //    workspace, ...). Returns its id (> 0).
  //  - While the calling thread is its capturing thread (CaptureScope), the
  //    blocks that thread is handed join it too, and are served first from
  //    what the reservation keeps aside: a replay runs in capture order, so
  //    a block freed earlier in the captured work may serve later work.
  //  - A released block of a reservation is kept aside for it, never
  //    handed out to anyone else, until Unreserve(id) frees what it kept
  //    and leaves its blocks in use to their holders.
  virtual int Reserve() = 0;
  virtual void Unreserve(int id) = 0;
  virtual size_t bytes_kept_aside() const = 0;
  class CaptureScope {
   public:
    CaptureScope(MemoryPool& pool, int id);
    ~CaptureScope();
    CaptureScope(const CaptureScope&) = delete;
    CaptureScope& operator=(const CaptureScope&) = delete;

   private:
    MemoryPool& pool_;
  };

 protected:
  // The reservation the calling thread captures for (0: none).
  virtual void SetCapturingThread(int id) = 0;
};

// Names what the current thread is allocating for ("layer 'conv2' (conv2d)
// forward"), so that an out-of-memory error can say who asked. Scopes nest;
// the innermost is reported. The text is made only when an error asks for
// it (scopes are opened for every layer of every step).
class AllocationScope {
 public:
  explicit AllocationScope(std::function<std::string()> describe);
  ~AllocationScope();
  AllocationScope(const AllocationScope&) = delete;
  AllocationScope& operator=(const AllocationScope&) = delete;
  // The innermost scope's text; empty outside any scope.
  static std::string Current();

 private:
  std::function<std::string()> describe_;
  const AllocationScope* outer_;
};

// The pool logic shared by every device: blocks rounded up to size classes,
// released blocks kept on per-class free lists, and a request served by the
// smallest free block up to 1.5x its class. A device supplies the raw
// allocation.
class CachingPool : public MemoryPool {
 public:
  void* Allocate(size_t bytes) override;
  void Release(void* ptr, size_t bytes) override;
  size_t bytes_in_use() const override { return in_use_; }
  size_t peak_bytes_in_use() const override { return peak_; }
  size_t bytes_reserved() const override { return reserved_; }
  void set_limit_bytes(size_t bytes) override;
  void ResetPeak() override;
  int Reserve() override;
  void Unreserve(int id) override;
  size_t bytes_kept_aside() const override { return kept_bytes_; }

 protected:
  void SetCapturingThread(int id) override;
  // nullptr when the device is out of memory.
  virtual void* RawAllocate(size_t bytes) = 0;
  virtual std::string name() const = 0;  // "host", "cuda:0"

 private:
  struct Block {
    size_t size = 0;
    int reservation = 0;  // 0: none
  };
  using FreeLists = std::map<size_t, std::vector<void*>>;  // by size; no empty lists
  // The smallest block of `lists` that holds `size`, if at most half as
  // large again; its size in `size`. Null: none.
  static void* TakeFitting(FreeLists& lists, size_t& size);

  std::mutex mu_;
  FreeLists free_;
  std::unordered_map<void*, Block> blocks_;  // every block handed out
  std::map<int, FreeLists> kept_;            // released blocks of each reservation
  int next_reservation_ = 1;
  int capturing_ = 0;  // the reservation capturing_thread_ captures for
  std::thread::id capturing_thread_;
  size_t in_use_ = 0, peak_ = 0, reserved_ = 0, limit_ = 0, kept_bytes_ = 0;
};

// The pool of a device (created on first use). Host memory for every cpu:K;
// a GPU's pool of the calling thread's lane (CurrentGpuLane).
MemoryPool& PoolFor(Device device);

// GPU lanes: a GPU listed k times in graph.devices runs k replicas, each
// with its own compute stream, handles and memory pool: lanes 0..k-1 of
// that GPU. A thread works in lane 0 unless a GpuLaneScope says otherwise;
// the GPU's context (ops/cuda/context.h) and pool are the calling thread's
// lane's. A GPU listed once has lane 0 only.
int CurrentGpuLane();
// Whether `devices` lists one GPU only, once or more (its lanes).
bool OneGpuOnly(const std::vector<Device>& devices);
class GpuLaneScope {
 public:
  explicit GpuLaneScope(int lane);
  ~GpuLaneScope();
  GpuLaneScope(const GpuLaneScope&) = delete;
  GpuLaneScope& operator=(const GpuLaneScope&) = delete;

 private:
  int previous_;
};

// Copies `bytes` between any two devices (host<->GPU, GPU<->GPU, host<->host).
void CopyBytes(Device dst_device, void* dst, Device src_device, const void* src, size_t bytes);
// Sets `bytes` of device memory to zero.
void ZeroBytes(Device device, void* ptr, size_t bytes);

// Whether this build has CUDA and a usable GPU is present (never touches
// CUDA in a build without it).
bool CudaAvailable();
int CudaDeviceCount();
// What this build and machine offer for GPUs, for `cnnflow devices`: the
// CUDA driver and runtime, cuDNN, cuBLAS and NCCL versions, and each GPU
// (name, memory, compute capability); or why there is none.
std::string DescribeCuda();

// A block of device memory returned to the pool it came from (its lane's)
// when the last handle goes.
class Storage {
 public:
  Storage(Device device, size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }

 private:
  Device device_;
  size_t bytes_;
  MemoryPool* pool_;
  void* data_;
};

}  // namespace cnnflow
