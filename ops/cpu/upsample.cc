// CPU kernels of upsample, parallel over the N*C planes (each plane owned
// by one task, so the backward sums are race-free and deterministic).
//   nearest forward    y[o, p] = x[i0h[o], i0w[p]] (a gather per row)
//   nearest backward   a gather per input cell: dx[h, w] is the sum of the
//                      dy block [lo_h[h], hi_h[h]) x [lo_w[w], hi_w[w])
//                      (for an integer scale s, its s x s block), summed
//                      over rows first (contiguous adds), then columns
//   bilinear forward   separable: per output row the two input rows are
//                      blended (contiguous), then each column gathers two
//   bilinear backward  its adjoint: per output row, the row's gradient is
//                      spread over the input columns, then added into the
//                      two input rows (contiguous)
#include "ops/layers/upsample.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/parallel.h"

namespace cnnflow {
namespace {

int64_t PlaneGrain(int64_t plane) {
  return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(plane, 1));
}

// PyTorch's legacy 'nearest' source index (aten/src/ATen/native/UpSample.h,
// nearest_idx), in f32 as there.
int64_t NearestIndex(int64_t o, int64_t in, int64_t out, double scale) {
  if (out == in) return o;
  if (out == 2 * in) return o >> 1;
  const float r = scale > 0 ? static_cast<float>(1.0 / scale)
                            : static_cast<float>(in) / static_cast<float>(out);
  return std::min(static_cast<int64_t>(std::floor(static_cast<float>(o) * r)), in - 1);
}

template <typename T>
struct Tables {
  ResizeAxis<T> h, w;
};

template <typename T>
Tables<T> MakeTables(const Upsample& u) {
  return {MakeResizeAxis<T>(u.in_h(), u.out_h(), u.scale_h(), u.bilinear(), u.align_corners()),
          MakeResizeAxis<T>(u.in_w(), u.out_w(), u.scale_w(), u.bilinear(), u.align_corners())};
}

// x [H, W] -> y [H', W']; tmp: W scratch values.
template <typename T>
void ForwardPlane(const Tables<T>& t, bool bilinear, int64_t in_w, const T* x, T* y, T* tmp) {
  const int64_t out_h = static_cast<int64_t>(t.h.i0.size());
  const int64_t out_w = static_cast<int64_t>(t.w.i0.size());
  const int64_t* c0 = t.w.i0.data();
  const int64_t* c1 = t.w.i1.data();
  const T* cl = t.w.l1.data();
  for (int64_t o = 0; o < out_h; ++o) {
    T* yo = y + o * out_w;
    const T* r0 = x + t.h.i0[o] * in_w;
    if (!bilinear) {
      for (int64_t p = 0; p < out_w; ++p) yo[p] = r0[c0[p]];
      continue;
    }
    const T* r1 = x + t.h.i1[o] * in_w;
    const T b = t.h.l1[o], a = T(1) - b;
    for (int64_t w = 0; w < in_w; ++w) tmp[w] = a * r0[w] + b * r1[w];
    for (int64_t p = 0; p < out_w; ++p) yo[p] = (T(1) - cl[p]) * tmp[c0[p]] + cl[p] * tmp[c1[p]];
  }
}

// dy [H', W'] -> dx [H, W] (overwritten); tmp: max(W, W') scratch values.
template <typename T>
void BackwardPlane(const Tables<T>& t, bool bilinear, int64_t in_h, int64_t in_w, const T* dy,
                   T* dx, T* tmp) {
  const int64_t out_h = static_cast<int64_t>(t.h.i0.size());
  const int64_t out_w = static_cast<int64_t>(t.w.i0.size());
  if (!bilinear) {
    for (int64_t h = 0; h < in_h; ++h) {
      std::fill_n(tmp, out_w, T(0));
      for (int64_t o = t.h.lo[h]; o < t.h.hi[h]; ++o) {
        const T* g = dy + o * out_w;
        for (int64_t p = 0; p < out_w; ++p) tmp[p] += g[p];
      }
      T* row = dx + h * in_w;
      for (int64_t w = 0; w < in_w; ++w) {
        T s = 0;
        for (int64_t p = t.w.lo[w]; p < t.w.hi[w]; ++p) s += tmp[p];
        row[w] = s;
      }
    }
    return;
  }
  std::fill_n(dx, in_h * in_w, T(0));
  for (int64_t o = 0; o < out_h; ++o) {
    const T* g = dy + o * out_w;
    std::fill_n(tmp, in_w, T(0));
    for (int64_t p = 0; p < out_w; ++p) {
      const T b = t.w.l1[p];
      tmp[t.w.i0[p]] += (T(1) - b) * g[p];
      tmp[t.w.i1[p]] += b * g[p];
    }
    T* r0 = dx + t.h.i0[o] * in_w;
    T* r1 = dx + t.h.i1[o] * in_w;
    const T b = t.h.l1[o], a = T(1) - b;
    for (int64_t w = 0; w < in_w; ++w) r0[w] += a * tmp[w];
    for (int64_t w = 0; w < in_w; ++w) r1[w] += b * tmp[w];
  }
}

}  // namespace

template <typename T>
ResizeAxis<T> MakeResizeAxis(int64_t in, int64_t out, double scale, bool bilinear,
                             bool align_corners) {
  ResizeAxis<T> a;
  a.i0.resize(out);
  a.i1.resize(out);
  a.l1.assign(out, T(0));
  // PyTorch's area_pixel_compute_scale, in T (its opmath type for f32 and f64).
  T r;
  if (align_corners) {
    r = out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0);
  } else {
    r = scale > 0 ? static_cast<T>(1.0 / scale) : static_cast<T>(in) / static_cast<T>(out);
  }
  for (int64_t o = 0; o < out; ++o) {
    if (!bilinear) {
      a.i0[o] = a.i1[o] = NearestIndex(o, in, out, scale);
      continue;
    }
    if (out == in) {  // PyTorch copies
      a.i0[o] = a.i1[o] = o;
      continue;
    }
    T src = align_corners ? r * static_cast<T>(o) : r * (static_cast<T>(o) + T(0.5)) - T(0.5);
    if (!align_corners && src < T(0)) src = T(0);
    const int64_t i0 = std::min(static_cast<int64_t>(std::floor(src)), in - 1);
    a.i0[o] = i0;
    a.i1[o] = i0 + (i0 < in - 1 ? 1 : 0);
    a.l1[o] = std::clamp(src - static_cast<T>(i0), T(0), T(1));
  }
  // Both maps are monotone: the outputs reading input h are those with
  // i1 >= h and i0 <= h.
  a.lo.resize(in);
  a.hi.resize(in);
  for (int64_t h = 0; h < in; ++h) {
    a.lo[h] = std::lower_bound(a.i1.begin(), a.i1.end(), h) - a.i1.begin();
    a.hi[h] = std::upper_bound(a.i0.begin(), a.i0.end(), h) - a.i0.begin();
  }
  return a;
}

template ResizeAxis<float> MakeResizeAxis<float>(int64_t, int64_t, double, bool, bool);
template ResizeAxis<double> MakeResizeAxis<double>(int64_t, int64_t, double, bool, bool);

Upsample::Upsample(const std::string& name, const Args& args) : Layer(name) {
  const std::string& mode = args.String("mode");
  bilinear_ = mode == "bilinear";
  align_corners_ = args.Bool("align_corners");
  const std::vector<double> scale = args.Floats("scale");
  const std::vector<int64_t> size = args.Ints("size");
  auto bad = [&](const std::string& what) {
    return ConfigError(StrCat("upsample '", name, "': ", what));
  };
  if (scale.empty() || scale.size() > 2) throw bad("'scale' needs 1 or 2 values");
  if (size.empty() || size.size() > 2) throw bad("'size' needs 1 or 2 values");
  scale_h_ = scale[0];
  scale_w_ = scale.back();
  size_h_ = size[0];
  size_w_ = size.back();
  const bool has_scale = scale_h_ != 0 || scale_w_ != 0;
  const bool has_size = size_h_ != 0 || size_w_ != 0;
  if (has_scale == has_size) throw bad("give exactly one of 'scale' and 'size'");
  if (has_scale && !(scale_h_ > 0 && scale_w_ > 0)) {
    throw bad(StrCat("'scale' must be > 0, got [", scale_h_, ", ", scale_w_, "]"));
  }
  if (has_size && (size_h_ < 1 || size_w_ < 1)) {
    throw bad(StrCat("'size' must be >= 1, got [", size_h_, ", ", size_w_, "]"));
  }
  if (align_corners_ && !bilinear_) {
    throw bad("align_corners applies to mode bilinear only (as in PyTorch)");
  }
}

Shape Upsample::Build(const std::vector<Shape>& inputs, DType) {
  if (inputs.size() != 1 || inputs[0].rank() != 3) {
    throw ShapeError(StrCat("upsample '", name(), "' expects one [C, H, W] input, got ",
                            inputs.empty() ? std::string("none") : inputs[0].ToString()));
  }
  const Shape& s = inputs[0];
  channels_ = s[0];
  in_h_ = s[1];
  in_w_ = s[2];
  if (size_h_ > 0) {
    out_h_ = size_h_;
    out_w_ = size_w_;
  } else {  // PyTorch: floor(in * scale) in double
    out_h_ = static_cast<int64_t>(std::floor(static_cast<double>(in_h_) * scale_h_));
    out_w_ = static_cast<int64_t>(std::floor(static_cast<double>(in_w_) * scale_w_));
  }
  if (in_h_ < 1 || in_w_ < 1 || out_h_ < 1 || out_w_ < 1) {
    throw ShapeError(StrCat("upsample '", name(), "': input ", s, " gives an empty output ", out_h_,
                            "x", out_w_));
  }
  return {channels_, out_h_, out_w_};
}

void Upsample::Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) {
  const Tensor& in = *x[0];
  const int64_t planes = in.dim(0) * channels_;
  const int64_t in_plane = in_h_ * in_w_, out_plane = out_h_ * out_w_;
  CNNFLOW_ENFORCE(in.numel() == planes * in_plane && y.numel() == planes * out_plane, "upsample '",
                  name(), "': ", in.shape(), " -> ", y.shape());
  DispatchFloat(in.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const Tables<T> t = MakeTables<T>(*this);
    const T* xs = in.data<T>();
    T* ys = y.data<T>();
    cpu::ParallelFor(planes, PlaneGrain(out_plane), [&](int64_t b, int64_t e) {
      std::vector<T> tmp(in_w_);
      for (int64_t p = b; p < e; ++p) {
        ForwardPlane(t, bilinear_, in_w_, xs + p * in_plane, ys + p * out_plane, tmp.data());
      }
    });
  });
}

void Upsample::Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                        const std::vector<Tensor*>& dx) {
  if (dx.empty() || dx[0] == nullptr) return;
  const int64_t planes = x[0]->dim(0) * channels_;
  const int64_t in_plane = in_h_ * in_w_, out_plane = out_h_ * out_w_;
  CNNFLOW_ENFORCE(dy.numel() == planes * out_plane && dx[0]->numel() == planes * in_plane,
                  "upsample '", name(), "': dy ", dy.shape(), " dx ", dx[0]->shape());
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const Tables<T> t = MakeTables<T>(*this);
    const T* dys = dy.data<T>();
    T* dxs = dx[0]->data<T>();
    cpu::ParallelFor(planes, PlaneGrain(out_plane), [&](int64_t b, int64_t e) {
      std::vector<T> tmp(std::max(in_w_, out_w_));
      for (int64_t p = b; p < e; ++p) {
        BackwardPlane(t, bilinear_, in_h_, in_w_, dys + p * out_plane, dxs + p * in_plane,
                      tmp.data());
      }
    });
  });
}

int64_t Upsample::ForwardFlops(int64_t n) const {
  return n * channels_ * out_h_ * out_w_ * (bilinear_ ? 6 : 0);
}

CNNFLOW_REGISTER_LAYER(
    upsample, Upsample,
    Schema("upsampling [C, H, W] -> [C, H', W'] (torch.nn.Upsample): nearest (PyTorch's legacy "
           "'nearest', src = floor(dst / scale)) or bilinear; H' = floor(H * scale), or size")
        .Optional("scale", ParamType::kFloatList, 0.0,
                  "scale factor: s or [sh, sw] (integer or not); 0: use size")
        .Optional("size", ParamType::kIntList, int64_t{0}, "output size [H', W']; 0: use scale")
        .Choice("mode", {"nearest", "bilinear"}, "nearest", "interpolation")
        .Optional("align_corners", ParamType::kBool, false,
                  "bilinear: map the corner pixels' centres onto each other (src = dst * "
                  "(H-1)/(H'-1)); false: half-pixel centres"));

}  // namespace cnnflow
