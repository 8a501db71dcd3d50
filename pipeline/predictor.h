// Inference on files, as `cnnflow predict` runs it: a config's model with
// given weights, on the first tensor-parallel group of graph.devices (its
// first device without tensor parallelism), one file a forward (batch 1:
// the latency TP is for). A file is decoded as the config's test set
// decodes a sample: images (JPEG, PNG) through the image sources' decoder
// (resize, centre crop, the config's normalisation); 16-bit PCM WAV for a
// [1, L] model input, cut or zero-padded to L.
#pragma once

#include <tbb/task_arena.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/parallel/data_parallel.h"
#include "pipeline/run_config.h"

namespace cnnflow {

class ImageSampleDecoder;

struct Prediction {
  std::vector<std::pair<int, double>> top;  // (class, probability), most likely first
  double decode_ms = 0, forward_ms = 0;
};

class Predictor {
 public:
  // Throws naming the file for weights that do not fit the model.
  Predictor(const RunConfig& config, const std::string& weights);
  ~Predictor();

  // The k most likely classes of `file`. Throws an Error naming the file
  // when it cannot be read or decoded.
  Prediction Predict(const std::string& file, int k);

  int tensor_parallel() const { return replicas_->tensor_parallel(); }
  Device device() const { return replicas_->device(0); }

 private:
  Tensor Decode(const std::string& file) const;

  RunConfig config_;
  std::unique_ptr<tbb::task_arena> arena_;  // the forwards run in it, `threads` slots
  std::unique_ptr<ReplicaSet> replicas_;
  std::unique_ptr<ImageSampleDecoder> image_;  // for [C, H, W] inputs
};

}  // namespace cnnflow
