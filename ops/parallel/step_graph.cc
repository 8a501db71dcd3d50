#include "ops/parallel/step_graph.h"

#include "ops/error.h"

namespace cnnflow {

std::string StepGraph::WhyNot(const Model& model, int replicas, int tensor_parallel,
                              DType compute) {
  if (replicas > 1) {
    return StrCat(replicas,
                  " replicas: their gradient reductions run on threads of their own, "
                  "so only one replica's steps are captured so far");
  }
  if (tensor_parallel > 1) return "tensor parallelism is not captured so far";
  if (compute == DType::kF16) {
    return "fp16's loss scaler reads the gradients' check on the host each step";
  }
  for (int i = 0; i < model.num_layers(); ++i) {
    const Layer& l = model.layer(i);
    if (l.DrawsPerStep()) {
      return StrCat("layer '", l.name(), "' (", l.type(),
                    ") draws new random numbers each step, which a replay would repeat");
    }
  }
  return "";
}

bool StepKey::operator==(const StepKey& o) const {
  return shape == o.shape && dtype == o.dtype && grad_scale == o.grad_scale &&
         label_smoothing == o.label_smoothing && mixed == o.mixed && needs_grad == o.needs_grad;
}

CaptureSchedule::CaptureSchedule(int warmup) : warmup_(warmup) {
  CNNFLOW_ENFORCE(warmup >= 1, "CUDA graphs: warm-up steps must be >= 1, got ", warmup);
}

CaptureSchedule::Action CaptureSchedule::Next(const StepKey& key) {
  if (failed_) return Action::kRun;
  if (captured_ && key == *captured_) return Action::kReplay;
  runs_ = last_ && key == *last_ ? runs_ + 1 : 1;
  last_ = key;
  return runs_ > warmup_ ? Action::kCapture : Action::kRun;
}

void CaptureSchedule::Failed() {
  failed_ = true;
  captured_.reset();
}

StepGraph::StepGraph(Model& model, Device device, int warmup)
    : model_(model), device_(device), pool_(PoolFor(device)), schedule_(warmup) {
  CNNFLOW_ENFORCE(device.is_cuda(), "CUDA graphs on ", device.ToString(), ": not a GPU");
}

StepGraph::~StepGraph() {
  try {
    Drop();
  } catch (...) {  // a failing GPU: the run is ending with its own error
  }
}

void StepGraph::Drop() {
  // The graphs first: a captured one waits for its lane's stream, after
  // which nothing writes the reserved blocks any more.
  forward_.reset();
  backward_.reset();
  update_.reset();
  x_ = labels_ = mix_other_ = mix_weight_ = dlogits_ = Tensor();
  result_.reset();
  if (reservation_ != 0) {
    pool_.Unreserve(reservation_);
    reservation_ = 0;
  }
}

StepKey StepGraph::KeyOf(const Tensor& x, const LabelMix* mix, double grad_scale,
                         double label_smoothing) const {
  StepKey k;
  k.shape = x.shape();
  k.dtype = x.dtype();
  k.grad_scale = grad_scale;
  k.label_smoothing = label_smoothing;
  k.mixed = mix != nullptr;
  for (int i = 0; i < model_.num_layers(); ++i)
    for (const Parameter& p : model_.layer(i).parameters()) k.needs_grad.push_back(p.needs_grad());
  return k;
}

bool StepGraph::Prepare(const Tensor& x, const int64_t* labels, const LabelMix* mix,
                        double grad_scale, double label_smoothing, const ForwardContext& ctx) {
  if (x.dim(0) == 0) return false;
  CNNFLOW_ENFORCE(x.device() == device_ && x.is_contiguous() && labels != nullptr,
                  "a captured step takes its rows (contiguous) and labels on ", device_.ToString(),
                  ", got rows on ", x.device().ToString());
  const StepKey key = KeyOf(x, mix, grad_scale, label_smoothing);
  switch (schedule_.Next(key)) {
    case CaptureSchedule::Action::kRun:
      return false;
    case CaptureSchedule::Action::kReplay:
      return true;
    case CaptureSchedule::Action::kCapture:
      break;
  }
  try {
    Capture(key, ctx);
    schedule_.Captured(key);
  } catch (const std::exception& e) {
    Fail(StrCat("the capture at a step of ", key.shape, " failed: ", e.what()));
    return false;
  }
  return true;
}

void StepGraph::Fail(const std::string& why) {
  Drop();
  schedule_.Failed();
  why_not_ = why;
}

void StepGraph::Capture(const StepKey& key, const ForwardContext& ctx) {
  Drop();  // the graphs of the key captured before
  const int64_t n = key.shape[0];
  // The capture's inputs, allocated before the reservation begins (it
  // takes every block in use), as is everything the model holds.
  x_ = Tensor::Empty(key.shape, key.dtype, device_);
  labels_ = Tensor::Empty(Shape({n}), DType::kI64, device_);
  if (key.mixed) {
    mix_other_ = Tensor::Empty(Shape({n}), DType::kI64, device_);
    mix_weight_ = Tensor::Empty(Shape({n}), DType::kF32, device_);
  }
  result_ = std::make_unique<Storage>(device_, kLossResultBytes);
  reservation_ = pool_.Reserve();
  LabelMix mix;
  if (key.mixed) mix = {mix_other_.data<int64_t>(), mix_weight_.data<float>()};
  ForwardContext c = ctx;
  c.training = true;
  c.keep_activations = true;
  forward_ = std::make_unique<GpuGraph>(device_);
  backward_ = std::make_unique<GpuGraph>(device_);
  {
    const MemoryPool::CaptureScope scope(pool_, reservation_);
    forward_->Capture([&] {
      const Tensor& logits = model_.Forward(x_, c);
      logits_shape_ = logits.shape();
      dlogits_ = Tensor::Empty(logits.shape(), logits.dtype(), device_);
      SoftmaxCrossEntropyInto(result_->data(), logits, labels_.data<int64_t>(), &dlogits_,
                              key.grad_scale, key.label_smoothing, key.mixed ? &mix : nullptr);
    });
    backward_->Capture([&] { model_.Backward(dlogits_); });
  }
  mixed_ = key.mixed;
  ++captures_;
}

std::unique_ptr<PendingLoss> StepGraph::ReplayForward(const Tensor& x, const int64_t* labels,
                                                      const LabelMix* mix) {
  CNNFLOW_ENFORCE(forward_ && forward_->captured(), "StepGraph::ReplayForward without a capture");
  CopyBytes(device_, x_.raw_data(), device_, x.raw_data(), x.nbytes());
  CopyBytes(device_, labels_.raw_data(), device_, labels, labels_.nbytes());
  if (mixed_) {
    CopyBytes(device_, mix_other_.raw_data(), device_, mix->other, mix_other_.nbytes());
    CopyBytes(device_, mix_weight_.raw_data(), device_, mix->weight, mix_weight_.nbytes());
  }
  forward_->Replay();
  return ReadBackLoss(result_->data(), device_, logits_shape_, mixed_);
}

void StepGraph::ReplayBackward() {
  backward_->Replay();
  ++replayed_;
}

void StepGraph::Update(Optimizer& optimizer, double lr, const std::function<void()>& zero_grads) {
  optimizer.Prepare(lr);
  if (schedule_.has_capture() && !update_) {
    try {
      auto graph = std::make_unique<GpuGraph>(device_);
      const MemoryPool::CaptureScope scope(pool_, reservation_);
      graph->Capture([&] {
        optimizer.Launch();
        zero_grads();
      });
      update_ = std::move(graph);
    } catch (const std::exception& e) {
      Fail(StrCat("the capture of the optimizer's update failed: ", e.what()));
    }
  }
  if (update_) {
    update_->Replay();
    ++replayed_updates_;
    return;
  }
  optimizer.Launch();
  zero_grads();
}

}  // namespace cnnflow
