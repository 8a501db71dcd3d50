// The CUDA backend of a build without CUDA: no GPU, and a clear error if one
// is asked for.
#include "ops/collectives/collective_mpi.h"
#include "ops/cuda/batch_stager.h"
#include "ops/cuda/kernels.h"
#include "ops/cuda/lane_group.h"
#include "ops/cuda/nccl_comm.h"
#include "ops/cuda/resident_set.h"
#include "ops/cuda/strided_copy.h"
#include "ops/device_backend.h"
#include "ops/error.h"
#include "ops/stream_event.h"

namespace cnnflow::detail {

[[noreturn]] void NoCuda() {
  throw Error("this cnnflow was built without CUDA (CNNFLOW_WITH_CUDA=OFF): no cuda device");
}

bool CudaBuilt() { return false; }
int CudaDeviceCountImpl() { return 0; }
MemoryPool& CudaPool(int) { NoCuda(); }
void CudaCopy(Device, void*, Device, const void*, size_t) { NoCuda(); }
void CudaZero(int, void*, size_t) { NoCuda(); }
std::string CudaDescription() {
  return "CUDA: not in this build (CNNFLOW_WITH_CUDA=OFF): CPU devices only\n";
}

}  // namespace cnnflow::detail

namespace cnnflow::cuda {

void Axpy(float, const Tensor&, Tensor&) { detail::NoCuda(); }
void Scale(Tensor&, float) { detail::NoCuda(); }
void Cast(const Tensor&, Tensor&) { detail::NoCuda(); }
void SetMath(Device, const GpuMathOptions&) { detail::NoCuda(); }
void Synchronize(Device) { detail::NoCuda(); }
void StridedCopy(Device, float*, int64_t, const float*, int64_t, int64_t, int64_t, float, bool) {
  detail::NoCuda();
}
void SetCudnnPicksFile(const std::string&, bool) {}  // no GPU, no picks
void AddCast(const Tensor&, Tensor&) { detail::NoCuda(); }
void ChangeLayout(const Tensor&, Tensor&, bool, bool) { detail::NoCuda(); }
bool UnscaleAndFindNonFinite(const std::vector<Tensor*>&, float) { detail::NoCuda(); }
LossResult SoftmaxCrossEntropy(const Tensor&, const int64_t*, Tensor*, double, double,
                               const LabelMix*) {
  detail::NoCuda();
}
struct PendingLoss::Impl {};
struct IdleMeter::Impl {};
GpuSpan::GpuSpan(Device device, const char* category, std::string name)
    : device_(device.index), category_(category), name_(std::move(name)), session_(0) {}
GpuSpan::~GpuSpan() = default;
IdleMeter::IdleMeter(Device) { detail::NoCuda(); }
IdleMeter::~IdleMeter() = default;
void IdleMeter::EndOfWork() {}
void IdleMeter::StartOfWork() {}
void IdleMeter::Mark(GpuPhase) {}
double IdleMeter::idle_seconds() { return 0; }
double IdleMeter::busy_seconds(GpuPhase) { return 0; }
void IdleMeter::Reset() {}
PendingLoss::PendingLoss(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PendingLoss::~PendingLoss() = default;
LossResult PendingLoss::Get() { detail::NoCuda(); }
std::unique_ptr<PendingLoss> SoftmaxCrossEntropyAsync(const Tensor&, const int64_t*, Tensor*,
                                                      double, double, const LabelMix*) {
  detail::NoCuda();
}
void SoftmaxCrossEntropyInto(void*, const Tensor&, const int64_t*, Tensor*, double, double,
                             const LabelMix*) {
  detail::NoCuda();
}
std::unique_ptr<PendingLoss> ReadBackLoss(const void*, Device, const Shape&, bool) {
  detail::NoCuda();
}
void UploadSgdScalars(void*, Device, double, double, double, bool, double) { detail::NoCuda(); }
void LaunchSgdStep(Device, const std::vector<ParamSlot>&, const void*) { detail::NoCuda(); }
void UploadAdamScalars(void*, Device, double, double, double, double, double, bool, int64_t) {
  detail::NoCuda();
}
void LaunchAdamStep(Device, const std::vector<ParamSlot>&, const void*) { detail::NoCuda(); }

}  // namespace cnnflow::cuda

namespace cnnflow {

struct BatchStager::Slot {};
BatchStager::BatchStager(Device device) : device_(device), lane_(0) { detail::NoCuda(); }
BatchStager::~BatchStager() = default;
std::unique_ptr<BatchStager::Staged> BatchStager::Stage(const Tensor&, const int64_t*,
                                                        const LabelMix*) {
  detail::NoCuda();
}
int BatchStager::slots() const { return 0; }
void BatchStager::Free(Slot*) {}
void BatchStager::Staged::WaitForCopy() const { detail::NoCuda(); }
void BatchStager::Staged::Release() { slot_ = nullptr; }

ResidentImages::ResidentImages(Device device, const uint8_t*, int64_t, int, int, int)
    : device_(device) {
  detail::NoCuda();
}
ResidentImages::~ResidentImages() = default;
size_t ResidentImages::FreeBytes(Device) { detail::NoCuda(); }
Tensor ResidentImages::MakeBatch(const CropFlipDraw*, int64_t, const BatchFormat&) const {
  detail::NoCuda();
}

}  // namespace cnnflow

namespace cnnflow {

struct NcclGroup::Replica {};
struct NcclGroup::Pending {};
NcclGroup::UniqueId NcclGroup::NewUniqueId() { detail::NoCuda(); }
NcclGroup::NcclGroup(const std::vector<int>&, MpiWorld&, double) { detail::NoCuda(); }
NcclGroup::NcclGroup(const std::vector<int>&, int, int, const UniqueId&, double) {
  detail::NoCuda();
}
NcclGroup::~NcclGroup() = default;
int NcclGroup::device(int r) const { return devices_.at(r); }
void NcclGroup::AllReduceSum(int, float*, int64_t, const std::string&, float) { detail::NoCuda(); }
void NcclGroup::Broadcast(int, float*, int64_t, int, const std::string&) { detail::NoCuda(); }
void NcclGroup::Wait(int) { detail::NoCuda(); }
void NcclGroup::Barrier(int, const std::string&) { detail::NoCuda(); }
void NcclGroup::Abort(const std::string&) {}
std::string NcclGroup::broken_reason() const { return {}; }
std::unique_ptr<Collective> MakeLaneGroup(int, int, double, int) { detail::NoCuda(); }
std::unique_ptr<Collective> MakeGpuCollective(const std::vector<int>&, MpiWorld&, double) {
  detail::NoCuda();
}

}  // namespace cnnflow

namespace cnnflow {

struct GpuGraph::Impl {};
GpuGraph::GpuGraph(Device) { detail::NoCuda(); }
GpuGraph::~GpuGraph() = default;
void GpuGraph::Capture(const std::function<void()>&) { detail::NoCuda(); }
void GpuGraph::Replay() { detail::NoCuda(); }
bool GpuGraph::captured() const { return false; }

// No GPU, so every event is a CPU device's: nothing to record or wait for.
StreamEvent::StreamEvent(Device device) : device_(device) {
  if (device.is_cuda()) detail::NoCuda();
}
StreamEvent::~StreamEvent() = default;
void StreamEvent::Await(Device) const {}
bool StreamEvent::passed() const { return true; }

}  // namespace cnnflow
