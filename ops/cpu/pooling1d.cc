// CPU kernels of maxpool1d and avgpool1d: independent rows of length L, so
// a ParallelFor over the N*C rows needs no reduction (deterministic).
//
// Each row splits into border outputs (window clipped by the padding or the
// row's end: the general loop) and interior outputs (window wholly inside:
// no bounds, no divisor to work out). The interior loops are instantiated
// for the usual windows (kernel == stride in 2..4; and 3 / 1 for max) so
// the compiler sees constant strides and vectorises across outputs (many
// times faster than the 2D kernels on [C, 1, L]:
// bench/results/2026-12-07-cpu-kernel-measurements.md).
#include "ops/layers/pooling1d.h"

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "ops/cpu/parallel.h"

namespace cnnflow {
namespace {

// Rows per parallel task: enough elements to pay for the task.
int64_t RowGrain(int64_t len) {
  return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(len, 1));
}

// PyTorch's comparison: a NaN always wins, so it propagates.
template <typename T>
inline bool Beats(T v, T best) {
  return v > best || v != v;
}

// Window [start, end) of output o clipped to the row [0, L).
inline void Window(const Pool1dGeometry& g, int64_t o, int64_t* start, int64_t* end) {
  const int64_t s = o * g.stride - g.pad;
  *start = std::max<int64_t>(s, 0);
  *end = std::min(s + g.kernel, g.in_len);
}

// Interior outputs of one row: y[o] = max_j x[o * S - pad + j]. K, S > 0:
// a compile-time window; 0: g's runtime values. The taps are the outer
// loop so the loop over outputs has no branches (selects) and vectorises:
// the per-output scalar form mispredicted on every other compare (random
// data) and ran 10x slower.
template <typename T, int K, int S>
void MaxInterior(const Pool1dGeometry& g, const T* x, T* y, int32_t* idx) {
  const int32_t k = K > 0 ? K : static_cast<int32_t>(g.kernel);
  const int32_t s = S > 0 ? S : static_cast<int32_t>(g.stride);
  const int32_t pad = static_cast<int32_t>(g.pad);
  const int32_t o0 = static_cast<int32_t>(g.interior_begin);
  const int32_t o1 = static_cast<int32_t>(g.interior_end);
  for (int32_t o = o0; o < o1; ++o) {
    y[o] = x[o * s - pad];
    idx[o] = o * s - pad;
  }
  for (int32_t j = 1; j < k; ++j) {
    for (int32_t o = o0; o < o1; ++o) {
      const int32_t i = o * s - pad + j;
      const T v = x[i];
      const bool t = Beats(v, y[o]);
      y[o] = t ? v : y[o];
      idx[o] = t ? i : idx[o];
    }
  }
}

// One row: x [L] -> y [L'], idx [L'] (index into x of each max).
template <typename T>
void MaxRow(const Pool1dGeometry& g, const T* x, T* y, int32_t* idx) {
  auto border = [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      int64_t start, end;
      Window(g, o, &start, &end);
      T best = -std::numeric_limits<T>::infinity();
      int64_t arg = start;
      for (int64_t i = start; i < end; ++i) {
        if (Beats(x[i], best)) {
          best = x[i];
          arg = i;
        }
      }
      y[o] = best;
      idx[o] = static_cast<int32_t>(arg);
    }
  };
  border(0, g.interior_begin);
  if (g.kernel == g.stride && g.kernel == 2) {
    MaxInterior<T, 2, 2>(g, x, y, idx);
  } else if (g.kernel == g.stride && g.kernel == 3) {
    MaxInterior<T, 3, 3>(g, x, y, idx);
  } else if (g.kernel == g.stride && g.kernel == 4) {
    MaxInterior<T, 4, 4>(g, x, y, idx);
  } else if (g.kernel == 3 && g.stride == 1) {
    MaxInterior<T, 3, 1>(g, x, y, idx);
  } else {
    MaxInterior<T, 0, 0>(g, x, y, idx);
  }
  border(g.interior_end, g.out_len);
}

// PyTorch's divisor of output o: the window clipped to the padded row, or
// to the row itself when padding is not counted.
inline int64_t AvgDivisor(const Pool1dGeometry& g, int64_t o, bool include_pad) {
  const int64_t s = o * g.stride - g.pad;
  if (include_pad) return std::min(s + g.kernel, g.in_len + g.pad) - s;
  return std::min(s + g.kernel, g.in_len) - std::max<int64_t>(s, 0);
}

template <typename T, int K, int S>
void AvgInterior(const Pool1dGeometry& g, const T* x, T* y) {
  const int64_t k = K > 0 ? K : g.kernel, s = S > 0 ? S : g.stride;
  const T div = static_cast<T>(k);
  for (int64_t o = g.interior_begin; o < g.interior_end; ++o) {
    const T* w = x + o * s - g.pad;
    T sum = w[0];
    for (int64_t j = 1; j < k; ++j) sum += w[j];
    y[o] = sum / div;
  }
}

template <typename T>
void AvgRow(const Pool1dGeometry& g, bool include_pad, const T* x, T* y) {
  auto border = [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      int64_t start, end;
      Window(g, o, &start, &end);
      T sum = 0;
      for (int64_t i = start; i < end; ++i) sum += x[i];
      y[o] = sum / static_cast<T>(AvgDivisor(g, o, include_pad));
    }
  };
  border(0, g.interior_begin);
  if (g.kernel == g.stride && g.kernel == 2) {
    AvgInterior<T, 2, 2>(g, x, y);
  } else if (g.kernel == g.stride && g.kernel == 3) {
    AvgInterior<T, 3, 3>(g, x, y);
  } else if (g.kernel == g.stride && g.kernel == 4) {
    AvgInterior<T, 4, 4>(g, x, y);
  } else {
    AvgInterior<T, 0, 0>(g, x, y);
  }
  border(g.interior_end, g.out_len);
}

// Interior outputs of one row: dx[o * S - pad + j] += dy[o] / K, taps
// outer (as MaxInterior) so the loop over outputs vectorises.
template <typename T, int K, int S>
void AvgInteriorBackward(const Pool1dGeometry& g, const T* dy, T* dx) {
  const int32_t k = K > 0 ? K : static_cast<int32_t>(g.kernel);
  const int32_t s = S > 0 ? S : static_cast<int32_t>(g.stride);
  const int32_t pad = static_cast<int32_t>(g.pad);
  const int32_t o0 = static_cast<int32_t>(g.interior_begin);
  const int32_t o1 = static_cast<int32_t>(g.interior_end);
  const T div = static_cast<T>(k);
  for (int32_t j = 0; j < k; ++j) {
    for (int32_t o = o0; o < o1; ++o) dx[o * s - pad + j] += dy[o] / div;
  }
}

// dx [L] (overwritten) from dy [L'].
template <typename T>
void AvgRowBackward(const Pool1dGeometry& g, bool include_pad, const T* dy, T* dx) {
  std::fill_n(dx, g.in_len, T(0));
  auto border = [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      int64_t start, end;
      Window(g, o, &start, &end);
      const T v = dy[o] / static_cast<T>(AvgDivisor(g, o, include_pad));
      for (int64_t i = start; i < end; ++i) dx[i] += v;
    }
  };
  border(0, g.interior_begin);
  if (g.kernel == g.stride && g.kernel == 2) {
    AvgInteriorBackward<T, 2, 2>(g, dy, dx);
  } else if (g.kernel == g.stride && g.kernel == 3) {
    AvgInteriorBackward<T, 3, 3>(g, dy, dx);
  } else if (g.kernel == g.stride && g.kernel == 4) {
    AvgInteriorBackward<T, 4, 4>(g, dy, dx);
  } else {
    AvgInteriorBackward<T, 0, 0>(g, dy, dx);
  }
  border(g.interior_end, g.out_len);
}

// One int of a 1D parameter (`kernel: 3` or `kernel: [3]`), checked >= lo.
int64_t IntArg(const char* layer, const Args& args, const std::string& key, int64_t lo) {
  const int64_t v = args.Ints(key, 1)[0];
  if (v < lo) throw ConfigError(StrCat(layer, ": '", key, "' must be >= ", lo, ", got ", v));
  return v;
}

void CheckTensors(const char* layer, const std::vector<const Tensor*>& x, const Tensor& y) {
  CNNFLOW_ENFORCE(x.size() == 1 && x[0]->rank() == 3 && x[0]->is_contiguous() && y.is_contiguous(),
                  layer, " needs one contiguous [N, C, L] input and a contiguous output");
}

}  // namespace

Pool1dBase::Pool1dBase(const std::string& name, const Args& args, const char* type_name)
    : Layer(name) {
  geom_.kernel = IntArg(type_name, args, "kernel", 1);
  geom_.stride = IntArg(type_name, args, "stride", 0);
  geom_.pad = IntArg(type_name, args, "pad", 0);
  if (geom_.stride == 0) geom_.stride = geom_.kernel;
  if (2 * geom_.pad > geom_.kernel) {
    throw ConfigError(StrCat(type_name, ": 'pad' ", geom_.pad, " must be at most half of 'kernel' ",
                             geom_.kernel));
  }
}

Shape Pool1dBase::Build(const std::vector<Shape>& inputs, DType) {
  if (inputs.size() != 1 || inputs[0].rank() != 2) {
    throw ShapeError(StrCat(type(), " expects one [C, L] input, got ",
                            inputs.empty() ? std::string("none") : inputs[0].ToString()));
  }
  const Shape& s = inputs[0];
  Pool1dGeometry& g = geom_;
  g.channels = s[0];
  g.in_len = s[1];
  if (g.in_len + 2 * g.pad < g.kernel) {
    throw ShapeError(StrCat(type(), ": input ", s, " padded by ", g.pad,
                            " on each side is shorter than the kernel ", g.kernel));
  }
  CNNFLOW_ENFORCE(g.in_len <= std::numeric_limits<int32_t>::max(), type(), ": input too long: ", s);
  g.out_len = (g.in_len + 2 * g.pad - g.kernel) / g.stride + 1;
  g.interior_begin = std::min((g.pad + g.stride - 1) / g.stride, g.out_len);
  const int64_t last = g.in_len + g.pad - g.kernel;  // last interior window start + pad
  g.interior_end =
      last < 0 ? g.interior_begin : std::clamp(last / g.stride + 1, g.interior_begin, g.out_len);
  return {g.channels, g.out_len};
}

int64_t Pool1dBase::ForwardFlops(int64_t n) const {
  return n * geom_.channels * geom_.out_len * geom_.kernel;
}

void MaxPool1d::Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) {
  CheckTensors("maxpool1d", x, y);
  const Pool1dGeometry& g = geom_;
  const int64_t rows = x[0]->dim(0) * g.channels;
  argmax_.resize(static_cast<size_t>(rows * g.out_len));
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = x[0]->data<T>();
    T* ys = y.data<T>();
    int32_t* idx = argmax_.data();
    cpu::ParallelFor(rows, RowGrain(g.in_len), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        MaxRow(g, xs + r * g.in_len, ys + r * g.out_len, idx + r * g.out_len);
      }
    });
  });
}

void MaxPool1d::Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                         const std::vector<Tensor*>& dx) {
  if (dx.empty() || dx[0] == nullptr) return;
  const Pool1dGeometry& g = geom_;
  const int64_t rows = x[0]->dim(0) * g.channels;
  CNNFLOW_ENFORCE(static_cast<int64_t>(argmax_.size()) == rows * g.out_len,
                  "maxpool1d: Backward without a matching Forward");
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* dys = dy.data<T>();
    T* dxs = dx[0]->data<T>();
    const int32_t* idx = argmax_.data();
    cpu::ParallelFor(rows, RowGrain(g.in_len), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        // Zeroing then scattering: the row stays in L1.
        T* dxr = dxs + r * g.in_len;
        std::fill_n(dxr, g.in_len, T(0));
        const T* dyr = dys + r * g.out_len;
        const int32_t* ir = idx + r * g.out_len;
        for (int64_t o = 0; o < g.out_len; ++o) dxr[ir[o]] += dyr[o];
      }
    });
  });
}

MaxPool1d::MaxPool1d(const std::string& name, const Args& args)
    : Pool1dBase(name, args, "maxpool1d") {}

AvgPool1d::AvgPool1d(const std::string& name, const Args& args)
    : Pool1dBase(name, args, "avgpool1d"), count_include_pad_(args.Bool("count_include_pad")) {}

void AvgPool1d::Forward(const std::vector<const Tensor*>& x, Tensor& y, const ForwardContext&) {
  CheckTensors("avgpool1d", x, y);
  const Pool1dGeometry& g = geom_;
  const int64_t rows = x[0]->dim(0) * g.channels;
  DispatchFloat(y.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* xs = x[0]->data<T>();
    T* ys = y.data<T>();
    cpu::ParallelFor(rows, RowGrain(g.in_len), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        AvgRow(g, count_include_pad_, xs + r * g.in_len, ys + r * g.out_len);
      }
    });
  });
}

void AvgPool1d::Backward(const std::vector<const Tensor*>& x, const Tensor&, const Tensor& dy,
                         const std::vector<Tensor*>& dx) {
  if (dx.empty() || dx[0] == nullptr) return;
  const Pool1dGeometry& g = geom_;
  const int64_t rows = x[0]->dim(0) * g.channels;
  DispatchFloat(dy.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* dys = dy.data<T>();
    T* dxs = dx[0]->data<T>();
    cpu::ParallelFor(rows, RowGrain(g.in_len), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        AvgRowBackward(g, count_include_pad_, dys + r * g.out_len, dxs + r * g.in_len);
      }
    });
  });
}

CNNFLOW_REGISTER_LAYER(
    maxpool1d, MaxPool1d,
    Schema("1D max pooling [C, L] -> [C, L'] (torch.nn.MaxPool1d; padded cells never win; "
           "L' = (L + 2*pad - kernel) / stride + 1)")
        .Required("kernel", ParamType::kIntList, "window size k")
        .Optional("stride", ParamType::kIntList, int64_t{0}, "stride; 0 = kernel")
        .Optional("pad", ParamType::kIntList, int64_t{0},
                  "implicit -inf padding on each side, at most kernel / 2"));

CNNFLOW_REGISTER_LAYER(
    avgpool1d, AvgPool1d,
    Schema("1D average pooling [C, L] -> [C, L'] (torch.nn.AvgPool1d; "
           "L' = (L + 2*pad - kernel) / stride + 1)")
        .Required("kernel", ParamType::kIntList, "window size k")
        .Optional("stride", ParamType::kIntList, int64_t{0}, "stride; 0 = kernel")
        .Optional("pad", ParamType::kIntList, int64_t{0},
                  "implicit zero padding on each side, at most kernel / 2")
        .Optional("count_include_pad", ParamType::kBool, true,
                  "divide by the window size including padded cells (else by the valid cells)"));

}  // namespace cnnflow
