// eval_step: forward in evaluation mode (BN running statistics, no
// dropout), loss and correct predictions; no gradients. The batch goes
// through the model `micro_batch` rows at a time, each forward freeing its
// activations as it goes, so evaluating a batch of 1000 costs the memory
// of a forward of `micro_batch` rows (the templates pass train.batch: the
// buffers training already holds).
//
// Test-time augmentation (`tta`, the config's train.tta): each row's logits
// are the weighted mean of the model's logits over views of the image,
// built on the host before the rows go to the device: `flip` averages the
// image and its mirror; `flip_translate` also the two one-pixel diagonal
// translations (reflect-padded) of each, weighted half as much, as
// airbench's "mirror translate" TTA.
#include <tbb/flow_graph.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ops/device_ops.h"
#include "ops/loss.h"
#include "ops/parallel/pipeline_model.h"
#include "ops/trace.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"
#include "stages/stage.h"

namespace cnnflow {
namespace {

// One view of a batch: shifted by `shift` pixels down and right (reflect
// padding fills the border), then mirrored left-right if flip.
struct TtaView {
  int shift = 0;
  bool flip = false;
  double weight = 1;
};

std::vector<TtaView> TtaViews(const std::string& tta) {
  if (tta == "flip") return {{0, false, 0.5}, {0, true, 0.5}};
  if (tta == "flip_translate") {
    return {{0, false, 0.25}, {0, true, 0.25},    {1, false, 0.125},
            {1, true, 0.125}, {-1, false, 0.125}, {-1, true, 0.125}};
  }
  return {{0, false, 1}};
}

// numpy.pad(mode='reflect') index: -1 -> 1, n -> n - 2.
int64_t Reflect(int64_t i, int64_t n) { return i < 0 ? -i : i >= n ? 2 * (n - 1) - i : i; }

// The view of host rows x [N, C, H, W] (f32).
Tensor ViewOf(const Tensor& x, const TtaView& v) {
  const int64_t rows = x.dim(0) * x.dim(1), h = x.dim(2), w = x.dim(3);
  Tensor out = Tensor::Empty(x.shape(), DType::kF32);
  const Tensor src = x.is_contiguous() ? x : x.Clone();
  const float* in = src.data<float>();
  float* o = out.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* plane = in + r * h * w;
    for (int64_t y = 0; y < h; ++y) {
      const float* row = plane + Reflect(y - v.shift, h) * w;
      float* dst = o + (r * h + y) * w;
      for (int64_t c = 0; c < w; ++c) {
        const int64_t sx = Reflect((v.flip ? w - 1 - c : c) - v.shift, w);
        dst[c] = row[sx];
      }
    }
  }
  return out;
}

class EvalStepStage final : public Stage {
 public:
  EvalStepStage(const StageInfo& info, const Args& args)
      : Stage(info), micro_batch_(args.Int("micro_batch")), views_(TtaViews(args.String("tta"))) {
    if (micro_batch_ < 0) {
      throw ConfigError(StrCat("node '", info.node, "' (eval_step): micro_batch must be >= 0, got ",
                               micro_batch_));
    }
  }

  StagePorts Build(FlowGraph& g, const RunContext& run, PassState&) override {
    node_ = std::make_unique<tbb::flow::function_node<Message, Message>>(
        g, tbb::flow::serial, [this, &run](const Message& m) {
          return Guarded([&] {
            if (m->labels.empty()) return m;  // every record was bad and skipped
            const TraceSpan span("eval", "eval batch");
            Evaluate(run, *m);
            return m;
          });
        });
    return PortsOf(*node_);
  }

 private:
  // The batch's rows through the model micro_batch_ at a time (each row's
  // logits do not depend on the others in evaluation mode), freeing
  // activations as each forward goes: the memory of a forward of
  // micro_batch_ rows, not of the whole batch.
  // With tensor parallelism every member of group 0 runs the forward; a
  // pipeline's stages run in turn, the logits on the last one's device.
  void Evaluate(const RunContext& run, BatchMessage& m) const {
    Model& model = *run.model;
    const uint64_t seed = run.seed;
    PipelineModel* pipeline = run.pipeline;
    const Device device = pipeline ? pipeline->device(pipeline->num_stages() - 1) : model.device();
    const int64_t n = m.inputs.dim(0);
    const int64_t chunk = micro_batch_ > 0 ? std::min(micro_batch_, n) : n;
    ForwardContext ctx;
    ctx.training = false;
    ctx.seed = seed;
    ctx.step = m.global_step;
    ctx.keep_activations = false;
    Tensor inputs = m.inputs;
    Tensor labels;  // on a GPU
    const int64_t* label_data = m.labels.data();
    if (device.is_cuda()) {
      inputs = m.inputs.To(model.device());
      labels = LabelTensor(m.labels.data(), static_cast<int64_t>(m.labels.size()), device);
      label_data = labels.data<int64_t>();
    }
    Tensor pipeline_logits;
    auto forward = [&](const Tensor& x) -> const Tensor& {
      if (pipeline) return pipeline_logits = pipeline->Infer(x, ctx);
      return run.replicas != nullptr && run.replicas->tensor_parallel() > 1
                 ? run.replicas->Infer(x, ctx)
                 : model.Forward(x, ctx);
    };
    auto rows_loss = [&](int64_t b, int64_t e) {
      if (views_.size() == 1) {
        const Tensor& x = e - b == n ? inputs : inputs.Slice(b, e);
        return SoftmaxCrossEntropyAsync(forward(x), label_data + b, nullptr)->Get();
      }
      if (m.inputs.rank() != 4) {
        throw ConfigError(
            StrCat("test-time augmentation (tta) needs images [C, H, W]; the "
                   "samples are ",
                   m.inputs.shape().ToString()));
      }
      const Tensor rows = m.inputs.Slice(b, e);
      Tensor mean;  // the views' weighted logits, f32
      for (const TtaView& v : views_) {
        const Tensor& logits = forward(ViewOf(rows, v).To(model.device()));
        CNNFLOW_ENFORCE(logits.dtype() == DType::kF32, "tta: logits are ",
                        DTypeName(logits.dtype()), ", expected f32");
        if (!mean.defined()) {
          mean = logits.Clone();
          ScaleInPlace(mean, v.weight);
        } else {
          Axpy(v.weight, logits, mean);
        }
      }
      return SoftmaxCrossEntropyAsync(mean, label_data + b, nullptr)->Get();
    };
    if (chunk == n) {  // one forward: its mean loss as it is
      const LossResult r = rows_loss(0, n);
      m.loss = r.loss;
      m.correct = r.correct;
      return;
    }
    PassMetrics sum;  // of the chunks
    for (int64_t b = 0; b < n; b += chunk) {
      const int64_t e = std::min(n, b + chunk);
      const LossResult r = rows_loss(b, e);
      sum.Add(r.loss, r.correct, e - b);
    }
    m.loss = sum.mean_loss();
    m.correct = sum.correct;
  }

  int64_t micro_batch_;
  std::vector<TtaView> views_;
  std::unique_ptr<tbb::flow::function_node<Message, Message>> node_;
};

}  // namespace

CNNFLOW_REGISTER_STAGE(eval_step, EvalStepStage,
                       Schema("Forward in evaluation mode, activations freed as it goes; loss and "
                              "correct predictions per batch.")
                           .Optional("micro_batch", ParamType::kInt, int64_t{0},
                                     "rows per forward (0: the whole batch); the batch's loss "
                                     "and accuracy are the same up to float rounding, and the "
                                     "memory is that of a forward of this many rows")
                           .Choice("tta", {"none", "flip", "flip_translate"}, "none",
                                   "test-time augmentation: logits averaged over the image and "
                                   "its mirror (flip), and their one-pixel diagonal translations "
                                   "with reflect padding at half weight (flip_translate)"));

}  // namespace cnnflow
