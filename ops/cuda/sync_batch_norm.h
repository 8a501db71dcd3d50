// Synchronised BatchNorm on GPU replicas (graph.sync_bn; the CUDA side of
// ops/layers/batch_norm.h's SyncBN): the statistics of the global batch,
// with the CPU layer's math and its sums' packing (ops/cpu/batch_norm_sums.h):
//  - forward: per channel sum(x) -> sync -> shift = the global mean;
//    sum(x - shift), sum((x - shift)^2) -> sync -> mean and biased variance
//    (the second pass keeps f32 data precise when |mean| >> std); the
//    running statistics take the unbiased variance, as PyTorch's;
//  - backward: sum(dy), sum(dy * xhat) -> sync -> dx; the parameter
//    gradients add this replica's own sums (the data-parallel all-reduce
//    adds the replicas' later).
// Sums are taken in double, one block per channel in a fixed order (no
// atomics: the same bits every run), and travel as float hi/lo pairs
// through `sync`, which sums a device buffer over the replicas in place (a
// replica's collective, enqueued on its stream). Nothing waits on the host.
// x, y, dy, dx: f32, f16 or bf16 [n, c, s] (NCHW) or [n, s, c] (nhwc);
// parameters, statistics and their gradients f32. Compiled with CUDA only.
#pragma once

#include <cstdint>
#include <functional>

#include "ops/tensor.h"

namespace cnnflow::cuda {

struct SyncBnShape {
  int64_t n = 0, c = 0, s = 0;  // samples, channels, spatial positions
  bool nhwc = false;
};

// The device state of one layer's synced passes (made on first use).
struct SyncBnState {
  Tensor buf;      // [4c + 2] f32: the packed sums that travel
  Tensor shift;    // [c] f64: the first pass's global mean
  Tensor mean;     // [c] f32: the forward's global statistics, for backward
  Tensor inv_std;  // [c] f32
  Tensor count;    // [1] f64: the global count
};

using SyncSum = std::function<void(float* device_data, int64_t count)>;

// y = (x - mean) / sqrt(var + eps) * gamma + beta over the global batch;
// running_mean/var updated with `momentum` (PyTorch's convention).
void SyncBatchNormForward(const SyncBnShape& shape, const Tensor& x, Tensor& y, const float* gamma,
                          const float* beta, float* running_mean, float* running_var,
                          double momentum, double eps, SyncBnState& state, const SyncSum& sync);

// dx (null: not wanted, and nothing is synced) through the global
// statistics of the last forward; dgamma += sum(dy * xhat), dbeta +=
// sum(dy) over this replica's rows (null without affine).
void SyncBatchNormBackward(const SyncBnShape& shape, const Tensor& x, const Tensor& dy, Tensor* dx,
                           const float* gamma, float* dgamma, float* dbeta, SyncBnState& state,
                           const SyncSum& sync);

}  // namespace cnnflow::cuda
