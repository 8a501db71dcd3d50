#include "pipeline/predictor.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "loaders/folder_dataset.h"
#include "loaders/image_decoder.h"
#include "loaders/wav.h"
#include "ops/cpu/parallel.h"
#include "ops/io/weights_file.h"

namespace cnnflow {
namespace {

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  if (s.size() < suffix.size()) return false;
  return std::equal(suffix.rbegin(), suffix.rend(), s.rbegin(),
                    [](char a, char b) { return std::tolower(a) == std::tolower(b); });
}

}  // namespace

Predictor::Predictor(const RunConfig& config, const std::string& weights) : config_(config) {
  if (config_.pipeline)
    throw ConfigError("predict runs data-parallel configs; this one is a pipeline");
  arena_ = cpu::MakeComputeArena(config_.threads, config_.data_parallel.flush_denormals);
  // One group: its members in this process (all of them, unless it spans
  // processes).
  const int group = config_.data_parallel.tensor_parallel;
  const int local = std::min(group, static_cast<int>(config_.devices.size()));
  DataParallelOptions o = config_.data_parallel;
  o.replicas = local;
  o.devices.assign(config_.devices.begin(), config_.devices.begin() + local);
  o.threads_per_replica = std::max(1, config_.threads / local);
  replicas_ = std::make_unique<ReplicaSet>(config_.layers, config_.input_shape, config_.seed,
                                           config_.init, config_.optimizer, o, MpiWorld::Get());
  std::vector<Model*> models;
  for (int r = 0; r < replicas_->size(); ++r) models.push_back(&replicas_->model(r));
  LoadStateDict(LoadWeightsFile(weights).tensors, models, {}, weights);
  // The weights went to every member's GPU from this thread's lane: the
  // other lanes' streams start after them.
  replicas_->StartPass();
  if (config_.input_shape.rank() == 3) {
    // The test set's decode (its resize_min_side and the like), else the train set's.
    const auto spec =
        config_.data.count("test") ? config_.data.at("test") : config_.data.at("train");
    Args args = spec.args;
    args.FillDefaults(AddImageAugmentParams(Schema("predict")));
    image_ = std::make_unique<ImageSampleDecoder>(config_.input_shape, args);
    if (!config_.normalize_mean.empty() &&
        !image_->FuseNormalize(config_.normalize_mean, config_.normalize_std)) {
      throw ConfigError(StrCat("the normalize transform's ", config_.normalize_mean.size(),
                               " means do not fit the ", config_.input_shape[0],
                               " channels of model.input"));
    }
  }
}

Predictor::~Predictor() = default;

Tensor Predictor::Decode(const std::string& file) const {
  const Shape& in = config_.input_shape;
  Tensor x = Tensor::Zeros(in.WithBatch(1));
  if (image_ != nullptr) {
    std::vector<uint8_t> bytes;
    if (std::string e = ReadWholeFile(file, &bytes); !e.empty()) throw Error(e);
    ReadContext ctx;
    ctx.train = false;
    if (std::string e = image_->DecodeEncoded(bytes.data(), bytes.size(), ctx, 0, x.data<float>());
        !e.empty()) {
      throw Error(StrCat("'", file, "': ", e));
    }
    return x;
  }
  if (in.rank() == 2 && in[0] == 1 && EndsWith(file, ".wav")) {
    const std::vector<float> samples = ReadWav(file);
    const int64_t n = std::min<int64_t>(in[1], static_cast<int64_t>(samples.size()));
    std::copy(samples.begin(), samples.begin() + n, x.data<float>());
    // The config's normalisation, as the transform applies it to a series.
    if (!config_.normalize_mean.empty()) {
      float* v = x.data<float>();
      for (int64_t i = 0; i < in[1]; ++i) {
        v[i] = static_cast<float>((v[i] - config_.normalize_mean[0]) / config_.normalize_std[0]);
      }
    }
    return x;
  }
  throw ConfigError(StrCat("'", file,
                           "': predict reads JPEG or PNG images for a [C, H, W] model "
                           "input and .wav files for a [1, L] one; this model takes ",
                           in));
}

Prediction Predictor::Predict(const std::string& file, int k) {
  Prediction p;
  auto t0 = std::chrono::steady_clock::now();
  Tensor x = Decode(file);
  p.decode_ms = MsSince(t0);
  ForwardContext ctx;
  ctx.training = false;
  ctx.keep_activations = false;
  const Device device = replicas_->device(0);
  t0 = std::chrono::steady_clock::now();
  const Tensor in = device.is_cuda() ? x.To(device) : x;
  Tensor logits;
  arena_->execute([&] { logits = replicas_->Infer(in, ctx).To(Device::Cpu()); });
  p.forward_ms = MsSince(t0);
  const int64_t classes = logits.numel();
  std::vector<double> prob(classes);
  double top = -INFINITY, sum = 0;
  for (int64_t c = 0; c < classes; ++c) top = std::max(top, static_cast<double>(logits.At(c)));
  for (int64_t c = 0; c < classes; ++c) sum += prob[c] = std::exp(logits.At(c) - top);
  std::vector<int> order(classes);
  std::iota(order.begin(), order.end(), 0);
  k = static_cast<int>(std::min<int64_t>(k, classes));
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int a, int b) { return prob[a] > prob[b]; });
  for (int i = 0; i < k; ++i) p.top.emplace_back(order[i], prob[order[i]] / sum);
  return p;
}

}  // namespace cnnflow
