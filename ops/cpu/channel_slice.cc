#include "ops/layers/channel_slice.h"

#include <cstring>

namespace cnnflow {

ChannelSliceLayer::ChannelSliceLayer(const std::string& name, const Args& args)
    : Layer(name), start_(args.Int("start")), end_(args.Int("end")) {}

Shape ChannelSliceLayer::Build(const std::vector<Shape>& inputs, DType /*dtype*/) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "channel_slice takes 1 input, got ", inputs.size());
  const Shape& x = inputs[0];
  const int64_t c = x.rank() < 1 ? 0 : x[0];
  if (!(0 <= start_ && start_ < end_ && end_ <= c)) {
    throw ConfigError(StrCat("channel_slice '", name(), "': channels [", start_, ", ", end_,
                             ") of ", c, " (need 0 <= start < end <= C)"));
  }
  channels_ = c;
  plane_ = x.numel() / c;
  std::vector<int64_t> dims = x.dims();
  dims[0] = end_ - start_;
  return Shape(dims);
}

void ChannelSliceLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                                const ForwardContext& /*ctx*/) {
  const size_t es = DTypeSize(x[0]->dtype());
  const size_t in = channels_ * plane_ * es, out = (end_ - start_) * plane_ * es;
  const auto* src = static_cast<const char*>(x[0]->raw_data()) + start_ * plane_ * es;
  auto* dst = static_cast<char*>(y.raw_data());
  for (int64_t n = 0; n < x[0]->dim(0); ++n) std::memcpy(dst + n * out, src + n * in, out);
}

void ChannelSliceLayer::Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/,
                                 const Tensor& dy, const std::vector<Tensor*>& dx) {
  if (dx[0] == nullptr) return;
  dx[0]->Zero();
  const size_t es = DTypeSize(dy.dtype());
  const size_t in = channels_ * plane_ * es, out = (end_ - start_) * plane_ * es;
  const auto* src = static_cast<const char*>(dy.raw_data());
  auto* dst = static_cast<char*>(dx[0]->raw_data()) + start_ * plane_ * es;
  for (int64_t n = 0; n < dy.dim(0); ++n) std::memcpy(dst + n * in, src + n * out, out);
}

CNNFLOW_REGISTER_LAYER(
    channel_slice, ChannelSliceLayer,
    Schema("Channels [start, end) of each sample: x[:, start:end] (torch.chunk, torch.split "
           "along dim 1).")
        .Required("start", ParamType::kInt, "the first channel kept")
        .Required("end", ParamType::kInt, "one past the last channel kept"));

}  // namespace cnnflow
