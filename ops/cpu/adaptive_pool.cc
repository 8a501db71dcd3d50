// CPU kernels of adaptive_avgpool2d / adaptive_avgpool1d: independent planes,
// so a ParallelFor over the N*C planes needs no reduction. Within a plane
// the window sums are separable: each input row's column-window sums are
// added into an accumulator row (contiguous), and the backward pass builds
// one row of per-column gradients per output row and adds it into the
// window's input rows (contiguous, vectorised).
#include "ops/layers/adaptive_pool.h"

#include <algorithm>
#include <vector>

#include "ops/cpu/elementwise.h"
#include "ops/cpu/parallel.h"

namespace cnnflow {
namespace {

int64_t PlaneGrain(int64_t plane) {
  return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(plane, 1));
}

// One plane: x [H, W] -> y [h, w]; acc: w scratch values.
template <typename T>
void AdaptivePlane(const AdaptivePoolGeometry& g, const T* x, T* y, T* acc) {
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    const int64_t hs = AdaptiveStart(oh, g.in_h, g.out_h), he = AdaptiveEnd(oh, g.in_h, g.out_h);
    std::fill_n(acc, g.out_w, T(0));
    for (int64_t h = hs; h < he; ++h) {
      const T* row = x + h * g.in_w;
      for (int64_t ow = 0; ow < g.out_w; ++ow) {
        const int64_t ws = AdaptiveStart(ow, g.in_w, g.out_w);
        acc[ow] += RowSum(row + ws, AdaptiveEnd(ow, g.in_w, g.out_w) - ws);
      }
    }
    T* yo = y + oh * g.out_w;
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      const int64_t cols = AdaptiveEnd(ow, g.in_w, g.out_w) - AdaptiveStart(ow, g.in_w, g.out_w);
      yo[ow] = acc[ow] / static_cast<T>((he - hs) * cols);
    }
  }
}

// One plane: dy [h, w] -> dx [H, W] (overwritten); grad: W scratch values.
template <typename T>
void AdaptivePlaneBackward(const AdaptivePoolGeometry& g, const T* dy, T* dx, T* grad) {
  std::fill_n(dx, g.in_plane(), T(0));
  for (int64_t oh = 0; oh < g.out_h; ++oh) {
    const int64_t hs = AdaptiveStart(oh, g.in_h, g.out_h), he = AdaptiveEnd(oh, g.in_h, g.out_h);
    std::fill_n(grad, g.in_w, T(0));
    for (int64_t ow = 0; ow < g.out_w; ++ow) {
      const int64_t ws = AdaptiveStart(ow, g.in_w, g.out_w), we = AdaptiveEnd(ow, g.in_w, g.out_w);
      const T v = dy[oh * g.out_w + ow] / static_cast<T>((he - hs) * (we - ws));
      for (int64_t w = ws; w < we; ++w) grad[w] += v;
    }
    for (int64_t h = hs; h < he; ++h) {
      T* row = dx + h * g.in_w;
      for (int64_t w = 0; w < g.in_w; ++w) row[w] += grad[w];
    }
  }
}

}  // namespace

AdaptiveAvgPool::AdaptiveAvgPool(const std::string& name, const Args& args, int rank)
    : Layer(name), rank_(rank) {
  if (rank_ == 3) {
    const std::vector<int64_t> out = args.Ints("out", 2);
    geom_.out_h = out[0];
    geom_.out_w = out[1];
  } else {
    geom_.out_w = args.Int("out");
  }
  if (geom_.out_h < 1 || geom_.out_w < 1) {
    throw ConfigError(StrCat(
        type(), " '", name, "': 'out' must be >= 1, got ",
        rank_ == 3 ? StrCat("[", geom_.out_h, ", ", geom_.out_w, "]") : StrCat(geom_.out_w)));
  }
}

Shape AdaptiveAvgPool::Build(const std::vector<Shape>& inputs, DType) {
  if (inputs.size() != 1 || inputs[0].rank() != rank_) {
    throw ShapeError(StrCat(type(), " '", name(), "' expects one ",
                            rank_ == 3 ? "[C, H, W]" : "[C, L]", " input, got ",
                            inputs.empty() ? std::string("none") : inputs[0].ToString()));
  }
  const Shape& s = inputs[0];
  geom_.channels = s[0];
  geom_.in_h = rank_ == 3 ? s[1] : 1;
  geom_.in_w = s[rank_ - 1];
  if (geom_.in_h < 1 || geom_.in_w < 1) {
    throw ShapeError(StrCat(type(), " '", name(), "': empty input planes in ", s));
  }
  if (rank_ == 3) return {geom_.channels, geom_.out_h, geom_.out_w};
  return {geom_.channels, geom_.out_w};
}

void AdaptiveAvgPool::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                              const ForwardContext&) {
  const Tensor& in = *x[0];
  const int64_t planes = in.dim(0) * geom_.channels;
  CNNFLOW_ENFORCE(
      in.numel() == planes * geom_.in_plane() && y.numel() == planes * geom_.out_plane(), type(),
      " '", name(), "': ", in.shape(), " -> ", y.shape());
  const AdaptivePoolGeometry& g = geom_;
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = in.data<T>();
    T* ys = y.data<T>();
    cpu::ParallelFor(planes, PlaneGrain(g.in_plane()), [&](int64_t b, int64_t e) {
      std::vector<T> acc(g.out_w);
      for (int64_t p = b; p < e; ++p) {
        AdaptivePlane(g, xs + p * g.in_plane(), ys + p * g.out_plane(), acc.data());
      }
    });
  });
}

void AdaptiveAvgPool::Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                               const std::vector<Tensor*>& dx) {
  if (dx.empty() || dx[0] == nullptr) return;
  const int64_t planes = x[0]->dim(0) * geom_.channels;
  CNNFLOW_ENFORCE(
      dy.numel() == planes * geom_.out_plane() && dx[0]->numel() == planes * geom_.in_plane(),
      type(), " '", name(), "': dy ", dy.shape(), " dx ", dx[0]->shape());
  const AdaptivePoolGeometry& g = geom_;
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* dys = dy.data<T>();
    T* dxs = dx[0]->data<T>();
    cpu::ParallelFor(planes, PlaneGrain(g.in_plane()), [&](int64_t b, int64_t e) {
      std::vector<T> grad(g.in_w);
      for (int64_t p = b; p < e; ++p) {
        AdaptivePlaneBackward(g, dys + p * g.out_plane(), dxs + p * g.in_plane(), grad.data());
      }
    });
  });
}

int64_t AdaptiveAvgPool::ForwardFlops(int64_t n) const {
  return n * geom_.channels * geom_.in_plane();  // each cell added about once
}

CNNFLOW_REGISTER_LAYER(
    adaptive_avgpool2d, AdaptiveAvgPool2d,
    Schema("adaptive 2D average pooling [C, H, W] -> [C, h, w] (torch.nn.AdaptiveAvgPool2d): "
           "output (i, j) averages rows [floor(i*H/h), ceil((i+1)*H/h)) and the same rule for "
           "columns")
        .Required("out", ParamType::kIntList, "output size: s or [h, w]"));

CNNFLOW_REGISTER_LAYER(
    adaptive_avgpool1d, AdaptiveAvgPool1d,
    Schema("adaptive 1D average pooling [C, L] -> [C, l] (torch.nn.AdaptiveAvgPool1d): output i "
           "averages [floor(i*L/l), ceil((i+1)*L/l))")
        .Required("out", ParamType::kInt, "output length l"));

}  // namespace cnnflow
