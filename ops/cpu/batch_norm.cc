#include "ops/layers/batch_norm.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/batch_norm_sums.h"
#include "ops/cpu/bf16_layout.h"
#include "ops/cpu/gelu_vector.h"
#include "ops/cpu/onednn.h"
#include "ops/cpu/parallel.h"
#include "ops/layers/activation.h"

namespace cnnflow {

using namespace cpu::batch_norm;  // the shared sums and maps (batch_norm_sums.h)

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

void BatchNormLayer::SetStats(int64_t c, double mean, double var) {
  mean_[c] = mean;
  inv_std_[c] = 1.0 / std::sqrt(var + eps_);
}

double BatchNormLayer::SyncCountAndShift(int64_t local_count, const Shape& in_shape) {
  const int64_t c_n = channels_;
  float* buf = sync_buf_.data();
  PutCount(local_count, &buf[2 * c_n]);
  (*sync_sum_)(buf, 2 * c_n + 2);
  const double count = GetCount(&buf[2 * c_n]);
  if (!(count > 1)) {
    throw Error(StrCat("batchnorm ", name(),
                       ": expected more than 1 value per channel over the synced replicas "
                       "when training, got ",
                       count, " (this replica's input ", in_shape, ")"));
  }
  count_ = count;
  shift_.resize(c_n);
  for (int64_t c = 0; c < c_n; ++c) shift_[c] = GetSplit(buf[c], buf[c_n + c]) / count;
  return count;
}

namespace {

// One call's [n, c_n, s_n] input x as T, the affine parameters (null
// without affine) and the statistics it normalises with (the layer's mean_
// and inv_std_, set per channel as the forward goes).
template <typename T>
struct NchwInput {
  int64_t n, c_n, s_n;
  const T* xs;
  const T* gamma;
  const T* beta;
  const std::vector<double>& mean;
  const std::vector<double>& inv_std;

  // Channels are independent: each task owns a range of whole channels, so
  // every statistic is one serial-order sum (deterministic for any split).
  template <typename Fn>
  void ForRows(int64_t c0, int64_t c1, Fn&& fn) const {
    cpu::batch_norm::ForRows(n, c_n, s_n, c0, c1, fn);
  }

  // sum(x - shift) and sum((x - shift)^2) per channel of [c0, c1), shift ~
  // the mean: the second pass that avoids the cancellation of E[x^2] -
  // E[x]^2; the first sum corrects the mean for the rounding of shift.
  void CentredSums(int64_t c0, int64_t c1, const double* shift, double* s1, double* s2) const {
    std::fill_n(s1, c1 - c0, 0.0);
    std::fill_n(s2, c1 - c0, 0.0);
    ForRows(c0, c1, [&](int64_t c, int64_t at) {
      SumCentred(xs + at, s_n, shift[c - c0], &s1[c - c0], &s2[c - c0]);
    });
  }

  // y = (x - mean) * a + beta with a = gamma / std (subtracting first
  // keeps f32 precise when |mean| >> std), over channels [c0, c1) whose
  // statistics are set; a fused GELU then runs over each sample's span of
  // them (contiguous).
  void Normalise(int64_t c0, int64_t c1, bool relu, bool gelu, T* ys) const {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t at = (i * c_n + c) * s_n;
        const auto [tm, a, b] = AffineOf(c, mean, inv_std, gamma, beta);
        const T* row = xs + at;
        T* out = ys + at;
        if (relu) {
          for (int64_t k = 0; k < s_n; ++k) out[k] = std::max((row[k] - tm) * a + b, T(0));
        } else {
          for (int64_t k = 0; k < s_n; ++k) out[k] = (row[k] - tm) * a + b;
        }
      }
      if (gelu) GeluSpan(ys + (i * c_n + c0) * s_n, (c1 - c0) * s_n);
    }
  }
};

// A backward call's gradients over an NchwInput: dy, y (with a fused ReLU,
// whose mask it is, else null), dx (null when not wanted) and the
// parameters' gradients (null without affine).
template <typename T>
struct NchwGrads {
  const NchwInput<T>& x;
  const T* g;
  const T* ys;
  T* d;
  T* dgamma;
  T* dbeta;
  bool gelu;
  double inv_count;  // 1 / the (global) values per channel
  // With a fused GELU, dy is the gradient of gelu(bn): LocalSums takes it
  // through the GELU at bn(x), recomputed from x a sample's span at a time,
  // and leaves that gradient in dx (when wanted), where the dx passes read
  // it and overwrite it in place.
  bool du_in_dx() const { return gelu && d != nullptr; }
  const T* GradAt(int64_t at) const { return du_in_dx() ? d + at : g + at; }

  // This replica's sum(dy) and sum(dy * xhat) per channel of [c0, c1),
  // xhat = (x - mean) * inv_std; the parameter gradients are these LOCAL sums.
  void LocalSums(int64_t c0, int64_t c1, double* sum_dy, double* sum_dy_xhat) const {
    const int64_t n = x.n, c_n = x.c_n, s_n = x.s_n;
    const T* xs = x.xs;
    std::fill_n(sum_dy, c1 - c0, 0.0);
    std::fill_n(sum_dy_xhat, c1 - c0, 0.0);
    const int64_t span = (c1 - c0) * s_n;
    std::vector<T> u(gelu ? span : 0);  // bn(x) over a sample's span
    for (int64_t i = 0; i < n; ++i) {
      const int64_t at0 = (i * c_n + c0) * s_n;
      const T* grad = g + at0;
      if (gelu) {
        for (int64_t c = c0; c < c1; ++c) {
          const auto [tm, a, b] = AffineOf(c, x.mean, x.inv_std, x.gamma, x.beta);
          const T* row = xs + at0 + (c - c0) * s_n;
          T* out = u.data() + (c - c0) * s_n;
          for (int64_t k = 0; k < s_n; ++k) out[k] = (row[k] - tm) * a + b;
        }
        T* du = du_in_dx() ? d + at0 : u.data();
        GeluGradSpan(u.data(), g + at0, du, span);
        grad = du;
      }
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t at = at0 + (c - c0) * s_n;
        SumGradAndGradCentred(grad + (c - c0) * s_n, ys != nullptr ? ys + at : nullptr, xs + at,
                              s_n, x.mean[c], &sum_dy[c - c0], &sum_dy_xhat[c - c0]);
      }
    }
    for (int64_t c = c0; c < c1; ++c) {
      sum_dy_xhat[c - c0] *= x.inv_std[c];
      if (dgamma != nullptr) {
        dgamma[c] += static_cast<T>(sum_dy_xhat[c - c0]);
        dbeta[c] += static_cast<T>(sum_dy[c - c0]);
      }
    }
  }

  // dx = gamma * inv_std * (dy - mean(dy) - xhat * mean(dy * xhat)) with the
  // means over the (global) batch, written as dx = dy * k + (x - mean) * u + v:
  // per-channel constants, a short inner loop. dy is masked where y <= 0
  // (both loads unconditional, so the loops vectorise).
  void InputGrad(int64_t c0, int64_t c1, const double* sum_dy, const double* sum_dy_xhat) const {
    const int64_t s_n = x.s_n;
    x.ForRows(c0, c1, [&](int64_t c, int64_t at) {
      const double inv_std = x.inv_std[c];
      const double scale = (x.gamma != nullptr ? static_cast<double>(x.gamma[c]) : 1.0) * inv_std;
      const T tk = static_cast<T>(scale);
      const T tu = static_cast<T>(-scale * inv_std * sum_dy_xhat[c - c0] * inv_count);
      const T tv = static_cast<T>(-scale * sum_dy[c - c0] * inv_count);
      const T tm = static_cast<T>(x.mean[c]);
      const T* grow = GradAt(at);
      const T* row = x.xs + at;
      T* out = d + at;
      if (ys == nullptr) {
        for (int64_t k = 0; k < s_n; ++k) out[k] = grow[k] * tk + (row[k] - tm) * tu + tv;
        return;
      }
      const T* yrow = ys + at;
      for (int64_t k = 0; k < s_n; ++k) {
        const T gk = grow[k];
        out[k] = (yrow[k] > T(0) ? gk : T(0)) * tk + (row[k] - tm) * tu + tv;
      }
    });
  }

  // Evaluation: the running statistics are constants, only the affine map remains.
  void AffineGrad(int64_t c0, int64_t c1) const {
    const int64_t s_n = x.s_n;
    x.ForRows(c0, c1, [&](int64_t c, int64_t at) {
      const T tk = static_cast<T>((x.gamma != nullptr ? static_cast<double>(x.gamma[c]) : 1.0) *
                                  x.inv_std[c]);
      const T* grow = GradAt(at);
      T* out = d + at;
      if (ys == nullptr) {
        for (int64_t k = 0; k < s_n; ++k) out[k] = grow[k] * tk;
        return;
      }
      const T* yrow = ys + at;
      for (int64_t k = 0; k < s_n; ++k) {
        const T gk = grow[k];
        out[k] = (yrow[k] > T(0) ? gk : T(0)) * tk;
      }
    });
  }
};

}  // namespace

bool BatchNormLayer::StartForward(const Tensor& in, const Tensor& y, const ForwardContext& ctx) {
  const int64_t n = in.dim(0);
  const int64_t m = n * spatial_;  // values per channel (this replica's shard)
  CNNFLOW_ENFORCE(in.numel() == n * channels_ * spatial_ && y.numel() == in.numel(), "batchnorm ",
                  name(), ": input ", in.shape(), " output ", y.shape());
  // Held running statistics (a frozen BN) normalise as in evaluation.
  const bool training = ctx.training && !hold_running_stats_;
  last_training_ = training;
  sync_sum_ = training ? ctx.sync_sum : nullptr;
  if (sync_sum_ != nullptr && !*sync_sum_) {
    throw Error(StrCat("batchnorm ", name(),
                       ": ForwardContext::sync_sum points to an empty "
                       "function"));
  }
  if (training && sync_sum_ == nullptr && m <= 1) {
    throw Error(StrCat("batchnorm ", name(),
                       ": expected more than 1 value per channel when training, got input ",
                       in.shape()));
  }
  local_count_ = m;
  count_ = static_cast<double>(m);
  mean_.resize(channels_);
  inv_std_.resize(channels_);
  return training;
}

void BatchNormLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                             const ForwardContext& ctx) {
  const Tensor& in = *x[0];
  const bool training = StartForward(in, y, ctx);
  if (nhwc_input()) {
    ForwardNhwc(in, y, training);
    return;
  }
  DispatchFloat(in.dtype(), [&](auto* tag) {
    ForwardNchw<std::remove_pointer_t<decltype(tag)>>(in, y, training);
  });
}

template <typename T>
void BatchNormLayer::ForwardNchw(const Tensor& in, Tensor& y, bool training) {
  const int64_t n = in.dim(0), c_n = channels_, s_n = spatial_, m = n * s_n;
  const NchwInput<T> p{n, c_n, s_n, in.data<T>(), Param<T>(0), Param<T>(1), mean_, inv_std_};
  T* ys = y.data<T>();
  T* rmean = buffers()[0].value.data<T>();
  T* rvar = buffers()[1].value.data<T>();
  // Batch statistics from the (global) count and centred sums; updates the
  // running statistics.
  auto finish = [&](int64_t c, double count, double shift, double s1, double s2) {
    const auto [mean, var] = BatchStats(count, shift, s1, s2, momentum_, &rmean[c], &rvar[c]);
    SetStats(c, mean, var);
  };
  if (!training) {
    cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        SetStats(c, static_cast<double>(rmean[c]), static_cast<double>(rvar[c]));
      }
      p.Normalise(c0, c1, relu_, gelu_, ys);
    });
  } else if (sync_sum_ == nullptr) {
    // One pass of sums centred on the first sample's mean: within a few
    // standard deviations of the batch mean, so the double sums lose
    // nothing f32 would keep (a pass fewer over x than centring on the
    // batch mean, as the synced path must).
    cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
      std::vector<double> shift(c1 - c0), s1(c1 - c0), s2(c1 - c0);
      for (int64_t c = c0; c < c1; ++c) {
        shift[c - c0] = SumLanes(p.xs + c * s_n, s_n) / static_cast<double>(s_n);
      }
      p.CentredSums(c0, c1, shift.data(), s1.data(), s2.data());
      for (int64_t c = c0; c < c1; ++c) {
        finish(c, static_cast<double>(m), shift[c - c0], s1[c - c0], s2[c - c0]);
      }
      p.Normalise(c0, c1, relu_, gelu_, ys);
    });
  } else {
    const double count = SyncCentredSums(p, in.shape());
    const float* buf = sync_buf_.data();
    cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        finish(c, count, shift_[c], GetSplit(buf[c], buf[c_n + c]),
               GetSplit(buf[2 * c_n + c], buf[3 * c_n + c]));
      }
      p.Normalise(c0, c1, relu_, gelu_, ys);
    });
  }
}

template <typename Input>
double BatchNormLayer::SyncCentredSums(const Input& p, const Shape& in_shape) {
  const int64_t c_n = p.c_n, grain = ChannelGrain(p.s_n, p.n * p.s_n);
  // Pass 1: [sum x (hi C, lo C), count (2)] -> the global count and a
  // per-channel shift (the mean up to the float rounding of the sum).
  sync_buf_.assign(2 * c_n + 2, 0.0f);
  float* buf = sync_buf_.data();
  cpu::ParallelFor(c_n, grain, [&](int64_t c0, int64_t c1) {
    std::vector<double> sum(c1 - c0, 0.0);
    p.ForRows(c0, c1, [&](int64_t c, int64_t at) { sum[c - c0] += SumLanes(p.xs + at, p.s_n); });
    for (int64_t c = c0; c < c1; ++c) PutSplit(sum[c - c0], &buf[c], &buf[c_n + c]);
  });
  const double count = SyncCountAndShift(p.n * p.s_n, in_shape);
  // Pass 2: [sum(x - shift) (hi, lo), sum((x - shift)^2) (hi, lo)].
  sync_buf_.assign(4 * c_n, 0.0f);
  buf = sync_buf_.data();
  cpu::ParallelFor(c_n, grain, [&](int64_t c0, int64_t c1) {
    std::vector<double> s1(c1 - c0), s2(c1 - c0);
    p.CentredSums(c0, c1, shift_.data() + c0, s1.data(), s2.data());
    for (int64_t c = c0; c < c1; ++c) {
      PutSplit(s1[c - c0], &buf[c], &buf[c_n + c]);
      PutSplit(s2[c - c0], &buf[2 * c_n + c], &buf[3 * c_n + c]);
    }
  });
  (*sync_sum_)(buf, 4 * c_n);
  return count;
}

void BatchNormLayer::Backward(const std::vector<const Tensor*>& x, const Tensor& y,
                              const Tensor& dy, const std::vector<Tensor*>& dx) {
  const Tensor& in = *x[0];
  CNNFLOW_ENFORCE(dy.numel() == in.numel() && static_cast<int64_t>(mean_.size()) == channels_ &&
                      in.dim(0) * spatial_ == local_count_,
                  "batchnorm ", name(), ": backward without a matching forward, x ", in.shape(),
                  " dy ", dy.shape());
  if (nhwc_input()) {
    BackwardNhwc(in, dy, dx[0]);
    return;
  }
  DispatchFloat(in.dtype(), [&](auto* tag) {
    BackwardNchw<std::remove_pointer_t<decltype(tag)>>(in, y, dy, dx[0]);
  });
}

template <typename T>
void BatchNormLayer::BackwardNchw(const Tensor& in, const Tensor& y, const Tensor& dy, Tensor* dx) {
  const int64_t n = in.dim(0), c_n = channels_, s_n = spatial_, m = n * s_n;
  const NchwInput<T> p{n, c_n, s_n, in.data<T>(), Param<T>(0), Param<T>(1), mean_, inv_std_};
  // With a fused ReLU, dy is the gradient of max(bn, 0): each row of it
  // counts only where y > 0, masked where it is read.
  const NchwGrads<T> q{p,
                       dy.data<T>(),
                       relu_ ? y.data<T>() : nullptr,
                       dx != nullptr ? dx->data<T>() : nullptr,
                       ParamGrad<T>(0),
                       ParamGrad<T>(1),
                       gelu_,
                       1.0 / count_};
  if (last_training_ && sync_sum_ != nullptr && q.d != nullptr) {
    // One call: [sum dy (hi C, lo C), sum dy * xhat (hi C, lo C)].
    sync_buf_.assign(4 * c_n, 0.0f);
    float* buf = sync_buf_.data();
    cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
      std::vector<double> sum_dy(c1 - c0), sum_dy_xhat(c1 - c0);
      q.LocalSums(c0, c1, sum_dy.data(), sum_dy_xhat.data());
      for (int64_t c = c0; c < c1; ++c) {
        PutSplit(sum_dy[c - c0], &buf[c], &buf[c_n + c]);
        PutSplit(sum_dy_xhat[c - c0], &buf[2 * c_n + c], &buf[3 * c_n + c]);
      }
    });
    (*sync_sum_)(buf, 4 * c_n);
    cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
      std::vector<double> sum_dy(c1 - c0), sum_dy_xhat(c1 - c0);
      for (int64_t c = c0; c < c1; ++c) {
        sum_dy[c - c0] = GetSplit(buf[c], buf[c_n + c]);
        sum_dy_xhat[c - c0] = GetSplit(buf[2 * c_n + c], buf[3 * c_n + c]);
      }
      q.InputGrad(c0, c1, sum_dy.data(), sum_dy_xhat.data());
    });
    return;
  }
  cpu::ParallelFor(c_n, ChannelGrain(s_n, m), [&](int64_t c0, int64_t c1) {
    std::vector<double> sum_dy(c1 - c0), sum_dy_xhat(c1 - c0);
    q.LocalSums(c0, c1, sum_dy.data(), sum_dy_xhat.data());
    if (q.d == nullptr) return;
    if (last_training_) {
      q.InputGrad(c0, c1, sum_dy.data(), sum_dy_xhat.data());
    } else {
      q.AffineGrad(c0, c1);
    }
  });
}

bool BatchNormLayer::WritesBf16() const { return nhwc_output() && cpu::CpuHasAvx512Bf16(); }

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
