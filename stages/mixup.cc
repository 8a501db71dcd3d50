// mixup and cutmix: batch augmentation between the loader and the devices
// (Zhang et al. 2018; Yun et al. 2019; as timm's Mixup does them). Each
// batch is paired with itself reversed: row i with row N-1-i.
//   mixup:  x_i = lam * x_i + (1 - lam) * x_{N-1-i}
//   cutmix: a box (2D inputs) or a span (1D inputs) of x_{N-1-i} pasted
//           into x_i, its area 1 - lam; lam becomes the area kept
// lam ~ Beta(alpha, alpha), one per batch; with probability 1 - prob a batch
// passes unmixed. The target of row i is lam of its own label and 1 - lam of
// row N-1-i's, carried in BatchMessage::mix_labels/mix_weights to the loss.
// The draws are keyed by the run's seed and the batch's position in the
// run, so a resumed run mixes exactly as the uninterrupted one.
#include <tbb/flow_graph.h>

#include <algorithm>
#include <cmath>

#include "ops/random.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

// Gamma(a, 1) by Marsaglia and Tsang (a < 1: Gamma(a + 1) * U^(1/a)).
double Gamma(Rng& rng, double a) {
  if (a < 1) return Gamma(rng, a + 1) * std::pow(std::max(rng.Uniform(), 1e-300), 1 / a);
  const double d = a - 1.0 / 3, c = 1 / std::sqrt(9 * d);
  for (;;) {
    const double x = rng.Normal();
    const double v = std::pow(1 + c * x, 3);
    if (v <= 0) continue;
    const double u = rng.Uniform();
    if (std::log(std::max(u, 1e-300)) < 0.5 * x * x + d - d * v + d * std::log(v)) return d * v;
  }
}

double Beta(Rng& rng, double a) {
  const double x = Gamma(rng, a), y = Gamma(rng, a);
  return x / (x + y);
}

class MixStage final : public Stage {
 public:
  MixStage(const StageInfo& info, const Args& args)
      : Stage(info),
        cutmix_(info.type == "cutmix"),
        alpha_(args.Float("alpha")),
        prob_(args.Float("prob")) {
    if (!(alpha_ > 0)) throw ConfigError(StrCat(info.type, ": alpha must be > 0, got ", alpha_));
    if (!(prob_ >= 0 && prob_ <= 1)) {
      throw ConfigError(StrCat(info.type, ": prob must be in [0, 1], got ", prob_));
    }
  }

  StagePorts Build(FlowGraph& g, const RunContext& run, PassState&) override {
    node_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::serial, [this, seed = run.seed](const Message& m) {
          return Guarded([&] {
            Mix(seed, *m);
            return m;
          });
        });
    return PortsOf(*node_);
  }

 private:
  void Mix(uint64_t seed, BatchMessage& m) const {
    const int64_t n = static_cast<int64_t>(m.labels.size());
    m.mix_labels.clear();
    m.mix_weights.clear();
    if (n < 2) return;
    // The trainer keeps a mixed run's set on the pinned path (HoldDataOnGpus).
    CNNFLOW_ENFORCE(!m.rows_on_device, info().type, ": the batch's rows are on the GPU");
    Tensor& x = m.inputs;
    CNNFLOW_ENFORCE(x.device().is_cpu() && x.dtype() == DType::kF32 && x.is_contiguous() &&
                        (x.rank() == 3 || x.rank() == 4) && x.dim(0) == n,
                    info().type, " mixes host f32 batches [N, C, L] or [N, C, H, W], got ",
                    x.shape());
    Rng rng(seed, StreamKey(0x313c5, cutmix_ ? 1 : 0, static_cast<uint64_t>(m.micro_step)));
    if (rng.Uniform() >= prob_) return;
    double lam = Beta(rng, alpha_);
    float* data = x.data<float>();
    const int64_t sample = x.numel() / n, channels = x.dim(1);
    if (!cutmix_) {
      const float a = static_cast<float>(lam), b = static_cast<float>(1 - lam);
      for (int64_t i = 0; i < n / 2; ++i) {
        float* xi = data + i * sample;
        float* xj = data + (n - 1 - i) * sample;
        for (int64_t e = 0; e < sample; ++e) {
          const float u = xi[e], v = xj[e];
          xi[e] = a * u + b * v;
          xj[e] = a * v + b * u;
        }
      }
    } else {
      // The box: 1 - lam of the area, centred anywhere, clipped to the input.
      const bool two_d = x.rank() == 4;
      const int64_t h = two_d ? x.dim(2) : 1, w = x.dim(x.rank() - 1);
      const double cut = two_d ? std::sqrt(1 - lam) : 1 - lam;
      const auto ch = static_cast<int64_t>(std::llround(h * (two_d ? cut : 1.0)));
      const auto cw = static_cast<int64_t>(std::llround(w * cut));
      const auto cy = static_cast<int64_t>(rng.Uniform() * h);
      const auto cx = static_cast<int64_t>(rng.Uniform() * w);
      const int64_t y0 = two_d ? std::clamp<int64_t>(cy - ch / 2, 0, h) : 0;
      const int64_t y1 = two_d ? std::clamp<int64_t>(cy + (ch + 1) / 2, 0, h) : 1;
      const int64_t x0 = std::clamp<int64_t>(cx - cw / 2, 0, w);
      const int64_t x1 = std::clamp<int64_t>(cx + (cw + 1) / 2, 0, w);
      lam = 1 - static_cast<double>((y1 - y0) * (x1 - x0)) / static_cast<double>(h * w);
      for (int64_t i = 0; i < n / 2; ++i) {
        float* xi = data + i * sample;
        float* xj = data + (n - 1 - i) * sample;
        for (int64_t c = 0; c < channels; ++c)
          for (int64_t y = y0; y < y1; ++y) {
            const int64_t at = (c * h + y) * w;
            std::swap_ranges(xi + at + x0, xi + at + x1, xj + at + x0);
          }
      }
    }
    m.mix_labels.resize(n);
    m.mix_weights.assign(n, static_cast<float>(lam));
    for (int64_t i = 0; i < n; ++i) m.mix_labels[i] = m.labels[n - 1 - i];
    // An odd batch's middle row is paired with itself: its own label, whole.
    if (n % 2 == 1) m.mix_weights[n / 2] = 1.0f;
  }

  bool cutmix_;
  double alpha_, prob_;
  std::unique_ptr<tbb::flow::function_node<Message, Message>> node_;
};

Schema MixSchema(const char* doc, double alpha) {
  return Schema(doc)
      .Optional("alpha", ParamType::kFloat, alpha, "lam ~ Beta(alpha, alpha), one per batch")
      .Optional("prob", ParamType::kFloat, 1.0, "the probability that a batch is mixed");
}

}  // namespace

CNNFLOW_REGISTER_STAGE(mixup, MixStage,
                       MixSchema("Batch augmentation before the devices: row i of a batch becomes "
                                 "lam * row i + (1 - lam) * row N-1-i, and its target lam of its "
                                 "label and 1 - lam of the other's (soft labels through the loss; "
                                 "CPU replicas).",
                                 0.2));
CNNFLOW_REGISTER_STAGE(cutmix, MixStage,
                       MixSchema("Batch augmentation before the devices: a box (2D) or span (1D) "
                                 "of row N-1-i pasted into row i, 1 - lam of the area; the target "
                                 "is the kept area's share of its label and the rest of the "
                                 "other's (soft labels through the loss; CPU replicas).",
                                 1.0));

}  // namespace cnnflow
