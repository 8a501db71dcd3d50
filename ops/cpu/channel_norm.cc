#include "ops/layers/channel_norm.h"

namespace cnnflow {

ChannelNormLayer::ChannelNormLayer(const std::string& name, const Args& args, const char* type)
    : Layer(name), eps_(args.Float("eps")), affine_(args.Bool("affine")) {
  if (!(eps_ > 0)) throw ConfigError(StrCat(type, " '", name, "': eps must be > 0, got ", eps_));
}

void ChannelNormLayer::BuildChannels(const Shape& s, DType dtype) {
  channels_ = s[0];
  positions_ = s.numel() / channels_;
  if (affine_) {
    AddParameter("weight", Shape{channels_}, dtype);
    AddParameter("bias", Shape{channels_}, dtype);
  }
}

void ChannelNormLayer::ResetParameters(Rng& /*rng*/) {
  for (auto& p : parameters()) {
    for (int64_t i = 0; i < p.value.numel(); ++i) p.value.Set(i, p.name == "weight" ? 1.0 : 0.0);
  }
}

}  // namespace cnnflow
