#include "ops/model.h"

#include <fnmatch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <new>
#include <optional>
#include <set>

#include "ops/device_ops.h"
#include "ops/layers/activation.h"
#include "ops/trace.h"

namespace cnnflow {

namespace {

void InitWeight(Tensor& w, InitScheme scheme, Rng& rng) {
  const int64_t out = w.dim(0);
  const int64_t in = w.rank() > 1 ? w.dim(1) : 1;
  const int64_t receptive = w.numel() / (out * in);
  const double fan_in = static_cast<double>(in * receptive);
  const double fan_out = static_cast<double>(out * receptive);
  for (int64_t i = 0; i < w.numel(); ++i) {
    double v = 0;
    if (scheme == InitScheme::kXavierUniform) {
      const double b = std::sqrt(6.0 / (fan_in + fan_out));
      v = rng.Uniform(-b, b);
    } else {  // kKaimingNormal, fan_in mode, ReLU gain
      v = rng.Normal(0, std::sqrt(2.0 / fan_in));
    }
    w.Set(i, v);
  }
}

// The tensor `local` of a layer (a parameter's value or a buffer), or a
// ConfigError listing the layer's tensors.
Tensor& LayerTensor(Layer& layer, const std::string& local, const char* what) {
  std::string names;
  for (auto& p : layer.parameters()) {
    if (p.name == local) return p.value;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  for (auto& b : layer.buffers()) {
    if (b.name == local) return b.value;
    names += (names.empty() ? "" : ", ") + b.name;
  }
  throw ConfigError(StrCat(
      "layer '", layer.name(), "': ", what, " names tensor '", local,
      "', which it does not have; its tensors: ", names.empty() ? std::string("none") : names));
}

// nn.init.dirac_(w, groups): w [K, C/groups, k...] passes input channel d of
// each group to output channel d of that group, at the kernel's centre.
// first_only: nn.init.dirac_(w[:C]) (airbench's): only the first C filters
// are set, the others keep their init.
void DiracInit(Tensor& w, int64_t groups, bool first_only = false) {
  if (first_only) {
    const int64_t per_filter = w.numel() / w.dim(0);
    for (int64_t i = 0; i < std::min(w.dim(0), w.dim(1)) * per_filter; ++i) w.Set(i, 0.0);
  } else {
    w.Zero();
  }
  const int64_t out_per_group = w.dim(0) / groups, in_per_group = w.dim(1);
  const int64_t taps = w.numel() / (w.dim(0) * w.dim(1));
  int64_t centre = 0;  // the flat index of the centre tap
  for (int d = 2; d < w.rank(); ++d) centre = centre * w.dim(d) + w.dim(d) / 2;
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t d = 0; d < std::min(out_per_group, in_per_group); ++d)
      w.Set(((g * out_per_group + d) * in_per_group + d) * taps + centre, 1.0);
}

// A layer's `init:` and `trainable:` (LayerSpec), after its own init.
// in_channels: of the layer's (first) input, from which dirac derives the
// groups of a conv weight [K, C/groups, k...].
void ApplyTensorSpecs(const LayerSpec& spec, Layer& layer, int64_t in_channels, Rng& rng) {
  for (const auto& [local, scheme] : spec.init) {
    Tensor& t = LayerTensor(layer, local, "init");
    if (scheme == "zeros") {
      t.Zero();
    } else if (scheme == "ones") {
      for (int64_t i = 0; i < t.numel(); ++i) t.Set(i, 1.0);
    } else if (scheme == "dirac") {
      CNNFLOW_ENFORCE(t.rank() >= 3 && in_channels % t.dim(1) == 0, "layer '", layer.name(),
                      "': dirac init needs a conv weight [K, C/groups, k...], got ", t.shape());
      DiracInit(t, in_channels / t.dim(1));
    } else if (scheme == "dirac_first") {
      CNNFLOW_ENFORCE(t.rank() >= 3 && in_channels == t.dim(1), "layer '", layer.name(),
                      "': dirac_first init needs an ungrouped conv weight [K, C, k...], got ",
                      t.shape());
      DiracInit(t, 1, /*first_only=*/true);
    } else if (scheme == "whiten") {
      // From the training data, once it is open (the trainer's InitFromData).
    } else if (scheme == "kaiming_normal_fan_out") {  // torchvision's convs: fan_out, ReLU gain
      const double fan_out = static_cast<double>(t.numel() / (t.rank() > 1 ? t.dim(1) : 1));
      for (int64_t i = 0; i < t.numel(); ++i) t.Set(i, rng.Normal(0, std::sqrt(2.0 / fan_out)));
    } else {
      throw ConfigError(StrCat("layer '", layer.name(), "': unknown init scheme '", scheme, "'"));
    }
  }
  for (const auto& [local, trainable] : spec.trainable) {
    if (local.empty()) {
      for (auto& p : layer.parameters()) p.trainable = trainable;
      continue;
    }
    LayerTensor(layer, local, "trainable");  // names it, or says which exist
    bool found = false;
    for (auto& p : layer.parameters())
      if (p.name == local) p.trainable = trainable, found = true;
    if (!found) {
      throw ConfigError(StrCat("layer '", layer.name(), "': trainable names '", local,
                               "', a buffer: buffers are never trained"));
    }
  }
  const auto frozen_by_glob = [&](const std::string& local) {
    const std::string name = TensorName(layer.name(), local);
    return std::any_of(spec.freeze.begin(), spec.freeze.end(), [&](const std::string& g) {
      return fnmatch(g.c_str(), name.c_str(), 0) == 0;
    });
  };
  bool all_frozen = true;
  for (auto& p : layer.parameters()) {
    if (frozen_by_glob(p.name)) p.trainable = false;
    all_frozen = all_frozen && !p.trainable;
  }
  if (layer.parameters().empty()) {
    for (const Buffer& b : layer.buffers()) all_frozen = all_frozen && frozen_by_glob(b.name);
  }
  if (spec.frozen_bn_eval && all_frozen && !(layer.parameters().empty() && layer.buffers().empty()))
    layer.HoldRunningStatistics();
}

// "conv1 (conv2d)": a layer's name in the profiler's spans.
std::string SpanName(const Layer& layer) { return StrCat(layer.name(), " (", layer.type(), ")"); }

// A std::bad_alloc from inside a layer (a kernel's own buffer, not the
// pool's: that one throws Error itself), as the pool's error says it: who
// asked and what to do.
Error OutOfMemoryIn() {
  return Error(StrCat("out of memory (std::bad_alloc) for ", AllocationScope::Current(),
                      "; use a smaller batch (train.batch) or fewer replicas per process"));
}

// bf16 on the CPU: the activations stay f32, the layers that can multiply
// in bf16 do (Layer::ComputeInBf16).
bool CpuBf16(const ModelOptions& o) {
  return o.device.is_cpu() && o.dtype == DType::kF32 && o.compute == DType::kBF16;
}

// The options' activation type (the compute type on a GPU; the parameters'
// with bf16 on a CPU, whose layers multiply in bf16 instead), checked.
DType ActivationType(const ModelOptions& o) {
  if (o.device.is_cuda() && o.device.index >= CudaDeviceCount()) {
    throw Error(
        StrCat("cannot build the model on ", o.device.ToString(), ": ", CudaDeviceCount(),
               " usable GPUs found",
               CudaAvailable() ? "" : " (no GPU, no CUDA driver, or a build without CUDA)"));
  }
  if (CpuBf16(o)) {
    if (const std::string why = NoNativeBf16OnHost(); !why.empty()) {
      throw ConfigError(StrCat("bf16 on ", o.device.ToString(), ": ", why));
    }
    return o.dtype;
  }
  const DType act = o.compute.value_or(o.dtype);
  if (act != o.dtype && (o.device.is_cpu() || o.dtype != DType::kF32 ||
                         (act != DType::kF16 && act != DType::kBF16))) {
    throw ConfigError(
        StrCat("mixed precision computes in f16 or bf16 over f32 parameters on a GPU (or bf16 on a "
               "CPU with native bf16); got ",
               DTypeName(act), " over ", DTypeName(o.dtype), " on ", o.device.ToString()));
  }
  return act;
}

}  // namespace

std::unique_ptr<Model> Model::Build(const std::vector<LayerSpec>& specs, const Shape& input_shape,
                                    const ModelOptions& options) {
  const DType act = ActivationType(options);
  std::unique_ptr<Model> m(new Model());
  m->input_shape_ = input_shape;
  m->dtype_ = options.dtype;
  m->compute_ = act;
  m->device_ = options.device;
  std::map<std::string, int> index;  // layer name -> position
  for (size_t i = 0; i < specs.size(); ++i) m->AddLayer(specs, i, options, index);
  CNNFLOW_ENFORCE(!m->layers_.empty(), "the model has no layers");
  m->last_reader_.assign(m->layers_.size(), -1);
  for (size_t i = 0; i < m->layers_.size(); ++i) {
    for (int j : m->input_index_[i]) {
      (j < 0 ? m->input_last_reader_ : m->last_reader_[j]) = static_cast<int>(i);
    }
  }
  m->InitParameters(specs, options);
  m->fused_into_.assign(m->layers_.size(), -1);
  if (options.fuse_activations && !options.device.is_cuda()) m->FuseActivations();
  m->act_dtypes_.assign(m->layers_.size(), m->compute_);
  m->grad_dtypes_ = m->act_dtypes_;
  const bool channels_last = options.memory_format == MemoryFormat::kChannelsLast ||
                             (options.memory_format == MemoryFormat::kAuto && CpuBf16(options));
  if (options.device.is_cpu() && act == DType::kF32 && channels_last &&
      options.splitter == nullptr) {
    m->ChooseChannelsLast();
    if (CpuBf16(options) && options.bf16_activations) m->ChooseBf16Activations();
  }
  if (options.device.is_cuda() && options.memory_format == MemoryFormat::kChannelsLast &&
      options.splitter == nullptr) {
    m->ChooseChannelsLast();
  }
  // A GPU layer takes its ReLU by its layout (a channels-last batchnorm).
  if (options.fuse_activations && options.device.is_cuda()) m->FuseActivations();
  if (options.splitter != nullptr) options.splitter->Pair(*m);
  return m;
}

std::string Model::GpuChannelsLastRefusal(const std::vector<LayerSpec>& specs,
                                          const Shape& input_shape) {
  if (LayerRegistry::Get().Find("conv2d", kCudaVariant) == nullptr) return "";  // no CUDA here
  std::unique_ptr<Model> m(new Model());
  m->input_shape_ = input_shape;
  const ModelOptions options{.device = Device::Cuda(0)};
  std::map<std::string, int> index;
  for (size_t i = 0; i < specs.size(); ++i) m->AddLayer(specs, i, options, index);
  for (int i = 0; i < m->num_layers(); ++i) {
    bool four_d = m->out_shapes_[i].rank() == 3;
    for (int j : m->input_index_[i]) {
      four_d = four_d || (j < 0 ? input_shape : m->out_shapes_[j]).rank() == 3;
    }
    if (four_d && m->layers_[i]->ChannelsLastSupport() == Layer::ChannelsLast::kNo) {
      return StrCat("layer '", specs[i].name, "' (", specs[i].type,
                    ") has no channels-last GPU kernel yet");
    }
  }
  return "";
}

// Layer i of `specs`: made (or split), wired to its inputs by name, and
// built on their shapes; a shape error names both layers.
void Model::AddLayer(const std::vector<LayerSpec>& specs, size_t i, const ModelOptions& options,
                     std::map<std::string, int>& index) {
  const Device& device = options.device;
  const LayerSplitter* splitter = options.splitter;
  const LayerRegistry& registry = LayerRegistry::Get();
  const LayerSpec& s = specs[i];
  if (s.name == kModelInput || index.count(s.name)) {
    throw ConfigError(StrCat("layer name '", s.name, "' is used twice (or is the reserved name '",
                             kModelInput, "')"));
  }
  const LayerType* type = registry.Find(s.type);
  if (type == nullptr)
    throw ConfigError(StrCat("layer '", s.name, "': ", registry.Unknown(s.type)));
  Args args = s.args;
  args.FillDefaults(type->schema);
  const LayerType* impl = device.is_cuda() ? registry.Find(s.type, kCudaVariant) : type;
  if (impl == nullptr) {
    throw ConfigError(StrCat("layer '", s.name, "': layer type '", s.type,
                             "' has no CUDA kernels yet, so the model cannot run on ",
                             device.ToString()));
  }
  std::unique_ptr<Layer> layer = splitter != nullptr ? splitter->Split(s, args, device) : nullptr;
  if (layer == nullptr) {
    layer = impl->create(s.name, args);
  }

  std::vector<std::string> in_names = s.inputs;
  if (in_names.empty()) in_names.push_back(i == 0 ? kModelInput : specs[i - 1].name);
  const int wanted = layer->num_inputs();
  if (wanted == kVariadicInputs ? in_names.size() < 2
                                : static_cast<int>(in_names.size()) != wanted) {
    throw ConfigError(
        StrCat("layer '", s.name, "' (", s.type, ") takes ",
               wanted == kVariadicInputs ? std::string("2 or more") : std::to_string(wanted),
               " input(s), got ", in_names.size(), " (name them with `inputs:`)"));
  }
  std::vector<int> in_index;
  std::vector<Shape> in_shapes;
  for (const auto& n : in_names) {
    if (n == kModelInput) {
      in_index.push_back(-1);
      in_shapes.push_back(input_shape_);
    } else if (auto it = index.find(n); it != index.end()) {
      in_index.push_back(it->second);
      in_shapes.push_back(out_shapes_[it->second]);
    } else {
      throw ConfigError(
          StrCat("layer '", s.name, "' reads '", n, "', which is not an earlier layer"));
    }
  }
  Shape out;
  try {
    out = layer->Build(in_shapes, options.dtype);
  } catch (const ShapeError& e) {
    std::string from;
    for (size_t k = 0; k < in_names.size(); ++k) {
      const std::string src =
          in_names[k] == kModelInput
              ? std::string("the model input")
              : StrCat("'", in_names[k], "' (", specs[index[in_names[k]]].type, ")");
      from += StrCat(k ? " and " : "", src, " produces ", in_shapes[k]);
    }
    throw ShapeError(StrCat("shape mismatch at layer '", s.name, "' (", s.type, "): ", from,
                            ", but ", e.what()));
  }
  if (CpuBf16(options) && layer->ComputeInBf16()) ++bf16_layers_;
  index[s.name] = static_cast<int>(i);
  layers_.push_back(std::move(layer));
  input_names_.push_back(in_names);
  input_index_.push_back(in_index);
  out_shapes_.push_back(out);
}

// Parameters from (seed, layer): PyTorch's defaults or the options' scheme,
// then the specs' own tensors; moved to the device.
void Model::InitParameters(const std::vector<LayerSpec>& specs, const ModelOptions& options) {
  for (size_t i = 0; i < layers_.size(); ++i) {
    Rng rng(options.seed, StreamKey(0x1a7e5, i));
    layers_[i]->ResetParameters(rng);
    if (options.init != InitScheme::kPytorchDefault) {
      for (auto& p : layers_[i]->parameters())
        if (p.name == "weight" && p.value.rank() >= 2) InitWeight(p.value, options.init, rng);
    }
    const int first_input = input_index_[i][0];
    const Shape& in = first_input < 0 ? input_shape_ : out_shapes_[first_input];
    ApplyTensorSpecs(specs[i], *layers_[i], in[0], rng);
    if (options.device.is_cuda()) layers_[i]->MoveTo(options.device);
  }
}

// A relu (or the erf form of gelu) that is the only reader of a layer that
// can take it runs inside that layer; on GPUs a layer may then finish its
// only-read producer's forward (Layer::FuseProducer).
void Model::FuseActivations() {
  std::vector<int> readers(layers_.size(), 0);
  for (const auto& ins : input_index_)
    for (int j : ins)
      if (j >= 0) ++readers[j];
  auto fuse = [](const Layer& act, Layer& layer) {
    if (std::string(act.type()) == "relu") return layer.FuseRelu();
    const auto* a = dynamic_cast<const ActivationLayer*>(&act);
    return a != nullptr && a->kind() == Activation::kGeluErf && layer.FuseGelu();
  };
  for (size_t i = 0; i < layers_.size(); ++i) {
    if (input_index_[i].size() != 1) continue;
    const int j = input_index_[i][0];
    if (j >= 0 && readers[j] == 1 && fuse(*layers_[i], *layers_[j])) fused_into_[i] = j;
  }
  if (!device_.is_cuda()) return;
  for (size_t i = 0; i < layers_.size(); ++i) {
    for (size_t k = 0; k < input_index_[i].size(); ++k) {
      const int j = input_index_[i][k];
      if (j >= 0 && readers[j] == 1 && fused_into_[j] < 0) layers_[i]->FuseProducer(k, *layers_[j]);
    }
  }
}

void Model::ChooseChannelsLast() {
  const int num = static_cast<int>(layers_.size());
  // Activations tied by a kFollows layer (its inputs and its output) share
  // one layout: a union-find over them (-1, the model input, is not one).
  std::vector<int> group(num);
  for (int i = 0; i < num; ++i) group[i] = i;
  auto root = [&](int i) {
    while (group[i] != i) i = group[i] = group[group[i]];
    return i;
  };
  using CL = Layer::ChannelsLast;
  std::vector<char> ok(num, 1);  // per group root: every writer and reader can
  for (int i = 0; i < num; ++i) {
    const CL support = layers_[i]->ChannelsLastSupport();
    // The model's output, and what is not [N, C, H, W], stay as they are.
    if (support == CL::kNo || out_shapes_[i].rank() != 3 || i == num - 1) ok[i] = 0;
    for (int j : input_index_[i]) {
      if (support == CL::kFollows) {
        if (j < 0) {
          ok[root(i)] = 0;  // follows the model input, which is NCHW
        } else {
          const int a = root(i), b = root(j);
          group[a] = b;
          ok[b] = ok[b] && ok[a];
        }
      }
      if (j >= 0 && support == CL::kNo) ok[root(j)] = 0;
    }
  }
  auto nhwc = [&](int j) { return j >= 0 && ok[root(j)] != 0; };
  for (int i = 0; i < num; ++i) {
    std::vector<bool> in;
    bool any = nhwc(i);
    for (int j : input_index_[i]) {
      in.push_back(nhwc(j));
      any = any || in.back();
    }
    if (any) layers_[i]->SetChannelsLast(in, nhwc(i));
  }
}

std::vector<std::pair<int, int>> Model::ReadersOf(int i) const {
  std::vector<std::pair<int, int>> readers;
  for (int r = 0; r < num_layers(); ++r) {
    for (size_t k = 0; k < input_index_[r].size(); ++k)
      if (input_index_[r][k] == i) readers.emplace_back(r, static_cast<int>(k));
  }
  return readers;
}

bool Model::ReadBf16Only(int i) const {
  for (const auto& [r, k] : ReadersOf(i)) {
    const bool ok =
        fused_into_[r] == i ? r != num_layers() - 1 && ReadBf16Only(r) : layers_[r]->ReadsBf16(k);
    if (!ok) return false;
  }
  return true;
}

void Model::ChooseBf16Activations() {
  const int last = num_layers() - 1;
  for (int i = 0; i < last; ++i) {
    if (fused_into_[i] >= 0 || !layers_[i]->nhwc_output() || !layers_[i]->WritesBf16() ||
        last_reader_[i] < 0 || !ReadBf16Only(i)) {
      continue;
    }
    act_dtypes_[i] = DType::kBF16;
    for (int r = i + 1; r <= last; ++r)  // the fused activation layers that alias it
      if (fused_into_[r] == i) act_dtypes_[r] = DType::kBF16;
  }
  // Gradients: one reader (no sum of several), not a fused one.
  for (int i = 0; i < last; ++i) {
    if (fused_into_[i] >= 0 || !layers_[i]->ReadsBf16Grad()) continue;
    const auto readers = ReadersOf(i);
    if (readers.size() != 1) continue;
    const auto [r, k] = readers[0];
    if (fused_into_[r] < 0 && layers_[r]->WritesBf16Grad(k)) grad_dtypes_[i] = DType::kBF16;
  }
}

const Tensor& Model::Forward(const Tensor& x, const ForwardContext& ctx) {
  if (x.shape().WithoutBatch() != input_shape_) {
    throw ShapeError(StrCat("model input has shape ", x.shape(), ", expected [N, ",
                            input_shape_.ToString().substr(1)));
  }
  const int64_t n = x.dim(0);
  if (x.dtype() != compute_) {  // the f32 batch of a mixed-precision model
    CNNFLOW_ENFORCE(x.device().is_cuda(), "a ", DTypeName(compute_), " model got a ",
                    DTypeName(x.dtype()), " batch on ", x.device().ToString());
    if (!input_.defined() || input_.shape() != x.shape() || input_.dtype() != compute_ ||
        input_.device() != x.device()) {
      input_ = Tensor::Empty(x.shape(), compute_, x.device());
    }
    Cast(x, input_);
  } else {
    input_ = x;
  }
  const bool keep = ctx.keep_activations;
  acts_state_ = ActsState::kNone;  // until this forward completes
  acts_.resize(layers_.size());
  // Without keeping, a previous forward's activations (kept between
  // training steps for reuse) go back to the pool now, not as each layer
  // replaces its own: else they would all be live at this forward's peak.
  if (!keep)
    for (Tensor& a : acts_) a = Tensor();
  const int last = static_cast<int>(layers_.size()) - 1;
  std::vector<const Tensor*> ins;
  for (size_t i = 0; i < layers_.size(); ++i) {
    ins.clear();
    for (int j : input_index_[i]) ins.push_back(j < 0 ? &input_ : &acts_[j]);
    Tensor& y = acts_[i];
    const Shape shape = out_shapes_[i].WithBatch(n);
    const Layer* layer = layers_[i].get();
    if (fused_into_[i] >= 0) {
      y = acts_[fused_into_[i]];  // the fused layer wrote max(., 0) already
    } else {
      const AllocationScope scope([layer, &shape] {
        return StrCat("layer '", layer->name(), "' (", layer->type(), ") forward, output ", shape);
      });
      try {
        if (!y.defined() || y.shape() != shape || y.dtype() != act_dtypes_[i]) {
          y = Tensor::Empty(shape, act_dtypes_[i], x.device());
        }
        const TraceSpan span("forward", [layer] { return SpanName(*layer); });
        const DeviceSpan device_span(device_, "gpu forward", [layer] { return SpanName(*layer); });
        layers_[i]->Forward(ins, y, ctx);
      } catch (const std::bad_alloc&) {
        throw OutOfMemoryIn();
      }
    }
    if (!keep) {
      // Free what no later layer reads: this layer's inputs if it was their
      // last reader, and its own output if nothing reads it (the model's
      // output stays).
      const int at = static_cast<int>(i);
      for (int j : input_index_[i]) {
        if (j < 0) {
          if (input_last_reader_ == at) input_ = Tensor();
        } else if (last_reader_[j] == at) {
          acts_[j] = Tensor();
        }
      }
      if (last_reader_[i] < 0 && at != last) y = Tensor();
    }
  }
  acts_state_ = keep ? ActsState::kKept : ActsState::kFreed;
  return acts_.back();
}

void Model::Backward(const Tensor& dy, const std::function<void(int)>& layer_done, Tensor* dx) {
  const int num = static_cast<int>(layers_.size());
  CNNFLOW_ENFORCE(acts_state_ != ActsState::kFreed,
                  "Backward after a Forward that did not keep its activations "
                  "(ForwardContext::keep_activations = false, as evaluation runs it): they were "
                  "freed as that forward went; run Forward with keep_activations = true first");
  CNNFLOW_ENFORCE(acts_state_ == ActsState::kKept && dy.shape() == acts_.back().shape(),
                  "Backward without a matching Forward: dy ", dy.shape());
  // Whether each layer's output needs a gradient: a tensor of it or of a
  // layer it reads (transitively) needs one (Parameter::needs_grad), or it
  // reads the model input and the caller wants dx. Layers that need none
  // are skipped, and an input that needs none gets no dx.
  std::vector<char> needs(num, 0);
  for (int i = 0; i < num; ++i) {
    for (const Parameter& p : layers_[i]->parameters()) needs[i] |= p.needs_grad();
    for (int j : input_index_[i]) needs[i] |= j < 0 ? dx != nullptr : needs[j];
  }
  std::vector<Tensor> grads(num);
  grads[num - 1] = dy;
  bool dx_written = false;
  std::vector<const Tensor*> ins;
  std::vector<Tensor*> dxs;
  for (int i = num - 1; i >= 0; --i) {
    if (!grads[i].defined() || !needs[i]) {  // nothing downstream or upstream depends on it
      if (layer_done) layer_done(i);
      continue;
    }
    if (fused_into_[i] >= 0) {  // the fused layer takes the gradient of its activation
      grads[fused_into_[i]] = std::move(grads[i]);
      if (layer_done) layer_done(i);
      continue;
    }
    const Layer* layer = layers_[i].get();
    const AllocationScope scope(
        [layer] { return StrCat("layer '", layer->name(), "' (", layer->type(), ") backward"); });
    ins.clear();
    dxs.clear();
    std::vector<Tensor> local(input_index_[i].size());
    for (size_t k = 0; k < input_index_[i].size(); ++k) {
      const int j = input_index_[i][k];
      ins.push_back(j < 0 ? &input_ : &acts_[j]);
      if (j < 0) {
        if (dx == nullptr) {
          dxs.push_back(nullptr);  // no gradient for the data
        } else {
          local[k] = Tensor::Empty(input_.shape(), compute_, input_.device());
          dxs.push_back(&local[k]);
        }
      } else if (!needs[j]) {
        dxs.push_back(nullptr);
      } else {
        local[k] = Tensor::Empty(acts_[j].shape(), grad_dtypes_[j], acts_[j].device());
        dxs.push_back(&local[k]);
      }
    }
    try {
      const TraceSpan span("backward", [layer] { return SpanName(*layer); });
      const DeviceSpan device_span(device_, "gpu backward", [layer] { return SpanName(*layer); });
      layers_[i]->Backward(ins, acts_[i], grads[i], dxs);
    } catch (const std::bad_alloc&) {
      throw OutOfMemoryIn();
    }
    for (size_t k = 0; k < input_index_[i].size(); ++k) {
      const int j = input_index_[i][k];
      if (dxs[k] == nullptr) continue;
      if (j < 0) {
        if (dx_written) {
          AddInPlace(*dx, local[k]);
        } else {
          *dx = local[k];
          dx_written = true;
        }
        continue;
      }
      if (grads[j].defined()) {
        AddInPlace(grads[j], local[k]);  // fan-out: gradients sum
      } else {
        grads[j] = local[k];
      }
    }
    grads[i] = Tensor();
    if (layer_done) layer_done(i);
  }
  if (dx != nullptr && !dx_written) *dx = Tensor::Zeros(input_.shape(), compute_, input_.device());
}

void Model::ZeroGrad() {
  for (auto& l : layers_)
    for (auto& p : l->parameters()) p.grad.Zero();
}

Layer* Model::FindLayer(const std::string& name) {
  for (auto& l : layers_)
    if (l->name() == name) return l.get();
  return nullptr;
}

std::vector<Model::NamedParameter> Model::NamedParameters() {
  std::vector<NamedParameter> out;
  for (auto& l : layers_)
    for (auto& p : l->parameters()) out.push_back({TensorName(l->name(), p.name), &p, l->type()});
  return out;
}

std::vector<std::pair<std::string, Tensor>> Model::StateTensors() {
  std::vector<std::pair<std::string, Tensor>> out;
  for (auto& l : layers_) {
    for (auto& p : l->parameters()) out.emplace_back(TensorName(l->name(), p.name), p.value);
    for (auto& b : l->buffers()) out.emplace_back(TensorName(l->name(), b.name), b.value);
  }
  return out;
}

int64_t Model::NumParameters() const {
  int64_t n = 0;
  for (const auto& l : layers_)
    for (const auto& p : const_cast<Layer&>(*l).parameters()) n += p.value.numel();
  return n;
}

int64_t Model::ForwardFlops(int64_t n) const {
  int64_t f = 0;
  for (const auto& l : layers_) f += l->ForwardFlops(n);
  return f;
}

void CopyNamedTensors(const std::vector<std::pair<std::string, Tensor>>& src,
                      const std::vector<std::pair<std::string, Tensor>>& dst,
                      const std::string& where) {
  for (const auto& [name, tensor] : dst) {
    const Tensor* t = nullptr;
    for (const auto& [n, v] : src)
      if (n == name) t = &v;
    if (t == nullptr)
      throw Error(StrCat(where, ": has no tensor '", name, "' that the model needs"));
    if (t->shape() != tensor.shape()) {
      throw ShapeError(StrCat(where, ": '", name, "' has shape ", t->shape(), ", the model needs ",
                              tensor.shape()));
    }
    Tensor to = tensor;
    to.CopyFrom(t->dtype() == tensor.dtype() ? *t : t->Cast(tensor.dtype()));
  }
}

StateDictMatch MatchStateDict(const std::vector<std::pair<std::string, Tensor>>& file,
                              const std::vector<std::pair<std::string, Tensor>>& model,
                              const StateDictRules& rules) {
  auto skipped = [&](const std::string& name) {
    for (const std::string& g : rules.skip)
      if (fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
    return false;
  };
  auto starts = [](const std::string& s, const std::string& p) { return s.rfind(p, 0) == 0; };
  const std::string tracked = ".num_batches_tracked";
  // The file's tensors by the model's names.
  std::map<std::string, const Tensor*> given;
  for (const auto& [key, t] : file) {
    std::string n = key;
    while (starts(n, "module.")) n = n.substr(7);
    if (n.size() > tracked.size() &&
        n.compare(n.size() - tracked.size(), tracked.size(), tracked) == 0)
      continue;
    if (!rules.prefix.empty()) {
      if (!starts(n, rules.prefix)) continue;
      n = n.substr(rules.prefix.size());
    } else if (starts(n, kEmaPrefix)) {
      continue;
    }
    if (!skipped(n)) given[n] = &t;
  }
  StateDictMatch m;
  for (const auto& [name, t] : model) {
    if (skipped(name)) continue;
    auto it = given.find(name);
    if (it == given.end()) {
      m.mismatches.push_back(
          StrCat("the model's '", rules.prefix, name, "' ", t.shape(), " is not in the file"));
      continue;
    }
    if (it->second->shape() != t.shape()) {
      m.mismatches.push_back(StrCat("'", rules.prefix, name, "' is ", it->second->shape(),
                                    " in the file, ", t.shape(), " in the model"));
    } else {
      m.tensors.emplace_back(name, *it->second);
    }
    given.erase(it);
  }
  for (const auto& [name, t] : given)
    m.mismatches.push_back(
        StrCat("the file's '", rules.prefix, name, "' ", t->shape(), " is not in the model"));
  return m;
}

std::string ListMismatches(const StateDictMatch& m) {
  constexpr size_t kShown = 20;
  std::string list;
  for (size_t i = 0; i < m.mismatches.size() && i < kShown; ++i) list += "\n  " + m.mismatches[i];
  if (m.mismatches.size() > kShown)
    list += StrCat("\n  ... and ", m.mismatches.size() - kShown, " more");
  return list;
}

StateDictMatch LoadStateDict(const std::vector<std::pair<std::string, Tensor>>& file,
                             const std::vector<Model*>& models, const StateDictRules& rules,
                             const std::string& where) {
  StateDictMatch m = MatchStateDict(file, models.at(0)->StateTensors(), rules);
  if (rules.strict && !m.mismatches.empty()) {
    throw Error(
        StrCat(where, ": does not fit the model (", m.mismatches.size(),
               m.mismatches.size() == 1 ? " mismatch" : " mismatches",
               "; names are PyTorch state_dict keys, 'module.' dropped):", ListMismatches(m)));
  }
  CopyStateDict(m, models, where);
  return m;
}

void CopyStateDict(const StateDictMatch& match, const std::vector<Model*>& models,
                   const std::string& where) {
  std::set<std::string> fits;
  for (const auto& t : match.tensors) fits.insert(t.first);
  for (Model* model : models) {
    std::vector<std::pair<std::string, Tensor>> dst;
    for (auto& [name, t] : model->StateTensors())
      if (fits.count(name)) dst.emplace_back(name, t);
    CopyNamedTensors(match.tensors, dst, where);
  }
}

}  // namespace cnnflow
