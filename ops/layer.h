// The layer interface and the layer registry.
//
// How to add a layer type (one header + one .cc, one CMake line):
//   1. ops/layers/<name>.h: a class deriving from Layer; a comment with the
//      shapes.
//   2. ops/cpu/<name>.cc: Build (shape rule; create parameters), Forward and
//      Backward, and at the bottom
//        CNNFLOW_REGISTER_LAYER(name, Class, Schema("doc").Optional(...));
//      The schema documents the YAML parameters; Class's constructor takes
//      (const std::string& layer_name, const Args& args).
//   3. tests/ops/layers/<name>_test.cc (and rows in tests/ops/layers/layer_table.cc): a gradient
//   check and a naive reference.
//
// A layer that runs on a GPU has a CUDA class too, in a file of its own
// (ops/cuda/<name>.cu, or <name>_cudnn.cc / _cublas.cc over a library),
// usually derived from the CPU class to share its Build and parameters,
// registered with CNNFLOW_REGISTER_CUDA_LAYER(name, CudaClass). A model
// built for `cuda:K` makes every layer from its CUDA class, builds and
// initialises it on the host exactly as on the CPU (same values from the
// same seed), then moves its parameters and buffers to the GPU. Its
// Forward/Backward get tensors on that GPU and issue work on its compute
// stream (ops/cuda/context.h).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/random.h"
#include "ops/registry.h"
#include "ops/schema.h"
#include "ops/tensor.h"

namespace cnnflow {

// What num_inputs() returns for a layer that takes any number >= 2 of
// inputs (concat): Model::Build then accepts 2 or more `inputs:`.
inline constexpr int kVariadicInputs = -1;

// The state_dict name of a layer's tensor: "<layer>.<local>", or the layer's
// own name when the local name is empty (torchvision's ConvNeXt names its
// layer scale `features.1.0.layer_scale`, a tensor directly on the module).
// Every place that names a parameter or buffer goes through it.
inline std::string TensorName(const std::string& layer, const std::string& local) {
  return local.empty() ? layer : layer + "." + local;
}

// A learnable tensor and its gradient (same shape, dtype, device).
struct Parameter {
  std::string name;  // local name: "weight", "bias"; "" for a tensor named as its layer
  Tensor value;
  Tensor grad;
  // false: frozen (`trainable: false` in the YAML): no optimizer updates it.
  bool trainable = true;
  // Trainable, but its optimizer group holds it from the next step on (past
  // the group's until_epoch): set by the optimizer.
  bool held = false;
  // Whether the next backward needs its gradient. Model::Backward skips a
  // layer none of whose tensors needs one and whose inputs need none (as
  // PyTorch's autograd skips what requires no grad); a tensor of a layer
  // whose backward runs for other reasons still gets its gradient.
  bool needs_grad() const { return trainable && !held; }
};

// A non-learned state tensor saved with the model (BN running statistics).
struct Buffer {
  std::string name;
  Tensor value;
};

struct ForwardContext {
  bool training = true;
  uint64_t seed = 0;  // with step and the layer's name, seeds dropout masks
  int64_t step = 0;
  // The data set index of each row of the batch (null: the row number).
  // Random draws are keyed by it, so a sample gets the same dropout mask
  // whichever replica, shard or micro-batch it lands in.
  const int64_t* sample_ids = nullptr;
  // SyncBN: sums data[0..count) over the replicas in place (blocking; every
  // replica makes the same calls in the same order). Null: no sync. A layer
  // that uses it in backward keeps the pointer from its forward.
  const std::function<void(float* data, int64_t count)>* sync_sum = nullptr;
  // Whether Model::Forward keeps every activation for a Backward. false
  // (evaluation, inference): each activation goes back to the pool as soon
  // as its last consumer has run, only the output stays, and a Backward
  // after it is an error. Independent of `training`: a backward through an
  // evaluation-mode forward (frozen BN statistics) keeps them.
  bool keep_activations = true;
};

class Layer {
 public:
  explicit Layer(std::string name) : name_(std::move(name)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  const std::string& name() const { return name_; }
  virtual const char* type() const = 0;
  // How many inputs the layer reads (`inputs:` in YAML; default: the
  // previous layer), or kVariadicInputs for any number >= 2.
  virtual int num_inputs() const { return 1; }

  // Checks the input sample shapes (no batch dimension), creates the
  // parameters in `dtype`, and returns the output sample shape. A shape
  // that does not fit throws ShapeError saying what was expected.
  virtual Shape Build(const std::vector<Shape>& inputs, DType dtype) = 0;

  // Initialises parameters as PyTorch does by default.
  virtual void ResetParameters(Rng& /*rng*/) {}

  // x: inputs [N, ...]; y: preallocated output [N, out...].
  virtual void Forward(const std::vector<const Tensor*>& x, Tensor& y,
                       const ForwardContext& ctx) = 0;

  // dy: gradient of the loss with respect to y. Writes dx[i] (preallocated,
  // overwritten; nullptr when that input needs no gradient) and ADDS the
  // parameter gradients into Parameter::grad, so micro-batches accumulate.
  virtual void Backward(const std::vector<const Tensor*>& x, const Tensor& y, const Tensor& dy,
                        const std::vector<Tensor*>& dx) = 0;

  // Fusion on the CPU: a layer that can apply ReLU to its own output
  // returns true, and from then on its Forward writes max(y, 0) and its
  // Backward takes dy with respect to that output (masking it by y > 0
  // itself). Model::Build calls it for a relu that is the only consumer of
  // this layer's output, and then skips the relu. Default: not fusable.
  virtual bool FuseRelu() { return false; }
  // The same for a gelu (erf form) that is the only reader of this layer's
  // output: Forward writes gelu(y), and Backward takes dy with respect to
  // it. Model::Build calls it as FuseRelu. Default: not fusable.
  virtual bool FuseGelu() { return false; }
  // Fusion on GPUs: `producer` writes this layer's input `input` and has no
  // other reader. Returns true where this layer takes over the last pass of
  // the producer's forward (the add of a ResNet block finishing its
  // batchnorm: y = relu(bn(x) + z) in one pass); both still run their
  // backward as before. Model::Build calls it after the activations are
  // fused. Default: no.
  virtual bool FuseProducer(size_t /*input*/, Layer& /*producer*/) { return false; }
  // Whether its training forward draws new random numbers each step
  // (dropout): a step captured as a CUDA graph would replay its capture's
  // draws, so such a model's steps are not captured. Default: no.
  virtual bool DrawsPerStep() const { return false; }

  // bf16 on the CPU (graph.precision: bf16 on cpu:K, as PyTorch's CPU
  // autocast): a layer whose products can run in bf16 (convolutions,
  // linear) returns true and from then on rounds its operands to bf16 and
  // multiplies them natively, accumulating in f32; its tensors, parameters
  // and gradients stay f32. Model::Build calls it on every layer when the
  // CPU has native bf16. Default: stays f32.
  virtual bool ComputeInBf16() { return false; }

  // Channels-last activations on the CPU (bf16): a 4-D activation may be
  // stored [N, H, W, C] while its shape stays [N, C, H, W], and so is its
  // gradient. Model::Build decides it per activation, where every layer that
  // writes or reads it can (ChannelsLast), and tells each layer its
  // inputs' and output's layouts (SetChannelsLast). A layer that converts
  // (kConverts: conv2d in bf16, whose oneDNN kernels read and write NHWC
  // anyway) takes each side as it is told; a layer that follows
  // (kFollows: batchnorm, max-pooling, elementwise layers) works in either
  // layout and writes its output in its inputs' one. Default: NCHW only.
  enum class ChannelsLast { kNo, kConverts, kFollows };
  virtual ChannelsLast ChannelsLastSupport() const { return ChannelsLast::kNo; }
  // Called once by Model::Build (before any Forward) where some side is
  // channels-last; a kFollows layer gets the same layout on every side.
  virtual void SetChannelsLast(const std::vector<bool>& inputs, bool output) {
    nhwc_inputs_ = inputs;
    nhwc_output_ = output;
  }
  // The layouts Model::Build chose: input i, or the output, as [N, H, W, C].
  bool nhwc_input(size_t i = 0) const { return i < nhwc_inputs_.size() && nhwc_inputs_[i]; }
  bool nhwc_output() const { return nhwc_output_; }

  // bf16 activations on the CPU: among the channels-last ones, Model::Build
  // stores an activation in bf16 (DType::kBF16, the values rounded to
  // nearest even) where its writer can write it so (WritesBf16) and every
  // reader reads it so (ReadsBf16): a conv2d in bf16, which rounds its
  // input to bf16 anyway. A writer's own backward then never reads its
  // output. Default: neither.
  virtual bool WritesBf16() const { return false; }
  virtual bool ReadsBf16(size_t /*input*/) const { return false; }
  // The same for gradients: an activation's gradient is bf16 where its one
  // reader's backward can write it so (WritesBf16Grad: max-pooling, whose
  // dx holds dy's values) and its writer's backward reads it so
  // (ReadsBf16Grad: conv2d in bf16, which rounds dy anyway).
  virtual bool WritesBf16Grad(size_t /*input*/) const { return false; }
  virtual bool ReadsBf16Grad() const { return false; }

  // A layer with running statistics (batchnorm) uses and keeps them in
  // training too from now on (a frozen BN); false for a layer without them.
  virtual bool HoldRunningStatistics() { return false; }

  // Multiply-adds x2 of one forward pass on a batch of n (for reports).
  virtual int64_t ForwardFlops(int64_t /*n*/) const { return 0; }

  std::vector<Parameter>& parameters() { return params_; }
  std::vector<Buffer>& buffers() { return buffers_; }
  const std::vector<Parameter>& parameters() const { return params_; }
  const std::vector<Buffer>& buffers() const { return buffers_; }

  // Moves parameters, gradients and buffers to `device` (after Build and
  // ResetParameters). A layer holding more device state overrides it.
  virtual void MoveTo(Device device);

 protected:
  Parameter& AddParameter(std::string name, const Shape& shape, DType dtype);
  Buffer& AddBuffer(std::string name, Tensor value);

 private:
  std::string name_;
  std::vector<Parameter> params_;
  std::vector<Buffer> buffers_;
  std::vector<bool> nhwc_inputs_;
  bool nhwc_output_ = false;
};

using LayerFactory = std::function<std::unique_ptr<Layer>(const std::string&, const Args&)>;

// A layer type: registered by its CPU class at the base priority (with the
// schema of its YAML arguments) and by its CUDA class, where it has one, at
// kCudaVariant (ops/registry.h).
struct LayerType {
  static constexpr const char* kKind = "layer type";
  Schema schema;  // the CUDA variant leaves it empty: the base entry's holds
  LayerFactory create;
};
using LayerRegistry = Registry<LayerType>;

#define CNNFLOW_REGISTER_LAYER(type_name, Class, schema_expr)                                \
  static ::cnnflow::RegisterIn<::cnnflow::LayerType> cnnflow_layer_registration_##type_name( \
      #type_name, {schema_expr, [](const std::string& n, const ::cnnflow::Args& a) {         \
                     return std::unique_ptr<::cnnflow::Layer>(new Class(n, a));              \
                   }})

#define CNNFLOW_REGISTER_CUDA_LAYER(type_name, Class)                                             \
  static ::cnnflow::RegisterIn<::cnnflow::LayerType> cnnflow_cuda_layer_registration_##type_name( \
      #type_name,                                                                                 \
      {::cnnflow::Schema(),                                                                       \
       [](const std::string& n, const ::cnnflow::Args& a) {                                       \
         return std::unique_ptr<::cnnflow::Layer>(new Class(n, a));                               \
       }},                                                                                        \
      ::cnnflow::kCudaVariant)

}  // namespace cnnflow
