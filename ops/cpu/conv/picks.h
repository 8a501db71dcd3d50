// Which algorithm runs each pass of a conv2d layer at a batch size (its
// Conv2dPlan): with `algo: auto`, for each of forward, backward-data and
// backward-weights, whichever runs one chunk of this shape faster on this
// machine, measured once per shape and kept in the pick file
// (pick_cache.h), whose key names the shape (PickKey) and whose value the
// picks, then the rates measured. Internal to ops/cpu/conv/.
#pragma once

#include <cstdint>
#include <string>

#include "ops/layers/conv2d.h"

namespace cnnflow::cpu {

// The key of a geometry at batch n in the kernel pick cache.
std::string PickKey(const Conv2dGeometry& g, bool has_bias, int64_t n);

// The algorithms of each pass at batch n (measured once per shape under kAuto).
Conv2dPlan PlanConv(const Conv2dGeometry& g, bool has_bias, ConvAlgo algo, Conv2dScratch& scratch,
                    int64_t n, DType dtype);

}  // namespace cnnflow::cpu
