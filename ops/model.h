// The model: a DAG of named layers, listed in order. Each layer reads the
// previous one unless it names its inputs (`inputs: [a, b]` for a residual
// add). Shapes are inferred at build time, so a mismatch is an error before
// any data is read, naming both layers and both shapes.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/layer.h"

namespace cnnflow {

// The name that stands for the model's input in `inputs:`.
inline constexpr const char* kModelInput = "input";

struct LayerSpec {
  std::string name;
  std::string type;
  Args args;                        // checked against the type's schema
  std::vector<std::string> inputs;  // empty: the previous layer (or the input)
  // Frozen tensors: local tensor name -> trainable ("" stands for every
  // tensor of the layer).
  std::map<std::string, bool> trainable;
  // Named init of single tensors, after the model-wide scheme: local
  // tensor name -> zeros | ones | dirac | kaiming_normal_fan_out.
  std::map<std::string, std::string> init;
  // The run's train.freeze: globs over the model's tensor names; a
  // parameter of this layer whose name one matches is frozen, whatever
  // `trainable` says (either freezes).
  std::vector<std::string> freeze;
  // train.frozen_bn: eval: a layer with running statistics whose weight and
  // bias are frozen (without them: whose running statistics a freeze glob
  // names) uses and keeps them in training too (Layer::HoldRunningStatistics).
  bool frozen_bn_eval = false;
};

// How parameters are initialised: PyTorch's defaults, or Xavier.
enum class InitScheme { kPytorchDefault, kXavierUniform, kKaimingNormal };

// Where activations between layers are stored (Model::Build):
// kAuto: channels-last with bf16 on CPUs, NCHW otherwise (graph.channels_last: auto);
// kChannelsLast: on CPUs and GPUs.
enum class MemoryFormat { kAuto, kChannelsLast, kNchw };

class Model;

// How a tensor-parallel group splits layers (TensorParallelPlacement,
// ops/parallel/tensor_parallel.h): Model::Build asks it for each layer, and
// lets it pair the split layers once every layer is built. The model knows
// no more of tensor parallelism than this.
class LayerSplitter {
 public:
  virtual ~LayerSplitter() = default;
  // The split form of layer `spec` (`args`: its args with defaults), or
  // null to build it whole.
  virtual std::unique_ptr<Layer> Split(const LayerSpec& spec, const Args& args,
                                       Device device) const = 0;
  // After Build, on the whole model.
  virtual void Pair(Model& model) const = 0;
};

// What Model::Build takes besides the layers and the input shape (each
// described at Build).
struct ModelOptions {
  DType dtype = DType::kF32;  // parameters, gradients, buffers
  uint64_t seed = 0;          // the parameters' initialisation
  InitScheme init = InitScheme::kPytorchDefault;
  Device device = Device::Cpu();
  std::optional<DType> compute = std::nullopt;  // the activations' type; unset: dtype
  bool fuse_activations = true;
  MemoryFormat memory_format = MemoryFormat::kAuto;
  bool bf16_activations = true;
  const LayerSplitter* splitter = nullptr;  // tensor parallelism
};

class Model {
 public:
  // Builds and shape-checks the layers for samples of `input_shape`
  // ([C, H, W] or [C, L]) and initialises parameters from `seed`. On a GPU
  // every layer is its CUDA class, initialised on the host to the same
  // values as on the CPU, then moved (ConfigError for a layer type without
  // a CUDA class).
  //
  // On the CPU, a relu that is the only reader of a layer's output is fused
  // into that layer when it can take it (Layer::FuseRelu: conv2d, batchnorm,
  // add), and so is a gelu (erf form) into a batchnorm (Layer::FuseGelu):
  // the activation layer then runs nothing and its output is the layer's
  // (fuse_activations false keeps every activation a layer of its own). On
  // a GPU a relu fuses into add, and into a channels-last batchnorm (after
  // the layouts are chosen), and an add may finish a batchnorm that only it
  // reads (Layer::FuseProducer).
  //
  // bf16 on the CPU (`compute` bf16 on a CPU device): every layer that can
  // multiplies in bf16 (Layer::ComputeInBf16) and the activations stay f32
  // (but for the bf16 ones below);
  // ConfigError when the CPU has no native bf16 (cpu::NoNativeBf16Reason).
  //
  // With bf16 on the CPU, activations between layers that can take them
  // channels-last (Layer::ChannelsLast: conv2d, batchnorm, max-pooling,
  // elementwise layers) are stored [N, H, W, C], as oneDNN's bf16 kernels
  // read and write them, instead of being converted around every
  // convolution; in f32 with memory_format kChannelsLast too, where
  // oneDNN's f32 convolutions read and write them as they are (AVX-512).
  // kNchw: every activation stays NCHW (also under tensor parallelism).
  // On a GPU, kChannelsLast stores activations NHWC wherever every writer
  // and reader can (cuDNN's NHWC convolutions, BatchNorm and pooling, the
  // elementwise kernels), in any compute dtype; see GpuChannelsLastRefusal.
  // The model's input and output stay NCHW.
  // Of those, an activation that only convolutions read, written by a layer
  // that can write it in bf16 (Layer::WritesBf16: batchnorm), is stored in
  // bf16: the convolutions would round it to bf16 anyway, so the results
  // are the same bits, and it is half the bytes, written once instead of
  // written, read and converted. So, the other way, is the gradient of an
  // activation that one max-pool reads and a convolution wrote
  // (Layer::WritesBf16Grad, ReadsBf16Grad). (bf16_activations false: every
  // activation and gradient stays f32.)
  //
  // Mixed precision on a GPU: with `compute` f16 or bf16, parameters,
  // gradients and buffers stay in `dtype` (f32: the master weights) and
  // activations are in `compute`: Forward casts its input, every layer
  // gets and gives `compute` tensors, keeps half copies of the weights it
  // needs, and adds its parameter gradients into the f32 ones.
  //
  // Tensor parallelism: `splitter` builds the layers it splits (a member
  // of a group holding its part), then pairs them.
  static std::unique_ptr<Model> Build(const std::vector<LayerSpec>& specs, const Shape& input_shape,
                                      const ModelOptions& options = {});
  // graph.channels_last on GPUs, checked where the config is read (no GPU
  // needed: the layers' CUDA classes are built on the host, never moved):
  // "" when every layer that reads or writes a 4-D activation has a
  // channels-last GPU kernel, else why not, naming the first that has none.
  // "" in a build without CUDA. ConfigError for a layer without CUDA kernels.
  static std::string GpuChannelsLastRefusal(const std::vector<LayerSpec>& specs,
                                            const Shape& input_shape);

  // x: [N, input...] -> the last layer's output [N, out...]. Keeps the
  // activations that Backward needs; with ctx.keep_activations false it
  // frees each one after its last consumer (the peak is then the widest
  // point of the graph, not the sum of every layer) and keeps the output.
  const Tensor& Forward(const Tensor& x, const ForwardContext& ctx);
  // dy: gradient with respect to Forward's output. Adds into parameter grads.
  // Error after a Forward that did not keep its activations.
  // layer_done(i), when given, is called as soon as layer i's parameter
  // gradients are final (layers go in reverse order): the data-parallel step
  // starts reducing a gradient bucket while backward goes on. dx, when
  // given, receives the gradient with respect to Forward's input (a
  // pipeline stage passes it to the previous stage).
  void Backward(const Tensor& dy, const std::function<void(int)>& layer_done = {},
                Tensor* dx = nullptr);

  void ZeroGrad();
  int num_layers() const { return static_cast<int>(layers_.size()); }
  Layer& layer(int i) { return *layers_[i]; }
  const Layer& layer(int i) const { return *layers_[i]; }
  Layer* FindLayer(const std::string& name);
  const Shape& input_shape() const { return input_shape_; }
  const Shape& output_shape(int i) const { return out_shapes_[i]; }
  const Shape& output_shape() const { return out_shapes_.back(); }
  const std::vector<std::string>& inputs_of(int i) const { return input_names_[i]; }
  // The layers layer i reads, by index (-1: the model's input).
  const std::vector<int>& input_indices(int i) const { return input_index_[i]; }
  // The layer an activation i is fused into (see Build), or -1.
  int fused_into(int i) const { return fused_into_[i]; }
  DType dtype() const { return dtype_; }
  DType compute_dtype() const { return compute_; }
  // The dtypes layer i's output and its gradient are stored in
  // (compute_dtype(), or bf16: see Build).
  DType activation_dtype(int i) const { return act_dtypes_[i]; }
  DType gradient_dtype(int i) const { return grad_dtypes_[i]; }
  // How many layers multiply in bf16 on the CPU (Layer::ComputeInBf16).
  int bf16_layers() const { return bf16_layers_; }
  Device device() const { return device_; }

  // Every parameter, in layer order, named "<layer>.<param>" (no wrapper
  // prefix), the way PyTorch's state_dict names them.
  struct NamedParameter {
    std::string name;
    Parameter* param;
    std::string layer_type = {};  // its layer's type ("conv2d"), for parameter groups
  };
  std::vector<NamedParameter> NamedParameters();
  // Parameters and buffers, named as above: what a checkpoint holds.
  std::vector<std::pair<std::string, Tensor>> StateTensors();
  int64_t NumParameters() const;
  int64_t ForwardFlops(int64_t n) const;

 private:
  Model() = default;
  std::vector<std::unique_ptr<Layer>> layers_;
  std::vector<std::vector<std::string>> input_names_;
  std::vector<std::vector<int>> input_index_;  // -1: the model input
  std::vector<Shape> out_shapes_;
  // The last layer that reads each layer's output (-1: none), and the
  // model input's: when Forward without keep_activations frees them.
  std::vector<int> last_reader_;
  int input_last_reader_ = -1;
  // Model::Build's steps.
  void AddLayer(const std::vector<LayerSpec>& specs, size_t i, const ModelOptions& options,
                std::map<std::string, int>& index);
  void InitParameters(const std::vector<LayerSpec>& specs, const ModelOptions& options);
  void FuseActivations();
  // Model::Build: which activations are channels-last, and which of those
  // are bf16 (see Build).
  void ChooseChannelsLast();
  void ChooseBf16Activations();
  // (layer, input) of every read of activation i.
  std::vector<std::pair<int, int>> ReadersOf(int i) const;
  // Whether every layer that reads activation i (through fused activation
  // layers, which alias it) reads it in bf16.
  bool ReadBf16Only(int i) const;
  // Each activation's dtype and its gradient's (compute_, or bf16:
  // ChooseBf16Activations).
  std::vector<DType> act_dtypes_, grad_dtypes_;
  // For an activation fused into the layer it reads: that layer's index; else -1.
  std::vector<int> fused_into_;
  Shape input_shape_;
  DType dtype_ = DType::kF32;
  DType compute_ = DType::kF32;  // of the activations
  int bf16_layers_ = 0;
  Device device_;
  // Per-forward state.
  Tensor input_;
  std::vector<Tensor> acts_;
  // What the last Forward left for Backward: nothing (none ran, or it
  // threw), every activation, or only the output.
  enum class ActsState { kNone, kKept, kFreed };
  ActsState acts_state_ = ActsState::kNone;
};

// Fills each (name, tensor) of `dst` (views: a model's StateTensors) from
// the tensor of that name in `src`, cast to dst's dtype. Throws naming
// `where` and the tensor when one is missing or has another shape.
void CopyNamedTensors(const std::vector<std::pair<std::string, Tensor>>& src,
                      const std::vector<std::pair<std::string, Tensor>>& dst,
                      const std::string& where);

// The one way cnnflow reads weights someone else wrote into a model: every
// command that takes weights (train.init, eval, predict, export, models
// --check, import's own check) goes through MatchStateDict.
//  - A file's names are PyTorch state_dict keys: a "module." prefix
//    (DataParallel, DDP) is dropped, BatchNorm's num_batches_tracked has no
//    counterpart here and is ignored.
//  - `prefix` ("ema.": a run's weight average) reads the tensors under it,
//    and only those; without one, a run's "ema.*" tensors are left out.
//  - `skip`: globs of model tensor names that are neither read nor missed.
//  - strict (the default): every tensor of the model must be in the file
//    with its shape, and every tensor of the file in the model.
// The prefix of a run's weight average (the ema stage) in checkpoints and
// model.safetensors: "ema.<layer>.<tensor>".
inline constexpr char kEmaPrefix[] = "ema.";

struct StateDictRules {
  bool strict = true;
  std::string prefix;
  std::vector<std::string> skip;
};

struct StateDictMatch {
  // (model name, the file's tensor) for each tensor that fits.
  std::vector<std::pair<std::string, Tensor>> tensors;
  // One line per tensor that does not: missing, unexpected, or shaped
  // otherwise.
  std::vector<std::string> mismatches;
};

StateDictMatch MatchStateDict(const std::vector<std::pair<std::string, Tensor>>& file,
                              const std::vector<std::pair<std::string, Tensor>>& model,
                              const StateDictRules& rules = {});

// The mismatches as an indented list (the first 20, then how many more).
std::string ListMismatches(const StateDictMatch& m);

// Copies the tensors of `match` into every model of `models` (replicas,
// pipeline stages).
void CopyStateDict(const StateDictMatch& match, const std::vector<Model*>& models,
                   const std::string& where);

// MatchStateDict, then: mismatches under strict rules throw Error naming
// `where` and listing them; otherwise CopyStateDict. Returns the match.
StateDictMatch LoadStateDict(const std::vector<std::pair<std::string, Tensor>>& file,
                             const std::vector<Model*>& models, const StateDictRules& rules,
                             const std::string& where);

}  // namespace cnnflow
