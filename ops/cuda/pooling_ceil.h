// 2D pooling whose last windows hang over the padded input (a ceil_mode
// size that rounded up, Pool2dGeometry::WindowsInside false), which cuDNN
// does not pool: NCHW kernels with the CPU layers' rules (ops/cpu/
// pooling.cc): windows clipped to the input; max: padded cells never win,
// the first maximum in scan order wins and a NaN always does; avg:
// PyTorch's divisor (the window clipped to the padded input, or to the
// input without count_include_pad). Backward gathers per input cell over
// the windows that hold it, so it is deterministic without atomics.
// f32, f16 and bf16 (accumulated in f32).
#pragma once

#include "ops/layers/pooling.h"
#include "ops/tensor.h"

namespace cnnflow::cuda {

// y [N, C, H', W'] = max over each window of x [N, C, H, W]; argmax (I64,
// as y, on its GPU; reallocated when its size changes): the winner's index
// in its input plane.
void CeilMaxPoolForward(const Pool2dGeometry& g, const Tensor& x, Tensor& y, Tensor& argmax);
void CeilMaxPoolBackward(const Pool2dGeometry& g, const Tensor& dy, const Tensor& argmax,
                         Tensor& dx);
void CeilAvgPoolForward(const Pool2dGeometry& g, bool include_pad, const Tensor& x, Tensor& y);
void CeilAvgPoolBackward(const Pool2dGeometry& g, bool include_pad, const Tensor& dy, Tensor& dx);

}  // namespace cnnflow::cuda
