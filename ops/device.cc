#include "ops/device.h"

#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "ops/device_backend.h"
#include "ops/error.h"

namespace cnnflow {

Device Device::Parse(const std::string& text) {
  auto colon = text.find(':');
  std::string kind = text.substr(0, colon);
  int index = 0;
  if (colon != std::string::npos) {
    const std::string num = text.substr(colon + 1);
    char* end = nullptr;
    long v = std::strtol(num.c_str(), &end, 10);
    if (num.empty() || *end != '\0' || v < 0) {
      throw ConfigError(StrCat("bad device '", text, "': expected cpu:K or cuda:K"));
    }
    index = static_cast<int>(v);
  }
  if (kind == "cpu") return Cpu(index);
  if (kind == "cuda" || kind == "gpu") return Cuda(index);
  throw ConfigError(StrCat("bad device '", text, "': expected cpu:K or cuda:K"));
}

std::string Device::ToString() const { return StrCat(is_cpu() ? "cpu:" : "cuda:", index); }

namespace {

size_t RoundToSizeClass(size_t bytes) {
  // Powers of two up to 1 MiB, then multiples of 1 MiB: little waste for the
  // large activation buffers, few classes for the small ones.
  if (bytes <= kAlignment) return kAlignment;
  if (bytes <= (1u << 20)) {
    size_t c = kAlignment;
    while (c < bytes) c <<= 1;
    return c;
  }
  return (bytes + (1u << 20) - 1) & ~static_cast<size_t>((1u << 20) - 1);
}

// Host memory: never returned to the system while the process runs.
//
// Blocks of 2 MiB or more are asked for in transparent huge pages where the
// kernel gives them only on request (transparent_hugepage=madvise, a common
// default): the bf16 convolutions' NCHW <-> NHWC conversions stride across
// a page per channel, where 4 KiB pages miss the TLB on almost every access
// (the speed run's step time: bench/results/2026-12-07-cpu-kernel-measurements.md).
class HostPool final : public CachingPool {
 protected:
  void* RawAllocate(size_t bytes) override {
    constexpr size_t kHugePage = size_t{2} << 20;
    if (bytes < kHugePage) return std::aligned_alloc(kAlignment, bytes);
    void* p = std::aligned_alloc(kHugePage, (bytes + kHugePage - 1) & ~(kHugePage - 1));
    if (p != nullptr) ::madvise(p, bytes, MADV_HUGEPAGE);  // a hint: failure changes nothing
    return p;
  }
  std::string name() const override { return "host"; }
};

// "123 bytes available (MemAvailable), address space limited to 456 bytes
// (ulimit -v)": what an allocation of host memory could have had.
std::string HostMemoryAvailable() {
  std::string out;
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  long long kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") {
      out = StrCat(kib * 1024, " bytes available (MemAvailable)");
      break;
    }
  }
  struct rlimit as {};
  if (::getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    out += StrCat(out.empty() ? "" : ", ", "address space limited to ", as.rlim_cur,
                  " bytes (ulimit -v)");
  }
  return out.empty() ? "available memory unknown" : out;
}

}  // namespace

void* CachingPool::TakeFitting(FreeLists& lists, size_t& size) {
  auto fit = lists.lower_bound(size);
  if (fit == lists.end() || fit->first > size + size / 2) return nullptr;
  size = fit->first;
  void* p = fit->second.back();
  fit->second.pop_back();
  if (fit->second.empty()) lists.erase(fit);
  return p;
}

void* CachingPool::Allocate(size_t bytes) {
  size_t size = RoundToSizeClass(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  const int reservation =
      capturing_ != 0 && capturing_thread_ == std::this_thread::get_id() ? capturing_ : 0;
  void* p = nullptr;
  if (reservation != 0) {  // what the captured work freed earlier serves it first
    p = TakeFitting(kept_[reservation], size);
    if (p != nullptr) kept_bytes_ -= size;
  }
  // The smallest free block that holds it, if at most half as large again:
  // a batch of another size (the evaluation's, an epoch's short last one)
  // then reuses the training step's blocks instead of touching fresh memory
  // (first touches cost the kernel seconds per GB on some virtual machines).
  if (p == nullptr) p = TakeFitting(free_, size);
  if (p == nullptr) {
    p = limit_ > 0 && reserved_ + size > limit_ ? nullptr : RawAllocate(size);
    if (p == nullptr) {
      const std::string who = AllocationScope::Current();
      // The host's free memory too: Linux overcommits, so a failed host
      // allocation means the request exceeds what the system (or ulimit -v)
      // can give at all, and the figures say by how much.
      const bool host = name() == "host";
      throw Error(StrCat(
          name(), " out of memory: asked ", size, " bytes with ", in_use_, " in use and ",
          reserved_, " reserved",
          kept_bytes_ > 0 ? StrCat(" (", kept_bytes_, " kept for a CUDA graph)") : std::string(),
          limit_ > 0 ? StrCat(" (limit ", limit_, ")") : std::string(),
          who.empty() ? std::string() : StrCat(", for ", who),
          host ? StrCat("; ", HostMemoryAvailable()) : std::string(),
          "; use a smaller batch (train.batch) or fewer replicas per process"));
    }
    reserved_ += size;
  }
  blocks_[p] = Block{size, reservation};
  in_use_ += size;
  peak_ = std::max(peak_, in_use_);
  return p;
}

int CachingPool::Reserve() {
  std::lock_guard<std::mutex> lock(mu_);
  const int id = next_reservation_++;
  for (auto& [ptr, block] : blocks_)
    if (block.reservation == 0) block.reservation = id;
  kept_[id];
  return id;
}

void CachingPool::Unreserve(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = kept_.find(id);
  CNNFLOW_ENFORCE(it != kept_.end(), name(), " pool: no reservation ", id);
  for (auto& [size, ptrs] : it->second) {
    kept_bytes_ -= size * ptrs.size();
    auto& to = free_[size];
    to.insert(to.end(), ptrs.begin(), ptrs.end());
  }
  kept_.erase(it);
  for (auto& [ptr, block] : blocks_)
    if (block.reservation == id) block.reservation = 0;
  if (capturing_ == id) capturing_ = 0;
}

void CachingPool::SetCapturingThread(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  CNNFLOW_ENFORCE(id == 0 || kept_.count(id) > 0, name(), " pool: no reservation ", id);
  CNNFLOW_ENFORCE(id == 0 || capturing_ == 0, name(), " pool: reservation ", capturing_,
                  " is capturing already");
  capturing_ = id;
  capturing_thread_ = std::this_thread::get_id();
}

MemoryPool::CaptureScope::CaptureScope(MemoryPool& pool, int id) : pool_(pool) {
  pool_.SetCapturingThread(id);
}
MemoryPool::CaptureScope::~CaptureScope() { pool_.SetCapturingThread(0); }

void CachingPool::set_limit_bytes(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  limit_ = bytes;
}

void CachingPool::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  peak_ = in_use_;
}

namespace {
thread_local const AllocationScope* g_scope = nullptr;
}  // namespace

AllocationScope::AllocationScope(std::function<std::string()> describe)
    : describe_(std::move(describe)), outer_(g_scope) {
  g_scope = this;
}
AllocationScope::~AllocationScope() { g_scope = outer_; }
std::string AllocationScope::Current() { return g_scope ? g_scope->describe_() : std::string(); }

void CachingPool::Release(void* ptr, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = blocks_.find(ptr);
  CNNFLOW_ENFORCE(it != blocks_.end(), name(), " pool: released ", bytes,
                  " bytes it did not hand out");
  const Block block = it->second;
  blocks_.erase(it);
  in_use_ -= block.size;
  if (block.reservation != 0) {  // a graph's replays may write it: kept for them
    kept_[block.reservation][block.size].push_back(ptr);
    kept_bytes_ += block.size;
    return;
  }
  free_[block.size].push_back(ptr);
}

MemoryPool& PoolFor(Device device) {
  if (device.is_cpu()) {
    static HostPool* pool = new HostPool();  // lives for the process: tensors may outlive main
    return *pool;
  }
  return detail::CudaPool(device.index);
}

void CopyBytes(Device dst_device, void* dst, Device src_device, const void* src, size_t bytes) {
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  detail::CudaCopy(dst_device, dst, src_device, src, bytes);
}

void ZeroBytes(Device device, void* ptr, size_t bytes) {
  if (device.is_cpu()) {
    std::memset(ptr, 0, bytes);
    return;
  }
  detail::CudaZero(device.index, ptr, bytes);
}

bool CudaAvailable() { return detail::CudaBuilt() && detail::CudaDeviceCountImpl() > 0; }
int CudaDeviceCount() { return detail::CudaBuilt() ? detail::CudaDeviceCountImpl() : 0; }
std::string DescribeCuda() { return detail::CudaDescription(); }

namespace {
thread_local int current_gpu_lane = 0;
}  // namespace

int CurrentGpuLane() { return current_gpu_lane; }

bool OneGpuOnly(const std::vector<Device>& devices) {
  return !devices.empty() && devices[0].is_cuda() &&
         std::all_of(devices.begin(), devices.end(),
                     [&](const Device& d) { return d == devices[0]; });
}

GpuLaneScope::GpuLaneScope(int lane) : previous_(current_gpu_lane) {
  CNNFLOW_ENFORCE(lane >= 0, "GPU lane ", lane, " is negative");
  current_gpu_lane = lane;
}

GpuLaneScope::~GpuLaneScope() { current_gpu_lane = previous_; }

Storage::Storage(Device device, size_t bytes)
    : device_(device), bytes_(bytes), pool_(&PoolFor(device)), data_(pool_->Allocate(bytes)) {}

Storage::~Storage() { pool_->Release(data_, bytes_); }

}  // namespace cnnflow
