// Batch normalisation ("batchnorm"), as torch.nn.BatchNorm1d/2d: per channel
// c, y = (x - mean_c) / sqrt(var_c + eps) * weight_c + bias_c.
//
// Samples are [C, H, W] (BatchNorm2d), [C, L] or [C] (BatchNorm1d): the
// statistics of channel c are taken over the batch and every spatial
// position. In training the batch statistics are used (biased variance)
// and the running statistics updated with the unbiased variance:
//   running = (1 - momentum) * running + momentum * batch_stat;
// in evaluation the running statistics are used.
//
// Synchronised BatchNorm (torch.nn.SyncBatchNorm), for data parallelism:
// when ForwardContext::sync_sum is set in training, every replica's layer
// normalises with the statistics of the GLOBAL batch (all replicas'
// shards). Forward makes two sync_sum calls, backward one; every replica
// must make them (same model, same mode), each with its own shard, which
// may be uneven or hold a single value per channel (only the global count
// must exceed 1). Sums are taken in double and travel as float hi/lo
// pairs (see ops/cpu/batch_norm.cc). Parameter gradients stay local sums
// (the data-parallel all-reduce adds them later). Eval ignores sync_sum.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// x: [N, C, ...] -> y: [N, C, ...] (same shape).
// Parameters (affine: true): weight [C] (1), bias [C] (0).
// Buffers: running_mean [C] (0), running_var [C] (1).
class BatchNormLayer : public Layer {
 public:
  BatchNormLayer(const std::string& name, const Args& args);

  const char* type() const override { return "batchnorm"; }
  Shape Build(const std::vector<Shape>& inputs, DType dtype) override;
  void ResetParameters(Rng& rng) override;
  void Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext& ctx) override;
  // Training: the full batch-norm backward (through the batch statistics,
  // global ones if the forward was synced: then it calls the forward's
  // sync_sum once, unless dx is not wanted); evaluation: the affine map
  // with the running statistics.
  void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                const std::vector<Tensor*>& dx) override;
  int64_t ForwardFlops(int64_t n) const override { return 2 * n * channels_ * spatial_; }
  // y = max(bn(x), 0) from now on, in the pass that writes y; dy masked by
  // y > 0 in backward, row by row as it is read (channels-last: by
  // bn(x) > 0, recomputed from x).
  bool FuseRelu() override {
    relu_ = true;
    return true;
  }
  // y = gelu(bn(x)) (erf form) from now on, in the pass that writes y; in
  // backward, dy is taken through the GELU at bn(x), recomputed from x
  // (bn(x) itself is never stored).
  bool FuseGelu() override {
    gelu_ = true;
    return true;
  }

  // Either layout, [N, C, H, W] or channels-last [N, H, W, C] samples.
  ChannelsLast ChannelsLastSupport() const override { return ChannelsLast::kFollows; }
  // Channels-last, y may be bf16 (Layer::WritesBf16): the channels-last
  // backward never reads y (a fused ReLU's mask is recomputed from x, as a
  // fused GELU's derivative is).
  bool WritesBf16() const override;

  // A frozen BN (train.frozen_bn: eval): from now on it normalises with the
  // running statistics and keeps them in training too, and its backward is
  // the evaluation one (the affine map), as detection codebases freeze BN.
  bool HoldRunningStatistics() override {
    hold_running_stats_ = true;
    return true;
  }
  bool hold_running_stats() const { return hold_running_stats_; }
  int64_t channels() const { return channels_; }
  double momentum() const { return momentum_; }
  double eps() const { return eps_; }
  bool affine() const { return affine_; }

 private:
  void InitState();  // weight 1, bias 0, running_mean 0, running_var 1
  // The statistics channel c normalises with (mean_, inv_std_).
  void SetStats(int64_t c, double mean, double var);
  // Synced forward, pass 1: sync_buf_ holds this replica's per-channel sums
  // (hi C, lo C); adds the count, syncs, and sets count_ and shift_ (the
  // global mean up to the float rounding). Returns the global count.
  double SyncCountAndShift(int64_t local_count, const Shape& in_shape);
  // Forward's checks and per-forward state (count_, the sizes of mean_ and
  // inv_std_); returns whether it normalises with the batch statistics.
  bool StartForward(const Tensor& in, const Tensor& y, const ForwardContext& ctx);
  // The passes over [N, C, ...] tensors of one dtype T (batch_norm.cc).
  template <typename T>
  void ForwardNchw(const Tensor& in, Tensor& y, bool training);
  template <typename T>
  void BackwardNchw(const Tensor& in, const Tensor& y, const Tensor& dy, Tensor* dx);
  // Synced forward: the global count (returned), shift_, and in sync_buf_
  // the global sums centred on shift_, [s1 (hi C, lo C), s2 (hi C, lo C)].
  // Input: batch_norm.cc's view of x.
  template <typename Input>
  double SyncCentredSums(const Input& x, const Shape& in_shape);
  // The passes over channels-last tensors (nhwc_input()).
  void ForwardNhwc(const Tensor& in, Tensor& y, bool training);
  void BackwardNhwc(const Tensor& in, const Tensor& dy, Tensor* dx);
  // Parameter i's value (weight 0, bias 1) or gradient as T; null without affine.
  template <typename T>
  const T* Param(int i) const {
    return affine_ ? parameters()[i].value.data<T>() : nullptr;
  }
  template <typename T>
  T* ParamGrad(int i) {
    return affine_ ? parameters()[i].grad.data<T>() : nullptr;
  }

  double momentum_;
  double eps_;
  bool affine_;
  bool relu_ = false;                // a fused ReLU (FuseRelu)
  bool gelu_ = false;                // a fused GELU (FuseGelu)
  bool hold_running_stats_ = false;  // HoldRunningStatistics
  int64_t channels_ = 0;
  int64_t spatial_ = 1;  // product of the dims after C (1 for [C])
  // Per-forward state: which statistics were used, per channel.
  bool last_training_ = false;
  const std::function<void(float*, int64_t)>* sync_sum_ = nullptr;  // training + synced
  int64_t local_count_ = 0;  // values per channel in this layer's input
  double count_ = 0;         // values per channel the statistics came from
  std::vector<double> mean_;
  std::vector<double> inv_std_;
  std::vector<float> sync_buf_;  // packed sums sent through sync_sum_
  std::vector<double> shift_;    // per-channel pass-1 mean (synced forward)
};

}  // namespace cnnflow
