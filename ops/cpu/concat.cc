// concat on the CPU: per sample, each input's block is one contiguous span
// of the output (the channels are the outermost sample dimension), so
// forward and backward are block copies, parallel over the samples.
#include "ops/layers/concat.h"

#include <algorithm>
#include <cstring>

#include "ops/cpu/parallel.h"

namespace cnnflow {

namespace {
// Bytes per parallel task: large enough that scheduling is noise.
constexpr int64_t kGrainBytes = int64_t{1} << 17;

// For each sample n and input k: copies `to_output ? x_k -> y : y -> dx_k`
// (null parts are skipped).
void CopyBlocks(const std::vector<char*>& parts, char* whole, const std::vector<int64_t>& block,
                int64_t out_block, int64_t n, size_t elem, bool to_output) {
  const int64_t grain = std::max<int64_t>(1, kGrainBytes / std::max<int64_t>(out_block * elem, 1));
  cpu::ParallelFor(n, grain, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; ++s) {
      int64_t offset = s * out_block;
      for (size_t k = 0; k < parts.size(); ++k) {
        const size_t bytes = static_cast<size_t>(block[k]) * elem;
        if (parts[k] != nullptr) {
          char* part = parts[k] + static_cast<size_t>(s * block[k]) * elem;
          char* at = whole + static_cast<size_t>(offset) * elem;
          if (to_output) {
            std::memcpy(at, part, bytes);
          } else {
            std::memcpy(part, at, bytes);
          }
        }
        offset += block[k];
      }
    }
  });
}

}  // namespace

ConcatLayer::ConcatLayer(const std::string& name, const Args& /*args*/) : Layer(name) {}

Shape ConcatLayer::Build(const std::vector<Shape>& inputs, DType /*dtype*/) {
  if (inputs.size() < 2) {
    throw ShapeError(StrCat("concat takes 2 or more inputs, got ", inputs.size()));
  }
  auto list = [&] {
    std::string s;
    for (size_t k = 0; k < inputs.size(); ++k) s += StrCat(k ? ", " : "", inputs[k]);
    return s;
  };
  Shape out = inputs[0];
  if (out.rank() < 1) throw ShapeError(StrCat("concat expects samples [C, ...], got ", list()));
  block_.clear();
  for (const Shape& s : inputs) {
    bool same = s.rank() == out.rank();
    for (int d = 1; same && d < s.rank(); ++d) same = s[d] == out[d];
    if (!same) {
      throw ShapeError(
          StrCat("concat joins along channels (dim 1 of [N, C, ...]); every other "
                 "dimension must agree, got ",
                 list()));
    }
    block_.push_back(s.numel());
  }
  out[0] = 0;
  for (const Shape& s : inputs) out[0] += s[0];
  out_block_ = out.numel();
  return out;
}

void ConcatLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                          const ForwardContext& /*ctx*/) {
  CNNFLOW_ENFORCE(x.size() == block_.size(), "concat ", name(), ": ", x.size(),
                  " inputs, built for ", block_.size());
  const int64_t n = y.dim(0);
  CNNFLOW_ENFORCE(y.numel() == n * out_block_, "concat ", name(), ": output ", y.shape());
  std::vector<char*> parts;
  for (size_t k = 0; k < x.size(); ++k) {
    CNNFLOW_ENFORCE(x[k]->numel() == n * block_[k] && x[k]->dtype() == y.dtype(), "concat ", name(),
                    ": input ", k, " ", x[k]->shape(), " output ", y.shape());
    parts.push_back(static_cast<char*>(x[k]->raw_data()));
  }
  CopyBlocks(parts, static_cast<char*>(y.raw_data()), block_, out_block_, n, DTypeSize(y.dtype()),
             true);
}

void ConcatLayer::Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/,
                           const Tensor& dy, const std::vector<Tensor*>& dx) {
  const int64_t n = dy.dim(0);
  CNNFLOW_ENFORCE(dx.size() == block_.size() && dy.numel() == n * out_block_, "concat ", name(),
                  ": dy ", dy.shape());
  std::vector<char*> parts;
  for (size_t k = 0; k < dx.size(); ++k) {
    if (dx[k] != nullptr) {
      CNNFLOW_ENFORCE(dx[k]->numel() == n * block_[k], "concat ", name(), ": dx ", k, " ",
                      dx[k]->shape());
    }
    parts.push_back(dx[k] != nullptr ? static_cast<char*>(dx[k]->raw_data()) : nullptr);
  }
  CopyBlocks(parts, static_cast<char*>(dy.raw_data()), block_, out_block_, n, DTypeSize(dy.dtype()),
             false);
}

CNNFLOW_REGISTER_LAYER(concat, ConcatLayer,
                       Schema("Concatenation along channels (torch.cat(dim=1)) of 2 or more "
                              "inputs whose other dimensions agree; name them with "
                              "`inputs: [a, b, ...]`."));

}  // namespace cnnflow
