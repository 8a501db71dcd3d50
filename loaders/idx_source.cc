// TEMPORARY: moves into idx.cc when its author is done.
#include "loaders/idx.h"
#include "loaders/source_registry.h"

namespace cnnflow {

CNNFLOW_REGISTER_SOURCE(
    idx,
    Schema("IDX files as MNIST and Fashion-MNIST ship them (gzip-compressed or plain): "
           "uint8 images [n, rows, cols] -> samples [1, rows, cols] in [0, 1], uint8 labels [n].")
        .Required("images", ParamType::kString, "path of the images file (magic 0x00000803)")
        .Required("labels", ParamType::kString, "path of the labels file (magic 0x00000801)"),
    [](const Args& a) -> std::shared_ptr<Dataset> {
      return IdxDataset::Open(a.String("images"), a.String("labels"));
    });

}  // namespace cnnflow
