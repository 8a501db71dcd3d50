// Initialisation from the training data, once it is open: a layer's
// `init: {weight: whiten}` (ops/train/whitening.h) takes the patches of
// (up to) 5,000 training images spread over the set, read as evaluation
// reads them (no augmentation, normalised), as the CIFAR speed runs do.
#pragma once

#include <string>
#include <vector>

#include "loaders/dataset.h"
#include "loaders/transform.h"
#include "ops/model.h"
#include "pipeline/run_config.h"

namespace cnnflow {

// Sets every data-initialised tensor of config's layers in `instances`
// (the model's replicas or pipeline; `model` is the first, whose layers
// are checked). Returns a line per tensor for the log ("" when none).
// Throws ConfigError naming the config and layer for a layer it cannot
// initialise so.
std::string InitFromData(const RunConfig& config, const Dataset& train,
                         const SampleTransform& transform, Model& model,
                         const std::vector<Model*>& instances);

}  // namespace cnnflow
