#include "ops/batch_norm.h"

#include <algorithm>
#include <cmath>

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

// Channels per parallel task: enough elements that scheduling is noise.
int64_t ChannelGrain(int64_t per_channel) {
  return std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(per_channel, 1));
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
  const int64_t m = n * s_n;  // values per channel
  CNNFLOW_ENFORCE(in.numel() == n * c_n * s_n && y.numel() == in.numel(), "batchnorm ", name(),
                  ": input ", in.shape(), " output ", y.shape());
  last_training_ = ctx.training;
  if (ctx.training && m <= 1) {
    throw Error(StrCat("batchnorm ", name(),
                       ": expected more than 1 value per channel when training, got input ",
                       in.shape()));
  }
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
    const bool training = ctx.training;
    const double momentum = momentum_, eps = eps_;
    // Channels are independent: each task owns whole channels, so every
    // statistic is one serial-order sum (deterministic for any split).
    cpu::ParallelFor(c_n, ChannelGrain(m), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        double mean, var;
        if (training) {
          double sum = 0;
          for (int64_t i = 0; i < n; ++i) {
            const T* row = xs + (i * c_n + c) * s_n;
            sum += SumLanes(s_n, [&](int64_t k) { return static_cast<double>(row[k]); });
          }
          mean = sum / static_cast<double>(m);
          double sq = 0;  // two passes: no cancellation in E[x^2] - E[x]^2
          for (int64_t i = 0; i < n; ++i) {
            const T* row = xs + (i * c_n + c) * s_n;
            sq += SumLanes(s_n, [&](int64_t k) {
              const double d = static_cast<double>(row[k]) - mean;
              return d * d;
            });
          }
          var = sq / static_cast<double>(m);
          // PyTorch updates the running variance with the unbiased estimate.
          const double unbiased = sq / static_cast<double>(m - 1);
          rmean[c] = static_cast<T>((1 - momentum) * rmean[c] + momentum * mean);
          rvar[c] = static_cast<T>((1 - momentum) * rvar[c] + momentum * unbiased);
        } else {
          mean = static_cast<double>(rmean[c]);
          var = static_cast<double>(rvar[c]);
        }
        const double inv_std = 1.0 / std::sqrt(var + eps);
        mean_[c] = mean;
        inv_std_[c] = inv_std;
        // y = (x - mean) * a + beta with a = gamma / std (subtracting first
        // keeps f32 precise when |mean| >> std).
        const T tm = static_cast<T>(mean);
        const T a =
            static_cast<T>((gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0) * inv_std);
        const T b = beta != nullptr ? beta[c] : T(0);
        for (int64_t i = 0; i < n; ++i) {
          const T* row = xs + (i * c_n + c) * s_n;
          T* out = ys + (i * c_n + c) * s_n;
          for (int64_t k = 0; k < s_n; ++k) out[k] = (row[k] - tm) * a + b;
        }
      }
    });
  });
}

void BatchNormLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& /*y*/,
                              const Tensor& dy, const std::vector<Tensor*>& dx) {
  const Tensor& in = *x[0];
  const int64_t n = in.dim(0);
  const int64_t c_n = channels_, s_n = spatial_;
  const int64_t m = n * s_n;
  CNNFLOW_ENFORCE(dy.numel() == in.numel() && static_cast<int64_t>(mean_.size()) == c_n,
                  "batchnorm ", name(), ": backward without a matching forward, dy ", dy.shape());
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    const T* g = dy.data<T>();
    T* d = dx[0] != nullptr ? dx[0]->data<T>() : nullptr;
    const T* gamma = affine_ ? parameters()[0].value.data<T>() : nullptr;
    T* dgamma = affine_ ? parameters()[0].grad.data<T>() : nullptr;
    T* dbeta = affine_ ? parameters()[1].grad.data<T>() : nullptr;
    const bool training = last_training_;
    cpu::ParallelFor(c_n, ChannelGrain(m), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        const double mean = mean_[c], inv_std = inv_std_[c];
        // sum(dy) and sum(dy * xhat), xhat = (x - mean) * inv_std.
        double sum_dy = 0, sum_dy_xc = 0;
        for (int64_t i = 0; i < n; ++i) {
          const T* row = xs + (i * c_n + c) * s_n;
          const T* grow = g + (i * c_n + c) * s_n;
          sum_dy += SumLanes(s_n, [&](int64_t k) { return static_cast<double>(grow[k]); });
          sum_dy_xc += SumLanes(s_n, [&](int64_t k) {
            return static_cast<double>(grow[k]) * (static_cast<double>(row[k]) - mean);
          });
        }
        const double sum_dy_xhat = sum_dy_xc * inv_std;
        if (dgamma != nullptr) {
          dgamma[c] += static_cast<T>(sum_dy_xhat);
          dbeta[c] += static_cast<T>(sum_dy);
        }
        if (d == nullptr) continue;
        const double scale = (gamma != nullptr ? static_cast<double>(gamma[c]) : 1.0) * inv_std;
        if (training) {
          // dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat)), written as
          // dx = dy * k + (x - mean) * u + v: per-channel constants, a short inner loop.
          const double inv_m = 1.0 / static_cast<double>(m);
          const T tk = static_cast<T>(scale);
          const T tu = static_cast<T>(-scale * inv_std * sum_dy_xhat * inv_m);
          const T tv = static_cast<T>(-scale * sum_dy * inv_m);
          const T tm = static_cast<T>(mean);
          for (int64_t i = 0; i < n; ++i) {
            const T* row = xs + (i * c_n + c) * s_n;
            const T* grow = g + (i * c_n + c) * s_n;
            T* out = d + (i * c_n + c) * s_n;
            for (int64_t k = 0; k < s_n; ++k) out[k] = grow[k] * tk + (row[k] - tm) * tu + tv;
          }
        } else {
          // The running statistics are constants: only the affine map remains.
          const T tk = static_cast<T>(scale);
          for (int64_t i = 0; i < n; ++i) {
            const T* grow = g + (i * c_n + c) * s_n;
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
