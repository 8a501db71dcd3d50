#include "ops/layers/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/parallel.h"

namespace cnnflow {

namespace {

// Sum of f(i) for i in [0, len) in double, over 8 independent lanes so the
// compiler vectorises it (a single accumulator is a serial add chain). The
// order is fixed by len, so results never depend on the thread count.
template <typename F>
inline double SumLanes(int64_t len, F&& f) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    for (int k = 0; k < 8; ++k) lane[k] += f(i + k);
  }
  double tail = 0;
  for (; i < len; ++i) tail += f(i);
  return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) +
         tail;
}

// SumLanes of both halves of f(i) = {a, b}, added to *sa and *sb, in one
// pass (f computed once per element).
template <typename F>
inline void SumLanesOfTwo(int64_t len, F&& f, double* sa, double* sb) {
  double la[8] = {0, 0, 0, 0, 0, 0, 0, 0}, lb[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8) {
    for (int k = 0; k < 8; ++k) {
      const auto [va, vb] = f(i + k);
      la[k] += va;
      lb[k] += vb;
    }
  }
  double ta = 0, tb = 0;
  for (; i < len; ++i) {
    const auto [va, vb] = f(i);
    ta += va;
    tb += vb;
  }
  *sa += ((la[0] + la[1]) + (la[2] + la[3])) + ((la[4] + la[5]) + (la[6] + la[7])) + ta;
  *sb += ((lb[0] + lb[1]) + (lb[2] + lb[3])) + ((lb[4] + lb[5]) + (lb[6] + lb[7])) + tb;
}

// SumLanes of d(i) and of d(i)^2 in one pass over the data.
template <typename F>
inline void SumLanesAndSquares(int64_t len, F&& d, double* sum, double* sum_sq) {
  SumLanesOfTwo(
      len,
      [&](int64_t i) {
        const double v = d(i);
        return std::pair<double, double>{v, v * v};
      },
      sum, sum_sq);
}

// Channels per parallel task: enough elements that scheduling is noise.
int64_t ChannelGrain(int64_t per_channel) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(per_channel, 1));
}

// SyncBN sums travel as float (ForwardContext::sync_sum). A double v is
// sent as the pair hi = float(v), lo = float(v - hi): with one replica (or
// an identity sync, as in the f64 gradient checks) v comes back to ~48
// bits; over N replicas the error is that of the float sum of the hi parts,
// ~N * 2^-24 relative, about the precision of f32 data itself. The mean is
// then corrected by a second pass around the pass-1 mean, so its error is
// relative to the spread of the data, not to |mean|.
inline void PutSplit(double v, float* hi, float* lo) {
  *hi = static_cast<float>(v);
  *lo = static_cast<float>(v - static_cast<double>(*hi));
}
inline double GetSplit(float hi, float lo) {
  return static_cast<double>(hi) + static_cast<double>(lo);
}

// A count as two floats, count = a * 4096 + b with 0 <= b < 4096: the sums
// over replicas stay exact integers up to 2^24 * 4096 = 2^36 values.
constexpr int64_t kCountBase = 4096;
inline void PutCount(int64_t count, float* out) {
  out[0] = static_cast<float>(count / kCountBase);
  out[1] = static_cast<float>(count % kCountBase);
}
inline double GetCount(const float* in) {
  return static_cast<double>(in[0]) * kCountBase + static_cast<double>(in[1]);
}

}  // namespace

BatchNormLayer::BatchNormLayer(const std::string& name, const Args& args)
    : Layer(name),
      momentum_(args.Float("momentum")),
      eps_(args.Float("eps")),
      affine_(args.Bool("affine")) {
  if (!(momentum_ >= 0.0 && momentum_ <= 1.0)) {
    throw ConfigError(
        StrCat("batchnorm '", name, "': momentum must be in [0, 1], got ", momentum_));
  }
  if (!(eps_ > 0.0)) {
    throw ConfigError(StrCat("batchnorm '", name, "': eps must be positive, got ", eps_));
  }
}

Shape BatchNormLayer::Build(const std::vector<Shape>& inputs, DType dtype) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "batchnorm takes 1 input, got ", inputs.size());
  const Shape& s = inputs[0];
  if (s.rank() < 1 || s.rank() > 3) {
    throw ShapeError(StrCat("batchnorm expects a sample [C], [C, L] or [C, H, W], got ", s));
  }
  channels_ = s[0];
  spatial_ = s.numel() / std::max<int64_t>(channels_, 1);
  if (affine_) {
    AddParameter("weight", Shape{channels_}, dtype);
    AddParameter("bias", Shape{channels_}, dtype);
  }
  AddBuffer("running_mean", Tensor::Zeros(Shape{channels_}, dtype));
  AddBuffer("running_var", Tensor::Full(Shape{channels_}, 1.0, dtype));
  InitState();
  return s;
}

void BatchNormLayer::ResetParameters(Rng& /*rng*/) { InitState(); }

void BatchNormLayer::InitState() {
  auto ones = [&](Tensor& t) { t.CopyFrom(Tensor::Full(t.shape(), 1.0, t.dtype())); };
  if (affine_) {
    ones(parameters()[0].value);
    parameters()[1].value.Zero();
  }
  buffers()[0].value.Zero();
  ones(buffers()[1].value);
}

void BatchNormLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                             const ForwardContext& ctx) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0);
  const int64_t c_n = channels_, s_n = spatial_;
  const int64_t m = n * s_n;  // values per channel (this replica's shard)
  CNNFLOW_ENFORCE(in.numel() == n * c_n * s_n && y.numel() == in.numel(), "batchnorm ", name(),
                  ": input ", in.shape(), " output ", y.shape());
  last_training_ = ctx.training;
  sync_sum_ = ctx.training ? ctx.sync_sum : nullptr;
  if (sync_sum_ != nullptr && !*sync_sum_) {
    throw Error(StrCat("batchnorm ", name(),
                       ": ForwardContext::sync_sum points to an empty "
                       "function"));
  }
  if (ctx.training && sync_sum_ == nullptr && m <= 1) {
    throw Error(StrCat("batchnorm ", name(),
                       ": expected more than 1 value per channel when training, got input ",
                       in.shape()));
  }
  local_count_ = m;
  count_ = static_cast<double>(m);
  mean_.resize(c_n);
  inv_std_.resize(c_n);
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    T* ys = y.data<T>();
    const T* gamma = affine_ ? parameters()[0].value.data<T>() : nullptr;
    const T* beta = affine_ ? parameters()[1].value.data<T>() : nullptr;
    T* rmean = buffers()[0].value.data<T>();
    T* rvar = buffers()[1].value.data<T>();
    const double momentum = momentum_, eps = eps_;
    // Channels are independent: each task owns whole channels, so every
    // statistic is one serial-order sum (deterministic for any split).
    auto sum_x = [&](int64_t c) {
      double sum = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T* row = xs + (i * c_n + c) * s_n;
        sum += SumLanes(s_n, [&](int64_t k) { return static_cast<double>(row[k]); });
      }
      return sum;
    };
    // sum(x - shift) and sum((x - shift)^2), shift ~ the mean: the second
    // pass that avoids the cancellation of E[x^2] - E[x]^2; the first sum
    // corrects the mean for the rounding of shift.
    auto centred_sums = [&](int64_t c, double shift, double* s1, double* s2) {
      *s1 = 0;
      *s2 = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T* row = xs + (i * c_n + c) * s_n;
        SumLanesAndSquares(
            s_n, [&](int64_t k) { return static_cast<double>(row[k]) - shift; }, s1, s2);
      }
    };
    // y = (x - mean) * a + beta with a = gamma / std (subtracting first
    // keeps f32 precise when |mean| >> std).
    auto normalise = [&](int64_t c, double mean, double var) {
      const double inv_std = 1.0 / std::sqrt(var + eps);
      mean_[c] = mean;
      inv_std_[c] = inv_std;
      const T tm = static_cast<T>(mean);
      const T a =
          static_cast<T>((gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0) * inv_std);
      const T b = beta != nullptr ? beta[c] : T(0);
      for (int64_t i = 0; i < n; ++i) {
        const T* row = xs + (i * c_n + c) * s_n;
        T* out = ys + (i * c_n + c) * s_n;
        for (int64_t k = 0; k < s_n; ++k) out[k] = (row[k] - tm) * a + b;
        if (relu_) ReluInPlace(out, s_n);
      }
    };
    // Batch statistics from the (global) count and centred sums; updates
    // the running statistics, then normalises this replica's rows.
    auto finish = [&](int64_t c, double count, double shift, double s1, double s2) {
      const double d = s1 / count;
      const double mean = shift + d;
      const double ss = std::max(s2 - s1 * d, 0.0);  // sum((x - mean)^2)
      // PyTorch updates the running variance with the unbiased estimate.
      rmean[c] = static_cast<T>((1 - momentum) * rmean[c] + momentum * mean);
      rvar[c] = static_cast<T>((1 - momentum) * rvar[c] + momentum * (ss / (count - 1)));
      normalise(c, mean, ss / count);
    };

    if (!ctx.training) {
      cpu::ParallelFor(c_n, ChannelGrain(m), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          normalise(c, static_cast<double>(rmean[c]), static_cast<double>(rvar[c]));
        }
      });
    } else if (sync_sum_ == nullptr) {
      // One pass of sums centred on the first sample's mean: within a few
      // standard deviations of the batch mean, so the double sums lose
      // nothing f32 would keep (a pass fewer over x than centring on the
      // batch mean, as the synced path must).
      cpu::ParallelFor(c_n, ChannelGrain(m), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          const T* first = xs + c * s_n;
          const double shift =
              SumLanes(s_n, [&](int64_t k) { return static_cast<double>(first[k]); }) /
              static_cast<double>(s_n);
          double s1, s2;
          centred_sums(c, shift, &s1, &s2);
          finish(c, static_cast<double>(m), shift, s1, s2);
        }
      });
    } else {
      // Pass 1: [sum x (hi C, lo C), count (2)] -> the global count and a
      // per-channel shift (the mean up to the float rounding of the sum).
      sync_buf_.assign(2 * c_n + 2, 0.0f);
      float* buf = sync_buf_.data();
      cpu::ParallelFor(c_n, ChannelGrain(m), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) PutSplit(sum_x(c), &buf[c], &buf[c_n + c]);
      });
      PutCount(m, &buf[2 * c_n]);
      (*sync_sum_)(buf, 2 * c_n + 2);
      const double count = GetCount(&buf[2 * c_n]);
      if (!(count > 1)) {
        throw Error(StrCat("batchnorm ", name(),
                           ": expected more than 1 value per channel over the synced replicas "
                           "when training, got ",
                           count, " (this replica's input ", in.shape(), ")"));
      }
      count_ = count;
      shift_.resize(c_n);
      for (int64_t c = 0; c < c_n; ++c) shift_[c] = GetSplit(buf[c], buf[c_n + c]) / count;
      // Pass 2: [sum(x - shift) (hi, lo), sum((x - shift)^2) (hi, lo)].
      sync_buf_.assign(4 * c_n, 0.0f);
      buf = sync_buf_.data();
      cpu::ParallelFor(c_n, ChannelGrain(m), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          double s1, s2;
          centred_sums(c, shift_[c], &s1, &s2);
          PutSplit(s1, &buf[c], &buf[c_n + c]);
          PutSplit(s2, &buf[2 * c_n + c], &buf[3 * c_n + c]);
        }
      });
      (*sync_sum_)(buf, 4 * c_n);
      cpu::ParallelFor(c_n, ChannelGrain(m), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          finish(c, count, shift_[c], GetSplit(buf[c], buf[c_n + c]),
                 GetSplit(buf[2 * c_n + c], buf[3 * c_n + c]));
        }
      });
    }
  });
}

void BatchNormLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& y,
                              const Tensor& dy, const std::vector<Tensor*>& dx) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0);
  const int64_t c_n = channels_, s_n = spatial_;
  const int64_t m = n * s_n;
  CNNFLOW_ENFORCE(
      dy.numel() == in.numel() && static_cast<int64_t>(mean_.size()) == c_n && m == local_count_,
      "batchnorm ", name(), ": backward without a matching forward, x ", in.shape(), " dy ",
      dy.shape());
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    const T* g = dy.data<T>();
    T* d = dx[0] != nullptr ? dx[0]->data<T>() : nullptr;
    // With a fused ReLU, dy is the gradient of max(bn, 0): each row of it is
    // masked by y > 0 (into a row buffer of this thread) where it is read.
    const T* ys = relu_ ? y.data<T>() : nullptr;
    auto dy_row = [&](int64_t i, int64_t c) -> const T* {
      const T* grow = g + (i * c_n + c) * s_n;
      if (ys == nullptr) return grow;
      thread_local std::vector<T> buf;
      if (static_cast<int64_t>(buf.size()) < s_n) buf.resize(s_n);
      ReluMask(ys + (i * c_n + c) * s_n, grow, buf.data(), s_n);
      return buf.data();
    };
    const T* gamma = affine_ ? parameters()[0].value.data<T>() : nullptr;
    T* dgamma = affine_ ? parameters()[0].grad.data<T>() : nullptr;
    T* dbeta = affine_ ? parameters()[1].grad.data<T>() : nullptr;
    const bool training = last_training_;
    const double inv_count = 1.0 / count_;
    // This replica's sum(dy) and sum(dy * xhat), xhat = (x - mean) * inv_std;
    // the parameter gradients are these LOCAL sums.
    auto local_sums = [&](int64_t c, double* sum_dy, double* sum_dy_xhat) {
      const double mean = mean_[c];
      double s = 0, sxc = 0;
      for (int64_t i = 0; i < n; ++i) {
        const T* row = xs + (i * c_n + c) * s_n;
        const T* grow = dy_row(i, c);
        SumLanesOfTwo(
            s_n,
            [&](int64_t k) {
              const double g = grow[k];
              return std::pair<double, double>{g, g * (static_cast<double>(row[k]) - mean)};
            },
            &s, &sxc);
      }
      *sum_dy = s;
      *sum_dy_xhat = sxc * inv_std_[c];
      if (dgamma != nullptr) {
        dgamma[c] += static_cast<T>(*sum_dy_xhat);
        dbeta[c] += static_cast<T>(s);
      }
    };
    // dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat)) with the
    // means over the (global) batch, written as dx = dy * k + (x - mean) * u + v:
    // per-channel constants, a short inner loop.
    auto input_grad = [&](int64_t c, double sum_dy, double sum_dy_xhat) {
      const double inv_std = inv_std_[c];
      const double scale = (gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0) * inv_std;
      const T tk = static_cast<T>(scale);
      const T tu = static_cast<T>(-scale * inv_std * sum_dy_xhat * inv_count);
      const T tv = static_cast<T>(-scale * sum_dy * inv_count);
      const T tm = static_cast<T>(mean_[c]);
      for (int64_t i = 0; i < n; ++i) {
        const T* row = xs + (i * c_n + c) * s_n;
        const T* grow = dy_row(i, c);
        T* out = d + (i * c_n + c) * s_n;
        for (int64_t k = 0; k < s_n; ++k) out[k] = grow[k] * tk + (row[k] - tm) * tu + tv;
      }
    };

    if (training && sync_sum_ != nullptr && d != nullptr) {
      // One call: [sum dy (hi C, lo C), sum dy * xhat (hi C, lo C)].
      sync_buf_.assign(4 * c_n, 0.0f);
      float* buf = sync_buf_.data();
      cpu::ParallelFor(c_n, ChannelGrain(m), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          double sum_dy, sum_dy_xhat;
          local_sums(c, &sum_dy, &sum_dy_xhat);
          PutSplit(sum_dy, &buf[c], &buf[c_n + c]);
          PutSplit(sum_dy_xhat, &buf[2 * c_n + c], &buf[3 * c_n + c]);
        }
      });
      (*sync_sum_)(buf, 4 * c_n);
      cpu::ParallelFor(c_n, ChannelGrain(m), [&](int64_t c0, int64_t c1) {
        for (int64_t c = c0; c < c1; ++c) {
          input_grad(c, GetSplit(buf[c], buf[c_n + c]),
                     GetSplit(buf[2 * c_n + c], buf[3 * c_n + c]));
        }
      });
      return;
    }
    cpu::ParallelFor(c_n, ChannelGrain(m), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double sum_dy, sum_dy_xhat;
        local_sums(c, &sum_dy, &sum_dy_xhat);
        if (d == nullptr) continue;
        if (training) {
          input_grad(c, sum_dy, sum_dy_xhat);
        } else {
          // The running statistics are constants: only the affine map remains.
          const T tk = static_cast<T>((gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0) *
                                      inv_std_[c]);
          for (int64_t i = 0; i < n; ++i) {
            const T* grow = dy_row(i, c);
            T* out = d + (i * c_n + c) * s_n;
            for (int64_t k = 0; k < s_n; ++k) out[k] = grow[k] * tk;
          }
        }
      }
    });
  });
}

CNNFLOW_REGISTER_LAYER(
    batchnorm, BatchNormLayer,
    Schema("Batch normalisation over [C, H, W], [C, L] or [C] samples (torch.nn.BatchNorm2d / "
           "BatchNorm1d): per-channel statistics over the batch and spatial positions; running "
           "statistics for evaluation.")
        .Optional("momentum", ParamType::kFloat, 0.1,
                  "weight of the batch statistic in the running-statistics update")
        .Optional("eps", ParamType::kFloat, 1e-5, "added to the variance for stability")
        .Optional("affine", ParamType::kBool, true, "learn a per-channel scale and shift"));

}  // namespace cnnflow
