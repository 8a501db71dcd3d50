// Batchnorm on channels-last activations [N, H, W, C] (ops/layers/batch_norm.h;
// the NCHW passes and the layer are batch_norm.cc).
#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/batch_norm_sums.h"
#include "ops/cpu/bf16_layout.h"
#include "ops/cpu/gelu_vector.h"
#include "ops/cpu/parallel.h"
#include "ops/layers/activation.h"
#include "ops/layers/batch_norm.h"

namespace cnnflow {

using namespace cpu::batch_norm;  // the shared sums and maps (batch_norm_sums.h)

namespace {

// Rows [r0, r1) of y = bn(x) into out, f32 or f64 as x: per channel c,
// (x - tm[c]) * a[c] + b[c] (ChannelAffines), then the fused activation.
template <typename T>
inline void NormaliseRows(const T* xs, int64_t r0, int64_t r1, int64_t c_n,
                          const ChannelAffines<T>& f, bool relu, bool gelu, T* out) {
  const T *tm = f.shift.data(), *a = f.scale.data(), *b = f.bias.data();
  for (int64_t r = r0; r < r1; ++r, out += c_n) {
    const T* row = xs + r * c_n;
    if (relu) {
      for (int64_t c = 0; c < c_n; ++c) out[c] = std::max((row[c] - tm[c]) * a[c] + b[c], T(0));
    } else {
      for (int64_t c = 0; c < c_n; ++c) out[c] = (row[c] - tm[c]) * a[c] + b[c];
    }
  }
  if (gelu) GeluSpan(out - (r1 - r0) * c_n, (r1 - r0) * c_n);
}

// y = bn(x) over all rows, in parallel; a bf16 y (from f32 x) is written a
// block of rows at a time in f32, then rounded (as a bf16 convolution rounds
// an f32 input: the same bits).
template <typename T>
inline void NormaliseNhwc(const T* xs, int64_t rows, int64_t c_n, const ChannelAffines<T>& f,
                          bool relu, bool gelu, Tensor& y) {
  const bool bf16_out = y.dtype() == DType::kBF16;
  cpu::ParallelFor(rows, RowGrain(c_n), [&](int64_t r0, int64_t r1) {
    if (!bf16_out) {
      NormaliseRows(xs, r0, r1, c_n, f, relu, gelu, y.data<T>() + r0 * c_n);
      return;
    }
    if constexpr (std::is_same_v<T, float>) {
      const int64_t block = std::max<int64_t>(1, 2048 / c_n);
      std::vector<float> buf(std::min(block, r1 - r0) * c_n);
      auto* y16 = static_cast<uint16_t*>(y.raw_data());
      for (int64_t rb = r0; rb < r1; rb += block) {
        const int64_t re = std::min(r1, rb + block);
        NormaliseRows(xs, rb, re, c_n, f, relu, gelu, buf.data());
        cpu::ToBf16(buf.data(), y16 + rb * c_n, (re - rb) * c_n);
      }
    }
  });
}

// s[0, C): sum(x - shift), s[C, 2C): sum((x - shift)^2), per channel.
template <typename T>
inline void CentredSumsNhwc(const T* xs, int64_t rows, int64_t c_n, const double* shift,
                            double* s) {
  SumRowChunks(rows, c_n, 2 * c_n, s, [&](int64_t r0, int64_t r1, double* acc) {
    SumChannelTiles(r0, r1, c_n, acc, acc + c_n, [&](int64_t r, int64_t c, auto& a, auto& b) {
      using V = std::remove_reference_t<decltype(a)>;
      const V v = LoadLanes<V>(xs + r * c_n + c) - LoadLanes<V>(shift + c);
      a += v;
      b += v * v;
    });
  });
}

}  // namespace

// Channels-last: x [N, H, W, C] as rows of C values. The same statistics,
// passes and fusions as the NCHW code (batch_norm.cc); the sums go over row chunks
// (SumRowChunks) and each pass runs along rows, a channel per lane.
void BatchNormLayer::ForwardNhwc(const Tensor& in, Tensor& y, bool training) {
  const int64_t c_n = channels_, s_n = spatial_, rows = in.dim(0) * s_n;
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    CNNFLOW_ENFORCE(
        y.dtype() == in.dtype() || (y.dtype() == DType::kBF16 && std::is_same_v<T, float>),
        "batchnorm ", name(), ": a ", DTypeName(y.dtype()), " output for a ", DTypeName(in.dtype()),
        " input");
    const T* gamma = Param<T>(0);
    const T* beta = Param<T>(1);
    T* rmean = buffers()[0].value.data<T>();
    T* rvar = buffers()[1].value.data<T>();
    auto normalise = [&] {
      const ChannelAffines<T> f(c_n, mean_, inv_std_, gamma, beta);
      NormaliseNhwc(xs, rows, c_n, f, relu_, gelu_, y);
    };
    if (!training) {
      for (int64_t c = 0; c < c_n; ++c) {
        SetStats(c, static_cast<double>(rmean[c]), static_cast<double>(rvar[c]));
      }
      normalise();
      return;
    }
    std::vector<double> sums(2 * c_n);
    if (sync_sum_ == nullptr) {
      // Centred on the first sample's mean, as the NCHW path.
      std::vector<double> shift(c_n, 0.0);
      for (int64_t r = 0; r < s_n; ++r)
        for (int64_t c = 0; c < c_n; ++c) shift[c] += static_cast<double>(xs[r * c_n + c]);
      for (double& v : shift) v /= static_cast<double>(s_n);
      CentredSumsNhwc(xs, rows, c_n, shift.data(), sums.data());
      for (int64_t c = 0; c < c_n; ++c) {
        const auto [mean, var] = BatchStats(static_cast<double>(rows), shift[c], sums[c],
                                            sums[c_n + c], momentum_, &rmean[c], &rvar[c]);
        SetStats(c, mean, var);
      }
      normalise();
      return;
    }
    // Synced: the NCHW path's two sync_sum calls, with the same packing.
    // sums[0, C): sum(x) (the second half stays zero).
    SumRowChunks(rows, c_n, 2 * c_n, sums.data(), [&](int64_t r0, int64_t r1, double* acc) {
      SumChannelTiles(r0, r1, c_n, acc, acc + c_n, [&](int64_t r, int64_t c, auto& a, auto&) {
        a += LoadLanes<std::remove_reference_t<decltype(a)>>(xs + r * c_n + c);
      });
    });
    sync_buf_.assign(2 * c_n + 2, 0.0f);
    float* buf = sync_buf_.data();
    for (int64_t c = 0; c < c_n; ++c) PutSplit(sums[c], &buf[c], &buf[c_n + c]);
    const double count = SyncCountAndShift(rows, in.shape());
    CentredSumsNhwc(xs, rows, c_n, shift_.data(), sums.data());
    sync_buf_.assign(4 * c_n, 0.0f);
    buf = sync_buf_.data();
    for (int64_t c = 0; c < c_n; ++c) {
      PutSplit(sums[c], &buf[c], &buf[c_n + c]);
      PutSplit(sums[c_n + c], &buf[2 * c_n + c], &buf[3 * c_n + c]);
    }
    (*sync_sum_)(buf, 4 * c_n);
    for (int64_t c = 0; c < c_n; ++c) {
      const auto [mean, var] =
          BatchStats(count, shift_[c], GetSplit(buf[c], buf[c_n + c]),
                     GetSplit(buf[2 * c_n + c], buf[3 * c_n + c]), momentum_, &rmean[c], &rvar[c]);
      SetStats(c, mean, var);
    }
    normalise();
  });
}

void BatchNormLayer::BackwardNhwc(const Tensor& in, const Tensor& dy, Tensor* dx) {
  const int64_t c_n = channels_, s_n = spatial_, rows = in.dim(0) * s_n;
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    const T* g = dy.data<T>();
    T* d = dx != nullptr ? dx->data<T>() : nullptr;
    const T* gamma = affine_ ? parameters()[0].value.data<T>() : nullptr;
    const T* beta = affine_ ? parameters()[1].value.data<T>() : nullptr;
    T* dgamma = affine_ ? parameters()[0].grad.data<T>() : nullptr;
    T* dbeta = affine_ ? parameters()[1].grad.data<T>() : nullptr;
    const ChannelAffines<T> f(c_n, mean_, inv_std_, gamma, beta);
    const T *tm = f.shift.data(), *a = f.scale.data(), *b = f.bias.data();
    // A fused activation: dy through it at bn(x), recomputed from x a block
    // of rows at a time (y is never read: it may be bf16, WritesBf16), left
    // in dx when wanted (the dx pass then overwrites it in place).
    const bool fused = gelu_ || relu_;
    const bool du_in_dx = fused && d != nullptr;
    const T* grad = du_in_dx ? d : g;
    // sums[0, C): sum(dy), sums[C, 2C): sum(dy * (x - mean)), this replica's.
    std::vector<double> sums(2 * c_n);
    const double* mean = mean_.data();
    SumRowChunks(rows, c_n, 2 * c_n, sums.data(), [&](int64_t r0, int64_t r1, double* acc) {
      const int64_t block =
          fused ? std::max<int64_t>(8, 2048 / c_n) : std::max<int64_t>(1, r1 - r0);
      // bn(x) for a GELU, or the activation's dy when dx does not hold it.
      std::vector<T> u(gelu_ || (fused && !du_in_dx) ? block * c_n : 0);
      for (int64_t rb = r0; rb < r1; rb += block) {
        const int64_t re = std::min(r1, rb + block);
        const T* gb = g + rb * c_n;
        if (fused) {
          T* du = du_in_dx ? d + rb * c_n : u.data();
          for (int64_t r = rb; r < re; ++r) {
            const T* row = xs + r * c_n;
            if (relu_) {  // the forward's expression, so the same mask as max(., 0)
              const T* gr = g + r * c_n;
              T* dr = du + (r - rb) * c_n;
              for (int64_t c = 0; c < c_n; ++c)
                dr[c] = (row[c] - tm[c]) * a[c] + b[c] > T(0) ? gr[c] : T(0);
            } else {
              T* out = u.data() + (r - rb) * c_n;
              for (int64_t c = 0; c < c_n; ++c) out[c] = (row[c] - tm[c]) * a[c] + b[c];
            }
          }
          if (gelu_) GeluGradSpan(u.data(), g + rb * c_n, du, (re - rb) * c_n);
          gb = du;
        }
        // dy (through the fused activation) and dy * (x - mean).
        auto grad_terms = [&](int64_t r, int64_t c, auto& a, auto& b) {
          using V = std::remove_reference_t<decltype(a)>;
          const V v = LoadLanes<V>(gb + (r - rb) * c_n + c);
          a += v;
          b += v * (LoadLanes<V>(xs + r * c_n + c) - LoadLanes<V>(mean + c));
        };
        SumChannelTiles(rb, re, c_n, acc, acc + c_n, grad_terms);
      }
    });
    for (int64_t c = 0; c < c_n; ++c) {
      sums[c_n + c] *= inv_std_[c];
      if (dgamma != nullptr) {
        dgamma[c] += static_cast<T>(sums[c_n + c]);
        dbeta[c] += static_cast<T>(sums[c]);
      }
    }
    if (d == nullptr) return;
    if (last_training_ && sync_sum_ != nullptr) {
      sync_buf_.assign(4 * c_n, 0.0f);
      float* buf = sync_buf_.data();
      for (int64_t c = 0; c < c_n; ++c) {
        PutSplit(sums[c], &buf[c], &buf[c_n + c]);
        PutSplit(sums[c_n + c], &buf[2 * c_n + c], &buf[3 * c_n + c]);
      }
      (*sync_sum_)(buf, 4 * c_n);
      for (int64_t c = 0; c < c_n; ++c) {
        sums[c] = GetSplit(buf[c], buf[c_n + c]);
        sums[c_n + c] = GetSplit(buf[2 * c_n + c], buf[3 * c_n + c]);
      }
    }
    // dx = dy * k + (x - mean) * u + v per channel (training), dy * k
    // (evaluation: the running statistics are constants).
    const double inv_count = 1.0 / count_;
    std::vector<T> tk(c_n), tu(c_n, T(0)), tv(c_n, T(0));
    for (int64_t c = 0; c < c_n; ++c) {
      const double scale = (gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0) * inv_std_[c];
      tk[c] = static_cast<T>(scale);
      if (last_training_) {
        tu[c] = static_cast<T>(-scale * inv_std_[c] * sums[c_n + c] * inv_count);
        tv[c] = static_cast<T>(-scale * sums[c] * inv_count);
      }
    }
    cpu::ParallelFor(rows, RowGrain(c_n), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const T* gr = grad + r * c_n;
        const T* row = xs + r * c_n;
        T* out = d + r * c_n;
        for (int64_t c = 0; c < c_n; ++c) out[c] = gr[c] * tk[c] + (row[c] - tm[c]) * tu[c] + tv[c];
      }
    });
  });
}

}  // namespace cnnflow
