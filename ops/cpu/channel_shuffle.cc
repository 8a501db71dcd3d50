#include "ops/layers/channel_shuffle.h"

#include <cstring>

namespace cnnflow {
namespace {

// dst[n, c] = src[n, source(c)] (gather) or dst[n, source(c)] = src[n, c]
// (scatter), plane by plane, in any dtype.
template <typename SourceOf>
void Permute(const Tensor& src, Tensor& dst, int64_t channels, int64_t plane, bool gather,
             const SourceOf& source) {
  const int64_t n = src.dim(0);
  const size_t bytes = static_cast<size_t>(plane) * DTypeSize(src.dtype());
  const auto* from = static_cast<const char*>(src.raw_data());
  auto* to = static_cast<char*>(dst.raw_data());
  for (int64_t s = 0; s < n; ++s) {
    for (int64_t c = 0; c < channels; ++c) {
      const int64_t a = s * channels + c, b = s * channels + source(c);
      std::memcpy(to + (gather ? a : b) * bytes, from + (gather ? b : a) * bytes, bytes);
    }
  }
}

}  // namespace

ChannelShuffleLayer::ChannelShuffleLayer(const std::string& name, const Args& args)
    : Layer(name), groups_(args.Int("groups")) {}

Shape ChannelShuffleLayer::Build(const std::vector<Shape>& inputs, DType /*dtype*/) {
  CNNFLOW_ENFORCE(inputs.size() == 1, "channel_shuffle takes 1 input, got ", inputs.size());
  const Shape& x = inputs[0];
  if (groups_ < 1 || x.rank() < 1 || x[0] % groups_ != 0) {
    throw ConfigError(StrCat("channel_shuffle '", name(), "': ", x.rank() < 1 ? 0 : x[0],
                             " channels do not split into ", groups_, " groups"));
  }
  channels_ = x[0];
  plane_ = x.numel() / channels_;
  return x;
}

void ChannelShuffleLayer::Forward(const std::vector<const Tensor*>& x, Tensor& y,
                                  const ForwardContext& /*ctx*/) {
  Permute(*x[0], y, channels_, plane_, true, [this](int64_t c) { return Source(c); });
}

void ChannelShuffleLayer::Backward(const std::vector<const Tensor*>& /*x*/, const Tensor& /*y*/,
                                   const Tensor& dy, const std::vector<Tensor*>& dx) {
  if (dx[0] != nullptr) {
    Permute(dy, *dx[0], channels_, plane_, false, [this](int64_t c) { return Source(c); });
  }
}

CNNFLOW_REGISTER_LAYER(
    channel_shuffle, ChannelShuffleLayer,
    Schema("Interleaves the channels of g groups: output channel j * g + i is input channel "
           "i * k + j (C = g * k; torch.nn.ChannelShuffle, ShuffleNet).")
        .Required("groups", ParamType::kInt, "g: the number of groups C splits into"));

}  // namespace cnnflow
