#include "pipeline/init_from_data.h"

#include <algorithm>

#include "ops/train/whitening.h"

namespace cnnflow {
namespace {

Tensor& WeightOf(Layer& layer) {
  for (Parameter& p : layer.parameters())
    if (p.name == "weight") return p.value;
  throw Error(StrCat("layer '", layer.name(), "' has no weight"));
}

}  // namespace

std::string InitFromData(const RunConfig& config, const Dataset& train,
                         const SampleTransform& transform, Model& model,
                         const std::vector<Model*>& instances) {
  std::string report;
  constexpr int64_t kImages = 5000;
  constexpr double kEps = 5e-4;
  for (const LayerSpec& spec : config.layers) {
    for (const auto& [tensor, scheme] : spec.init) {
      if (scheme != "whiten") continue;
      const std::string what = StrCat(config.doc.path(), ": layer '", spec.name, "' init whiten");
      int index = 0;
      while (model.layer(index).name() != spec.name) ++index;  // Build made every spec a layer
      Layer& layer = model.layer(index);
      if (std::string(layer.type()) != "conv2d" || tensor != "weight" ||
          model.input_indices(index) != std::vector<int>{-1} || config.input_shape.rank() != 3) {
        throw ConfigError(StrCat(what,
                                 ": needs the weight of a conv2d that reads the model's "
                                 "image input"));
      }
      const Tensor& w = WeightOf(layer);
      const int c = static_cast<int>(w.dim(1)), kh = static_cast<int>(w.dim(2)),
                kw = static_cast<int>(w.dim(3));
      if (c != config.input_shape[0]) {
        throw ConfigError(StrCat(what, ": a grouped conv cannot whiten (", c, " of ",
                                 config.input_shape[0], " channels per filter)"));
      }
      const int64_t n = std::min(kImages, train.size());
      const Shape& shape = config.input_shape;
      std::vector<float> image(static_cast<size_t>(shape.numel()));
      PatchCovariance cov(c, kh, kw);
      ReadContext ctx;
      ctx.seed = config.seed;
      ctx.train = false;
      for (int64_t i = 0; i < n; ++i) {
        const ReadResult r = train.Read(i * train.size() / n, ctx, image.data());
        if (!r.ok()) continue;  // a bad record: the others suffice
        if (!train.normalizes()) transform.Apply(image.data(), shape);
        cov.Add(image.data(), static_cast<int>(shape[1]), static_cast<int>(shape[2]));
      }
      Tensor white;
      try {
        white = WhiteningWeight(cov, w.dim(0), c, kh, kw, kEps);
      } catch (const ConfigError& e) {
        throw ConfigError(StrCat(what, ": ", e.what()));
      }
      for (Model* m : instances) {
        Tensor& dst = WeightOf(*m->FindLayer(spec.name));
        dst.CopyFrom(white.To(dst.device()));
      }
      report += StrCat(report.empty() ? "" : "\n", "layer '", spec.name, "': whitening init from ",
                       cov.patches(), " patches of ", n, " training images");
    }
  }
  return report;
}

}  // namespace cnnflow
