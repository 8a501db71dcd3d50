// Our own batchnorm training kernels (the CUDA side of ops/layers/batch_norm.h
// where cuDNN's BN does not do the job; BatchNormCudnn picks):
//  - SyncBN (graph.sync_bn): the statistics of the global batch, with the
//    CPU layer's math and its sums' packing (ops/cpu/batch_norm_sums.h):
//    forward: per channel sum(x) -> sync -> shift = the global mean;
//    sum(x - shift), sum((x - shift)^2) -> sync -> mean and biased variance
//    (the second pass keeps f32 data precise when |mean| >> std);
//  - a BN with its ReLU fused, or finished by the add that reads it
//    (DeferredNormalise: the add's y = relu(bn(x) + z) in one pass; Model's
//    fusion, channels-last):
//    one pass over x for the statistics (sums of x and x^2 in double) and
//    one that writes max(bn(x), 0); backward recomputes the ReLU's mask
//    from x with the forward's own expression (so the same bits), so no
//    ReLU layer runs and its output and gradient are never stored: 2 reads
//    and 1 write forward, 4 reads and 1 write backward, against cuDNN's BN
//    and a ReLU layer's 3 and 2, 6 and 2.
// The running statistics take the unbiased variance, as PyTorch's. Backward:
// sum(dy), sum(dy * xhat) -> sync -> dx; the parameter gradients add this
// replica's own sums (the data-parallel all-reduce adds the replicas' later).
//
// Sums are taken in double: blocks of a fixed grid (the shape's, not the
// GPU's) write partial sums of strips of rows, and one thread per channel
// adds its strips in order (no atomics: the same bits every run, on any
// GPU). They travel as float hi/lo pairs, with the count, through `sync`,
// which sums a device buffer over the replicas in place (a replica's
// collective, enqueued on its stream). Nothing waits on the host.
// x, y, dy, dx: f32, f16 or bf16 [n, c, s] (NCHW) or [n, s, c] (nhwc);
// parameters, statistics and their gradients f32. Compiled with CUDA only.
#pragma once

#include <cstdint>
#include <functional>

#include "ops/tensor.h"

namespace cnnflow::cuda {

struct BnShape {
  int64_t n = 0, c = 0, s = 0;  // samples, channels, spatial positions
  bool nhwc = false;
};

// The device state of one layer's passes (made on first use).
struct BnState {
  Tensor buf;       // [4c + 2] f32: two sums per channel as hi/lo, and the count
  Tensor partials;  // [strips, 2, c] f64: the blocks' partial sums
  Tensor shift;     // [c] f64: SyncBN's first-pass global mean
  Tensor mean;      // [c] f32: the forward's statistics, for backward
  Tensor inv_std;   // [c] f32
  Tensor scale;     // [c] f32: gamma * inv_std
  Tensor coef;      // [2c] f32: backward's mean(dy) and mean(dy * xhat)
};

// Sums `count` floats of a device buffer over the replicas, in place.
using SyncSum = std::function<void(float* device_data, int64_t count)>;

struct BnAffine {
  const float* gamma = nullptr;  // null: 1 (affine: false)
  const float* beta = nullptr;   // null: 0
  bool relu = false;             // y = max(bn(x), 0) (NaN -> 0, as the relu layer)
};

// y = (x - mean) / sqrt(var + eps) * gamma + beta (then the ReLU) over this
// batch (sync null) or the global batch; running_mean/var updated with
// `momentum` (PyTorch's convention). y null: the statistics only, and the
// normalisation left to BatchNormNormalise.
void BatchNormTrainForward(const BnShape& shape, const Tensor& x, Tensor* y, const BnAffine& affine,
                           float* running_mean, float* running_var, double momentum, double eps,
                           BnState& state, const SyncSum* sync);
// y = bn(x) with the last forward's statistics, + residual (null: none),
// then the ReLU when affine.relu: the residual add of a ResNet block and its
// ReLU in the pass that normalises.
void BatchNormNormalise(const BnShape& shape, const Tensor& x, const Tensor* residual, Tensor& y,
                        const BnAffine& affine, const BnState& state);

// A batchnorm that can leave its normalisation to the add that is its only
// reader (BatchNormCudnn: channels-last training forwards, on our kernels).
class DeferredNormalise {
 public:
  virtual ~DeferredNormalise() = default;
  // Model's fusion, once: from now on a training forward computes the
  // statistics only and writes no output. False where it cannot.
  virtual bool DeferToReader() = 0;
  // y = [relu](bn(x) + residual) for the last forward, if it deferred; false
  // when it wrote its own output (evaluation), and the reader adds as usual.
  virtual bool NormaliseAdd(const Tensor& residual, Tensor& y, bool relu) = 0;
};

// dx (null: not wanted, and nothing is synced) through the statistics of the
// last forward (and its ReLU's mask); dgamma += sum(dy * xhat), dbeta +=
// sum(dy) over this replica's rows (null without affine).
void BatchNormTrainBackward(const BnShape& shape, const Tensor& x, const Tensor& dy, Tensor* dx,
                            const BnAffine& affine, float* dgamma, float* dbeta, BnState& state,
                            const SyncSum* sync);

}  // namespace cnnflow::cuda
