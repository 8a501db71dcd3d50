#include "pipeline/run_config.h"

#include <algorithm>
#include <filesystem>
#include <thread>

#include "loaders/source_registry.h"
#include "ops/collectives/mpi_world.h"
#include "ops/collectives/reduction_tree.h"
#include "ops/device_ops.h"
#include "ops/layer.h"
#include "ops/train/lr_schedule.h"
#include "ops/train/optimizer.h"
#include "pipeline/model_blocks.h"

#ifndef CNNFLOW_SOURCE_DIR
#define CNNFLOW_SOURCE_DIR "."
#endif

namespace cnnflow {

namespace fs = std::filesystem;

const Schema& TopLevelSchema() {
  static const Schema s =
      Schema("A run: data + model + training + which graph.")
          .Optional("name", ParamType::kString, std::string("run"), "names the run folder")
          .Optional("seed", ParamType::kInt, int64_t{0}, "seeds init, shuffling and dropout")
          .Optional("threads", ParamType::kInt, int64_t{0},
                    "the run's whole CPU thread budget (0: every core)")
          .Required("data", ParamType::kTree, "data sets (train, test) and transforms")
          .Required("model", ParamType::kTree, "input shape, layers, loss")
          .Required("train", ParamType::kTree, "epochs, batch, optimizer, schedule")
          .Optional("graph", ParamType::kTree, std::string("{}"), "graph template and devices")
          .Optional("output", ParamType::kTree, std::string("{}"), "where run folders go");
  return s;
}

const Schema& TrainSchema() {
  static const Schema s =
      Schema("How the model learns.")
          .Required("epochs", ParamType::kFloat,
                    "passes over the training set; a fraction ends the last pass early (9.9)")
          .Required("batch", ParamType::kInt, "samples per step per replica")
          .Required("optimizer", ParamType::kTree,
                    "one of {sgd: {...}}, {adam: {...}}, {adamw: {...}}")
          .Optional("freeze", ParamType::kStringList, std::vector<std::string>{},
                    "globs over tensor names (\"conv1.*\", \"layer1.*\") frozen from the first "
                    "step, as requires_grad = False: no gradient where the backward can skip "
                    "it, no optimizer step, no weight decay (a layer's trainable: false too)")
          .Choice("frozen_bn", {"train", "eval"}, "train",
                  "batchnorm layers whose weight and bias are frozen: train (batch statistics, "
                  "running ones updated, as requires_grad alone) or eval (running statistics "
                  "used and kept, as detection codebases freeze BN)")
          .Optional("param_groups", ParamType::kTree, std::string("[]"),
                    "[{params: [glob], layers: [type], lr_scale: x, weight_decay: y}]: the "
                    "tensors a group picks (the first that does) get its learning-rate scale "
                    "and weight decay")
          .Optional("schedule", ParamType::kTree, std::string("{}"), "learning-rate schedule")
          .Optional("eval_batch", ParamType::kInt, int64_t{1000}, "batch size for evaluation")
          .Optional("eval_every", ParamType::kInt, int64_t{1},
                    "evaluate after every this many epochs (and after the last)")
          .Choice("tta", {"none", "flip", "flip_translate"}, "none",
                  "test-time augmentation in evaluation (the templates' eval_step): logits "
                  "averaged over the image and its mirror, and with flip_translate their "
                  "one-pixel translations")
          .Optional("drop_last", ParamType::kBool, false,
                    "drop each epoch's last incomplete batch (PyTorch DataLoader's drop_last; "
                    "graph.sync_bn drops it anyway); the templates' samplers read it")
          .Optional("max_steps", ParamType::kInt, int64_t{0},
                    "stop each training pass after this many batches (0: whole epochs)")
          .Optional("eval_max_steps", ParamType::kInt, int64_t{0},
                    "stop each evaluation pass after this many batches (0: the whole test "
                    "set, also under max_steps)")
          .Optional("accumulate", ParamType::kInt, int64_t{1},
                    "batches whose gradients add up before one optimizer step")
          .Optional("checkpoint_every", ParamType::kInt, int64_t{0},
                    "write a checkpoint every this many optimizer steps (0: at the end "
                    "of each epoch only)")
          .Optional("keep_checkpoints", ParamType::kInt, int64_t{3},
                    "checkpoints kept in the run folder (the newest)")
          .Optional("log_every", ParamType::kInt, int64_t{50},
                    "write the training scalars to the run's TensorBoard event file every this "
                    "many optimizer steps (0: per epoch only)")
          .Optional("init", ParamType::kTree, std::string("{}"),
                    "{weights: FILE, strict: true, skip: [glob, ...]}: start from "
                    "these weights (PyTorch state_dict names; a 'module.' prefix is dropped)");
  return s;
}

const Schema& InitSchema() {
  static const Schema s =
      Schema("Start from existing weights.")
          .Optional("weights", ParamType::kString, std::string(""),
                    "a .safetensors file or a .pth/.pt as torch.save wrote it (PyTorch state_dict "
                    "names, 'module.' dropped; a relative "
                    "path from the working folder, else from the config's)")
          .Optional("strict", ParamType::kBool, true,
                    "every tensor of the model and of the file must match by name and shape")
          .Optional("skip", ParamType::kStringList, std::vector<std::string>{},
                    "globs of tensors to leave at their fresh initialisation (a new head: "
                    "[fc2.*]); the file's tensors of those names are ignored");
  return s;
}

const Schema& ModelSchema() {
  static const Schema s =
      Schema("The network.")
          .Optional("input", ParamType::kIntList, std::vector<int64_t>{},
                    "sample shape: [C, H, W] or [C, L] (a library model has its own default)")
          .Optional("layers", ParamType::kTree, std::string(""),
                    "list of {name: x, <type>: {params}, inputs: [...]} or "
                    "{name: prefix, block: b, with: {...}, repeat: N}")
          .Optional("blocks", ParamType::kTree, std::string(""),
                    "{name: {params: {p: default}, layers: [...]}}: groups of layers used by name")
          .Optional("library", ParamType::kString, std::string(""),
                    "a network of the model library (cnnflow models lists them)")
          .Optional("with", ParamType::kTree, std::string(""),
                    "the library model's options: {classes: 10, in_channels: 1, ...}")
          .Choice("loss", {"softmax_cross_entropy"}, "softmax_cross_entropy", "the loss")
          .Optional("label_smoothing", ParamType::kFloat, 0.0, "as PyTorch's CrossEntropyLoss")
          .Choice("init", {"pytorch", "xavier_uniform", "kaiming_normal"}, "pytorch",
                  "weight initialisation (pytorch: PyTorch's defaults)");
  return s;
}

const Schema& GraphSectionSchema() {
  static const Schema s =
      Schema("Which dataflow graph runs, on which devices; its keys fill $graph.* in the template.")
          .Optional("template", ParamType::kString, std::string("graphs/data_parallel.yaml"),
                    "graph template file")
          .Optional("devices", ParamType::kStringList, std::vector<std::string>{"cpu:0"},
                    "devices: cpu:K or cuda:K")
          .Optional("logical_replicas", ParamType::kInt, int64_t{0},
                    "the run's data-parallel replicas G over all processes, fixed for its life: "
                    "the global batch, the shards and the reduction order; any number of "
                    "processes carries them (8 over 3: 3 + 3 + 2, the same bits), so a "
                    "checkpoint resumes on any layout; 0: graph.devices x processes")
          .Optional("prefetch", ParamType::kInt, int64_t{4}, "batches prefetched at most")
          .Optional("prefetch_mb", ParamType::kFloat, 0.0,
                    "memory budget of the prefetched batches in MB (0: none); caps prefetch")
          .Optional("load_threads", ParamType::kInt, int64_t{1}, "decode tasks at once")
          .Optional("autotune", ParamType::kBool, false,
                    "move load_threads and prefetch during training by measured throughput")
          .Optional("bucket_mb", ParamType::kFloat, 25.0,
                    "gradient bucket size: each is all-reduced as soon as backward filled it")
          .Optional("broadcast_buffers", ParamType::kBool, true,
                    "copy BatchNorm running statistics from replica 0 after each step")
          .Optional("sync_bn", ParamType::kBool, false,
                    "BatchNorm statistics over the global batch (all replicas)")
          .Optional("precision", ParamType::kString, std::string("fp32"),
                    "fp32, or mixed precision on GPUs: bf16 | fp16 (activations in half, f32 "
                    "master weights; fp16 with dynamic loss scaling); on CPUs with native bf16 "
                    "(avx512_bf16 or AMX): bf16 (convolutions and linear layers multiply in bf16, "
                    "all else f32)")
          .Optional("tf32", ParamType::kBool, true,
                    "GPUs: f32 convolutions may multiply in TF32 on tensor cores, as PyTorch's "
                    "torch.backends.cudnn.allow_tf32; false: full f32 math (f32 matmuls never "
                    "use TF32, as PyTorch's default); CPUs never do")
          .Optional("deterministic", ParamType::kBool, false,
                    "GPUs: deterministic cuDNN algorithms only, each convolution's pick kept in "
                    "the run folder (cudnn-picks.tsv) so that a resume runs the same ones, as "
                    "torch.use_deterministic_algorithms + cudnn.deterministic; CPU runs are "
                    "bitwise deterministic already")
          .Optional("fuse_activations", ParamType::kBool, true,
                    "a relu that is the only reader of a layer's output runs inside it where "
                    "the layer can take it (CPUs: conv2d, batchnorm, add, and a gelu into "
                    "batchnorm; GPUs: add and a channels-last batchnorm); false: every "
                    "activation a layer of its own (to compare or to debug)")
          .Optional("cuda_graph", ParamType::kBool, false,
                    "GPUs: a replica's forward, backward and optimizer update captured as CUDA "
                    "graphs once a step of one shape has run twice, and replayed (three "
                    "launches a step instead of one per kernel; steps of another shape run as "
                    "before); one replica, no "
                    "dropout, no fp16, else the steps run uncaptured and the run says why; "
                    "CPUs: no effect")
          .Optional("flush_denormals", ParamType::kBool, true,
                    "CPU kernels treat denormal floats (below 1.2e-38) as zero (x86's FTZ and "
                    "DAZ), as TensorFlow does: IEEE's gradual underflow costs ~100x per "
                    "operation, and early training is full of them; false: IEEE")
          .Choice("channels_last", {"auto", "true", "false"}, "auto",
                  "activations stored [N, H, W, C] between the layers that can take them "
                  "(conv2d, batchnorm, max/avg-pooling, elementwise): auto: on CPUs with "
                  "bf16; true: on CPUs in fp32 too (oneDNN's convolutions read and write "
                  "them without a reorder on AVX-512), on GPUs in every precision (cuDNN's "
                  "NHWC kernels; a layer on 4-D activations without one is an error); "
                  "false: NCHW everywhere")
          .Optional("pipeline", ParamType::kTree, std::string("{}"),
                    "model parallelism: {stages: [[layer, ...], ...] or auto, microbatches: M, "
                    "schedule: 1f1b | gpipe}; one stage per device")
          .Optional("tensor_parallel", ParamType::kTree, std::string("{}"),
                    "operator parallelism: {size: T, layers: {name: column | row, ...}}; groups "
                    "of T devices split the named conv2d, conv1d and linear layers (column: "
                    "output channels, row: input channels), the groups are data-parallel replicas")
          .Optional("collective_timeout_s", ParamType::kFloat, 300.0,
                    "a gradient reduction not done in this time fails the run, naming the "
                    "missing replica or process")
          .Optional("startup_timeout_s", ParamType::kFloat, kMinStartupTimeoutS,
                    "the deadline of the start-up's collectives instead (config check, initial "
                    "broadcasts, the first training step), for a process slow to start; "
                    "default: the longer of 600 and collective_timeout_s")
          .Optional("stall_warn_s", ParamType::kFloat, 10.0,
                    "an MPI collective waiting this long prints a warning naming it (a slow "
                    "link or a lagging rank); after each epoch, 3 median steps where that is "
                    "longer; 0: never");
  return s;
}

namespace {

const Schema& DataSchema() {
  static const Schema s =
      Schema("Data sets and the per-sample transform.")
          .Required("train", ParamType::kTree, "the training set: {source: ..., ...}")
          .Optional("test", ParamType::kTree, std::string("{}"), "the test set")
          .Optional("transform", ParamType::kTree, std::string("[]"),
                    "list of transforms: [{normalize: {mean: [...], std: [...]}}]")
          .Choice("on_bad_record", {"fail", "skip"}, "fail",
                  "a record that cannot be read (corrupt JPEG, short value, "
                  "label out of range): fail the run, or skip and report it")
          .Optional("device_resident", ParamType::kBool, false,
                    "cuda devices: decode the training set once, hold it on each GPU as uint8 "
                    "and make every batch there (crop, pad, flip, normalize), where it fits; "
                    "CPU devices: no effect");
  return s;
}

const Schema& OutputSchema() {
  static const Schema s =
      Schema("Where results go.")
          .Optional("dir", ParamType::kString, std::string("runs"), "parent folder of run folders");
  return s;
}

const Schema& NormalizeSchema() {
  static const Schema s = Schema("x = (x - mean[c]) / std[c] per channel")
                              .Required("mean", ParamType::kFloatList, "per-channel mean")
                              .Required("std", ParamType::kFloatList, "per-channel std");
  return s;
}

DataSpec ParseSource(const YamlDoc& doc, const YAML::Node& node, const std::string& which) {
  const std::string context = "data." + which;
  if (!node.IsMap()) doc.Fail(node, context, "expected a mapping {source: ..., ...}");
  const YAML::Node src = node["source"];
  const SourceRegistry& reg = SourceRegistry::Get();
  if (!src.IsDefined()) {
    doc.Fail(node, context, StrCat("missing key 'source' (one of: ", JoinNames(reg.Names()), ")"));
  }
  DataSpec d;
  d.source = doc.Name(src, context);
  const SourceType* type = reg.Find(d.source);
  if (type == nullptr) doc.Fail(src, context, UnknownNameMessage("source", d.source, reg.Names()));
  YAML::Node rest(YAML::NodeType::Map);
  for (const auto& kv : node) {
    const std::string key = doc.Name(kv.first, context);
    if (key == "source") continue;
    if (type->schema.Find(key) == nullptr) {
      doc.Fail(kv.first, StrCat(context, " (", d.source, ")"),
               UnknownNameMessage("key", key, type->schema.Names()));
    }
    rest[key] = kv.second;
  }
  d.args = doc.CheckArgs(rest, type->schema, StrCat(context, " (", d.source, ")"));
  return d;
}

// The single {type: {params}} entry of an optimizer mapping.
void ParseOptimizer(const YamlDoc& doc, const YAML::Node& node, RunConfig& c) {
  if (!node.IsMap() || node.size() != 1) {
    std::vector<std::string> given;
    if (node.IsMap())
      for (const auto& kv : node) given.push_back(doc.Name(kv.first, "train.optimizer"));
    doc.Fail(
        node, "train.optimizer",
        StrCat("expected one optimizer, e.g. {sgd: {lr: 0.01}}",
               given.empty() ? "" : StrCat(", got ", given.size(), " (", JoinNames(given), ")"),
               "; known: ", JoinNames(OptimizerTypes())));
  }
  const auto kv = *node.begin();
  OptimizerSpec& o = c.optimizer;
  o.type = doc.Name(kv.first, "train.optimizer");
  const auto types = OptimizerTypes();
  if (std::find(types.begin(), types.end(), o.type) == types.end()) {
    doc.Fail(kv.first, "train.optimizer", UnknownNameMessage("optimizer", o.type, types));
  }
  o.args =
      doc.CheckArgs(kv.second, OptimizerSchema(o.type), StrCat("train.optimizer (", o.type, ")"));
}

const Schema& ParamGroupSchema() {
  static const Schema s =
      Schema("A parameter group: the tensors it picks train with their own values.")
          .Optional("params", ParamType::kStringList, std::vector<std::string>{},
                    "globs over tensor names (\"*.bias\", \"layer4.*\"); none: any")
          .Optional("layers", ParamType::kStringList, std::vector<std::string>{},
                    "layer types (batchnorm, layernorm, ...) whose tensors it picks; none: any")
          .Optional("lr_scale", ParamType::kFloat, 1.0, "the learning rate times this")
          .Optional("until_epoch", ParamType::kFloat, 0.0,
                    "> 0: its tensors train until this epoch (fractions allowed), then hold; "
                    "unset: no limit (to freeze tensors from the start: train.freeze)")
          .Optional("weight_decay", ParamType::kFloat, -1.0,
                    "its weight decay (-1, unset: the optimizer's)");
  return s;
}

// train.param_groups: a list; each tensor takes the first group that picks it.
void ReadParamGroups(const YamlDoc& doc, const YAML::Node& node, RunConfig& c) {
  if (!node.IsDefined() || node.IsNull()) return;
  if (!node.IsSequence()) {
    doc.Fail(node, "train.param_groups",
             "expected a list, e.g. [{layers: [batchnorm], weight_decay: 0}]");
  }
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string key = StrCat("train.param_groups[", i, "]");
    const Args a = doc.CheckArgs(node[i], ParamGroupSchema(), key);
    ParamGroup g;
    g.params = a.Strings("params");
    g.layer_types = a.Strings("layers");
    g.lr_scale = a.Float("lr_scale");
    g.until_epoch = a.Float("until_epoch");
    if (node[i]["until_epoch"] && g.until_epoch <= 0) {
      doc.Fail(node[i]["until_epoch"], key,
               StrCat("until_epoch: ", g.until_epoch,
                      " would train these tensors for no epochs; to freeze tensors from the "
                      "first step, list their globs in train.freeze (leave until_epoch out for "
                      "no limit)"));
    }
    if (node[i]["weight_decay"]) g.weight_decay = a.Float("weight_decay");
    g.where = StrCat(doc.Where(node[i]), ": ", key);
    if (g.params.empty() && g.layer_types.empty()) {
      doc.Fail(node[i], key, "needs params (globs over tensor names) or layers (layer types)");
    }
    const auto known = LayerRegistry::Get().Names();
    for (const std::string& t : g.layer_types) {
      if (std::find(known.begin(), known.end(), t) == known.end()) {
        doc.Fail(node[i]["layers"], key, UnknownNameMessage("layer type", t, known));
      }
    }
    c.optimizer.groups.push_back(std::move(g));
  }
}

YAML::Node Section(const YAML::Node& root, const char* key) {
  YAML::Node n = root[key];
  return n.IsDefined() && !n.IsNull() ? n : YAML::Node(YAML::NodeType::Map);
}

void ParsePipeline(const YamlDoc& doc, const YAML::Node& pipe, RunConfig& c) {
  static const Schema schema =
      Schema("Pipeline model parallelism.")
          .Required("stages", ParamType::kTree, "[[layer, ...], ...] (one list per device) or auto")
          .Optional("microbatches", ParamType::kInt, int64_t{4}, "micro-batches per batch")
          .Choice("schedule", {"1f1b", "gpipe"}, "1f1b", "the order of forwards and backwards");
  if (!pipe.IsMap())
    doc.Fail(pipe, "graph.pipeline", "expected a mapping {stages: ..., microbatches: M}");
  const Args a = doc.CheckArgs(pipe, schema, "graph.pipeline");
  c.pipeline = true;
  const int64_t microbatches = a.Int("microbatches");
  if (microbatches < 1)
    doc.Fail(pipe["microbatches"], "graph.pipeline.microbatches", "must be >= 1");
  c.pipeline_options.microbatches = static_cast<int>(microbatches);
  c.pipeline_options.schedule = ParsePipelineSchedule(a.String("schedule"));
  const YAML::Node st = pipe["stages"];
  if (st.IsScalar() && st.as<std::string>() == "auto") {
    c.pipeline_options.stages.clear();  // cut by the trainer, one stage per device
  } else if (st.IsSequence()) {
    for (const auto& stage : st) {
      if (!stage.IsSequence() || stage.size() == 0) {
        doc.Fail(stage, "graph.pipeline.stages", "each stage is a non-empty list of layer names");
      }
      c.pipeline_options.stages.emplace_back();
      for (const auto& name : stage) {
        c.pipeline_options.stages.back().push_back(doc.Name(name, "graph.pipeline.stages"));
      }
    }
    if (c.pipeline_options.stages.size() != c.devices.size()) {
      doc.Fail(st, "graph.pipeline.stages",
               StrCat(c.pipeline_options.stages.size(), " stages but ", c.devices.size(),
                      " devices in graph.devices: one stage per device"));
    }
  } else {
    doc.Fail(st, "graph.pipeline.stages", "expected a list of layer lists, or auto");
  }
}

void ParseTensorParallel(const YamlDoc& doc, const YAML::Node& tp, RunConfig& c) {
  static const Schema schema =
      Schema("Tensor (operator) parallelism.")
          .Required("size", ParamType::kInt, "devices in a tensor-parallel group")
          .Required("layers", ParamType::kTree, "{layer: column | row | spatial, ...}");
  if (!tp.IsMap())
    doc.Fail(tp, "graph.tensor_parallel", "expected a mapping {size: T, layers: {...}}");
  const Args a = doc.CheckArgs(tp, schema, "graph.tensor_parallel");
  const int64_t size = a.Int("size");
  const int64_t devices = static_cast<int64_t>(c.devices.size());
  // A multiple of the devices: a group spans size / devices processes of
  // an MPI job (ReplicaSet checks the job's size).
  if (size < 1 || (devices % size != 0 && size % devices != 0)) {
    doc.Fail(tp["size"], "graph.tensor_parallel.size",
             StrCat(size, " must be >= 1 and divide the ", devices,
                    " devices of graph.devices, or be a multiple of them (a group across ",
                    "processes)"));
  }
  c.data_parallel.tensor_parallel = static_cast<int>(size);
  const YAML::Node layers = tp["layers"];
  if (!layers.IsMap() || layers.size() == 0) {
    doc.Fail(layers, "graph.tensor_parallel.layers", "expected {layer: column | row, ...}");
  }
  for (const auto& kv : layers) {
    const std::string name = kv.first.as<std::string>();
    const std::string split = kv.second.IsScalar() ? kv.second.as<std::string>() : "";
    if (split != "column" && split != "row" && split != "spatial") {
      doc.Fail(kv.second, StrCat("graph.tensor_parallel.layers.", name),
               StrCat("'", split,
                      "': expected column (output channels), row (input channels) "
                      "or spatial (output rows)"));
    }
    bool known = false;
    for (const LayerSpec& l : c.layers) known |= l.name == name;
    if (!known) {
      doc.Fail(kv.first, "graph.tensor_parallel.layers",
               StrCat("'", name, "' is not a layer of the model"));
    }
    c.data_parallel.split_layers[name] = split == "column" ? TensorSplit::kColumn
                                         : split == "row"  ? TensorSplit::kRow
                                                           : TensorSplit::kSpatial;
  }
}

}  // namespace

std::string ResolveProjectPath(const std::string& path, const std::string& config_path) {
  const fs::path p(path);
  if (p.is_absolute() || fs::exists(p)) return p.string();
  const fs::path dir = fs::absolute(config_path).parent_path();
  for (const fs::path& base : {dir, dir.parent_path(), fs::path(CNNFLOW_SOURCE_DIR)}) {
    if (fs::exists(base / p)) return (base / p).lexically_normal().string();
  }
  return p.string();
}

namespace {

// data: the sources and the normalisation. Returns the section's arguments.
Args ReadData(const YamlDoc& doc, RunConfig& c) {
  const YAML::Node data = doc.root()["data"];
  Args data_args = doc.CheckArgs(data, DataSchema(), "data");
  c.data["train"] = ParseSource(doc, data["train"], "train");
  if (data["test"].IsDefined() && !data["test"].IsNull()) {
    c.data["test"] = ParseSource(doc, data["test"], "test");
  }
  const YAML::Node t = data["transform"];
  if (!t.IsDefined() || t.IsNull()) return data_args;
  if (!t.IsSequence()) doc.Fail(t, "data.transform", "expected a list");
  for (const auto& item : t) {
    if (!item.IsMap() || item.size() != 1) {
      doc.Fail(item, "data.transform", "expected {normalize: {...}}");
    }
    const auto kv = *item.begin();
    const std::string kind = doc.Name(kv.first, "data.transform");
    if (kind != "normalize") {
      doc.Fail(kv.first, "data.transform", UnknownNameMessage("transform", kind, {"normalize"}));
    }
    Args a = doc.CheckArgs(kv.second, NormalizeSchema(), "data.transform normalize");
    c.normalize_mean = a.Floats("mean");
    c.normalize_std = a.Floats("std");
    if (c.normalize_mean.size() != c.normalize_std.size()) {
      doc.Fail(kv.second, "data.transform normalize", "mean and std need as many values");
    }
  }
  return data_args;
}

// model: the layers (blocks expanded), the input, init and loss settings.
void ReadModel(const YamlDoc& doc, RunConfig& c) {
  const YAML::Node model = doc.root()["model"];
  Args m = doc.CheckArgs(model, ModelSchema(), "model");
  ExpandedModel net = ExpandModel(doc, model);
  c.layers = std::move(net.layers);
  c.input_shape = net.input_shape;
  if (c.input_shape.rank() < 2 || c.input_shape.rank() > 3) {
    doc.Fail(model["input"] ? model["input"] : model, "model.input",
             "expected [C, H, W] or [C, L]");
  }
  const std::string init = m.String("init");
  c.init = init == "xavier_uniform"   ? InitScheme::kXavierUniform
           : init == "kaiming_normal" ? InitScheme::kKaimingNormal
                                      : InitScheme::kPytorchDefault;
  c.label_smoothing = m.Float("label_smoothing");
}

// train.init: weights to start from. `path`: the config's file.
void ReadInit(const YamlDoc& doc, const YAML::Node& train, const std::string& path, RunConfig& c) {
  const YAML::Node init = Section(train, "init");
  Args a = doc.CheckArgs(init, InitSchema(), "train.init");
  c.init_from.weights = a.String("weights");
  // A relative path: from the working folder, else from the config's own
  // (an imported model's config names the weights beside it).
  if (const fs::path w(c.init_from.weights); !w.empty() && w.is_relative() && !fs::exists(w) &&
                                             fs::exists(fs::absolute(path).parent_path() / w)) {
    c.init_from.weights = (fs::absolute(path).parent_path() / w).lexically_normal().string();
  }
  c.init_from.strict = a.Bool("strict");
  c.init_from.skip = a.Strings("skip");
  if (c.init_from.weights.empty() && init.IsMap() && init.size() > 0) {
    doc.Fail(init, "train.init", "needs weights: FILE (.safetensors or .pth)");
  }
}

// train: epochs, batches, steps, checkpoints, the optimizer and schedule.
// Returns the section's arguments.
Args ReadTrain(const YamlDoc& doc, const std::string& path, RunConfig& c) {
  const YAML::Node train = doc.root()["train"];
  Args t = doc.CheckArgs(train, TrainSchema(), "train");
  c.epochs = t.Float("epochs");
  c.batch = t.Int("batch");
  c.eval_batch = t.Int("eval_batch");
  c.eval_every = t.Int("eval_every");
  if (c.eval_every < 1) doc.Fail(train["eval_every"], "train.eval_every", "must be >= 1");
  c.max_steps = t.Int("max_steps");
  c.eval_max_steps = t.Int("eval_max_steps");
  c.accumulate = t.Int("accumulate");
  c.checkpoint_every = t.Int("checkpoint_every");
  c.keep_checkpoints = t.Int("keep_checkpoints");
  c.log_every = t.Int("log_every");
  if (c.log_every < 0) doc.Fail(train["log_every"], "train.log_every", "must be >= 0");
  if (c.accumulate <= 0) doc.Fail(train["accumulate"], "train.accumulate", "must be > 0");
  if (c.checkpoint_every < 0) {
    doc.Fail(train["checkpoint_every"], "train.checkpoint_every", "must be >= 0");
  }
  if (!(c.epochs > 0 && c.epochs < 1e9)) {
    doc.Fail(train["epochs"], "train.epochs", "must be > 0");
  }
  if (c.batch <= 0) doc.Fail(train["batch"], "train.batch", "must be > 0");
  if (c.eval_batch <= 0) doc.Fail(train["eval_batch"], "train.eval_batch", "must be > 0");
  ReadInit(doc, train, path, c);
  ParseOptimizer(doc, train["optimizer"], c);
  ReadParamGroups(doc, train["param_groups"], c);
  // Every layer carries the run's freeze globs: each model instance (replica,
  // pipeline stage, tensor-parallel shard) freezes as it is built.
  c.freeze = t.Strings("freeze");
  for (LayerSpec& l : c.layers) {
    l.freeze = c.freeze;
    l.frozen_bn_eval = t.String("frozen_bn") == "eval";
  }
  c.schedule_args = doc.CheckArgs(Section(train, "schedule"), LrScheduleSchema(), "train.schedule");
  return t;
}

// graph.devices: CPUs, each once, or GPUs, each once or one GPU several
// times (a replica per listing, each in its own lane: ops/device.h).
void ReadDevices(const YamlDoc& doc, const YAML::Node& graph, const Args& g, RunConfig& c) {
  for (const auto& d : g.Strings("devices")) {
    try {
      c.devices.push_back(Device::Parse(d));
    } catch (const ConfigError& e) {
      doc.Fail(graph["devices"], "graph.devices", e.what());
    }
  }
  const bool one_gpu = OneGpuOnly(c.devices);
  for (size_t i = 0; i < c.devices.size(); ++i) {
    if (c.devices[i].is_cuda() != c.devices[0].is_cuda()) {
      doc.Fail(graph["devices"], "graph.devices", "list either CPUs or GPUs, not both");
    }
    for (size_t j = 0; j < i; ++j) {
      if (c.devices[j] == c.devices[i] && !one_gpu) {
        doc.Fail(graph["devices"], "graph.devices",
                 StrCat(c.devices[i].ToString(), " is listed twice",
                        c.devices[i].is_cuda()
                            ? " (a GPU listed more than once must be the only GPU listed)"
                            : ""));
      }
    }
  }
  if (c.devices.empty()) doc.Fail(graph["devices"], "graph.devices", "needs at least one device");
}

// graph.pipeline and graph.tensor_parallel, and what they do not combine with.
void ReadModelParallel(const YamlDoc& doc, const YAML::Node& graph, RunConfig& c) {
  auto given = [](const YAML::Node& n) {
    return n.IsDefined() && !n.IsNull() && !(n.IsMap() && n.size() == 0);
  };
  if (const YAML::Node pipe = graph["pipeline"]; given(pipe)) {
    ParsePipeline(doc, pipe, c);
    if (c.accumulate != 1) {
      doc.Fail(pipe, "graph.pipeline", "train.accumulate must be 1 with a pipeline");
    }
  }
  if (const YAML::Node tp = graph["tensor_parallel"]; given(tp)) {
    ParseTensorParallel(doc, tp, c);
    if (c.pipeline)
      doc.Fail(tp, "graph.tensor_parallel", "does not combine with graph.pipeline yet");
  }
}

// graph.logical_replicas: this process's share of the run's G replicas
// (ProcessLeaves: contiguous, 3 + 3 + 2), one replica per device of
// graph.devices in turn, and a thread each at least.
void ReadLogicalReplicas(const YamlDoc& doc, const YAML::Node& graph, const Args& g, RunConfig& c) {
  const int64_t G = g.Int("logical_replicas");
  if (G == 0) return;
  const YAML::Node at = graph["logical_replicas"];
  if (G < 0) doc.Fail(at, "graph.logical_replicas", "must be >= 1 (0: devices x processes)");
  const char* why = c.devices[0].is_cuda() ? "runs on CPU devices only so far"
                    : c.pipeline           ? "does not combine with graph.pipeline yet"
                    : c.data_parallel.tensor_parallel > 1
                        ? "does not combine with graph.tensor_parallel yet"
                        : nullptr;
  if (why != nullptr) doc.Fail(at, "graph.logical_replicas", why);
  const MpiWorld& world = MpiWorld::Get();
  if (G < world.size()) {
    doc.Fail(at, "graph.logical_replicas",
             StrCat(G, " replicas for ", world.size(), " processes: each needs one at least"));
  }
  const LeafRange mine = ProcessLeaves(world.rank(), world.size(), static_cast<int>(G));
  const std::vector<Device> listed = c.devices;
  c.devices.clear();
  for (int i = 0; i < mine.size(); ++i) c.devices.push_back(listed[i % listed.size()]);
  c.logical_replicas = static_cast<int>(G);
  c.logical_first = mine.begin;
  // Replicas wait for each other inside a step: each needs a thread.
  c.threads = std::max(c.threads, mine.size());
}

// graph.precision: fp32, mixed precision on GPUs, or bf16 products on CPUs
// with native bf16.
void ReadPrecision(const YamlDoc& doc, const YAML::Node& graph, const Args& g, RunConfig& c) {
  const std::string precision = g.String("precision");
  if (precision == "bf16" || precision == "fp16") {
    c.data_parallel.compute = precision == "bf16" ? DType::kBF16 : DType::kF16;
    if (c.devices[0].is_cuda()) {
      if (precision == "fp16" && c.pipeline) {
        doc.Fail(graph["precision"], "graph.precision",
                 "fp16 does not combine with graph.pipeline yet (its loss scaler is the "
                 "replicas'): use bf16");
      }
      if (c.data_parallel.tensor_parallel > 1) {
        doc.Fail(graph["precision"], "graph.precision",
                 StrCat(precision,
                        " does not combine with graph.tensor_parallel on GPUs yet (the "
                        "split layers compute in f32): use fp32"));
      }
      return;
    }
    if (precision == "fp16") {
      doc.Fail(graph["precision"], "graph.precision",
               "fp16 is mixed precision on GPUs; CPU devices take fp32 or bf16");
    }
    if (const std::string why = NoNativeBf16OnHost(); !why.empty()) {
      doc.Fail(graph["precision"], "graph.precision", StrCat("bf16 on CPU devices: ", why));
    }
    if (c.pipeline) {
      doc.Fail(graph["precision"], "graph.precision",
               "bf16 on CPU devices does not combine with graph.pipeline yet");
    }
  } else if (precision != "fp32") {
    doc.Fail(graph["precision"], "graph.precision",
             StrCat("'", precision, "': expected fp32, bf16 or fp16"));
  }
}

// graph.channels_last: the activations' layout on data-parallel replicas
// (ReadModel first: on GPUs every layer on 4-D activations must have a
// channels-last kernel).
void ReadMemoryFormat(const YamlDoc& doc, const YAML::Node& graph, const Args& g, RunConfig& c) {
  const std::string layout = g.String("channels_last");
  c.data_parallel.memory_format = layout == "true"    ? MemoryFormat::kChannelsLast
                                  : layout == "false" ? MemoryFormat::kNchw
                                                      : MemoryFormat::kAuto;
  if (c.data_parallel.memory_format != MemoryFormat::kChannelsLast) return;
  std::string why = c.pipeline ? "does not combine with graph.pipeline yet"
                    : c.data_parallel.tensor_parallel > 1
                        ? "does not combine with graph.tensor_parallel yet"
                        : "";
  if (why.empty() && c.devices[0].is_cuda()) {
    why = Model::GpuChannelsLastRefusal(c.layers, c.input_shape);
    if (!why.empty()) why += " (set graph.channels_last: false)";
  }
  if (!why.empty())
    doc.Fail(graph["channels_last"], "graph.channels_last",
             StrCat("true on ", c.devices[0].ToString(), ": ", why));
}

// data.device_resident: the training set held on the GPUs (stages/
// resident_data.h). On CPU devices the data is in host memory already: the
// key is accepted and does nothing, so one config runs on either by changing
// graph.devices alone (as graph.tf32 does); the trainer says so in a line.
void ReadDeviceResident(const Args& data, RunConfig& c) {
  c.device_resident = data.Bool("device_resident");
}

// graph: devices, the gradient reduction, model parallelism, precision, the
// activations' layout and the template. Returns the section's arguments.
Args ReadGraph(const YamlDoc& doc, const std::string& path, RunConfig& c) {
  const YAML::Node graph = Section(doc.root(), "graph");
  Args g = doc.CheckArgs(graph, GraphSectionSchema(), "graph");
  ReadDevices(doc, graph, g, c);
  c.data_parallel.bucket_mb = g.Float("bucket_mb");
  c.data_parallel.broadcast_buffers = g.Bool("broadcast_buffers");
  c.data_parallel.sync_bn = g.Bool("sync_bn");
  c.data_parallel.gpu_math.tf32 = g.Bool("tf32");
  c.data_parallel.gpu_math.deterministic = g.Bool("deterministic");
  c.data_parallel.flush_denormals = g.Bool("flush_denormals");
  c.pipeline_options.flush_denormals = c.data_parallel.flush_denormals;
  c.data_parallel.fuse_activations = g.Bool("fuse_activations");
  c.pipeline_options.fuse_activations = c.data_parallel.fuse_activations;
  c.data_parallel.cuda_graph = g.Bool("cuda_graph");
  c.data_parallel.timeout_s = g.Float("collective_timeout_s");
  if (c.data_parallel.bucket_mb <= 0)
    doc.Fail(graph["bucket_mb"], "graph.bucket_mb", "must be > 0");
  if (c.data_parallel.timeout_s <= 0) {
    doc.Fail(graph["collective_timeout_s"], "graph.collective_timeout_s", "must be > 0");
  }
  // Unset, never shorter than the collectives' own deadline.
  c.startup_timeout_s = graph["startup_timeout_s"].IsDefined()
                            ? g.Float("startup_timeout_s")
                            : std::max(kMinStartupTimeoutS, c.data_parallel.timeout_s);
  if (c.startup_timeout_s <= 0) {
    doc.Fail(graph["startup_timeout_s"], "graph.startup_timeout_s", "must be > 0");
  }
  c.stall_warn_s = g.Float("stall_warn_s");
  if (c.stall_warn_s < 0) doc.Fail(graph["stall_warn_s"], "graph.stall_warn_s", "must be >= 0");
  ReadModelParallel(doc, graph, c);
  ReadLogicalReplicas(doc, graph, g, c);
  ReadPrecision(doc, graph, g, c);
  ReadMemoryFormat(doc, graph, g, c);
  if (c.devices[0].is_cuda()) {  // a pipeline's GPU stages compute as replicas would
    c.pipeline_options.compute = c.data_parallel.compute;
    c.pipeline_options.gpu_math = c.data_parallel.gpu_math;
  }
  // A pipeline runs on its own template unless the config names one.
  const std::string tmpl_name = graph["template"].IsDefined() || !c.pipeline
                                    ? g.String("template")
                                    : std::string("graphs/pipeline_parallel.yaml");
  c.graph_template = ResolveProjectPath(tmpl_name, path);
  c.autotune = g.Bool("autotune");
  return g;
}

// The train and eval graphs from the template, which reads the run's values,
// defaults included (the sections' arguments `data`, `train`, `graph`), and
// graph.replicas (the data-parallel replicas: the devices, or their
// tensor-parallel groups).
void BuildGraphs(const YamlDoc& doc, const Args& data, const Args& train, const Args& graph,
                 RunConfig& c) {
  YAML::Node run = YAML::Clone(doc.root());
  for (const auto& [k, v] : graph.values()) {
    if (!run["graph"].IsMap()) run["graph"] = YAML::Node(YAML::NodeType::Map);
    if (!run["graph"][k].IsDefined()) run["graph"][k] = YAML::Load(ParamValueToString(v));
  }
  run["graph"]["replicas"] = std::max<int64_t>(
      1, static_cast<int64_t>(c.devices.size()) / c.data_parallel.tensor_parallel);
  if (!run["data"]["on_bad_record"].IsDefined()) {
    run["data"]["on_bad_record"] = data.String("on_bad_record");
  }
  for (const auto& [k, v] : train.values()) {
    if (!run["train"][k].IsDefined() && k != "schedule") {
      run["train"][k] = YAML::Load(ParamValueToString(v));
    }
  }
  // SyncBN's statistics take every replica's part of a batch: no short last one.
  run["train"]["drop_last"] = train.Bool("drop_last") || c.data_parallel.sync_bn;
  const YamlDoc tmpl = YamlDoc::Load(c.graph_template);
  c.train_graph = ParseGraph(tmpl, "train", run, doc);
  c.eval_graph = ParseGraph(tmpl, "eval", run, doc);
}

}  // namespace

Args ReadDataSection(const YamlDoc& doc, RunConfig& c) { return ReadData(doc, c); }

RunConfig LoadRunConfig(const std::string& path, const std::vector<std::string>& overrides) {
  RunConfig c;
  c.doc = YamlDoc::Load(path);
  for (const auto& o : overrides) c.doc.Override(o);
  c.overrides = overrides;
  const YamlDoc& doc = c.doc;
  const YAML::Node root = doc.root();

  Args top = doc.CheckArgs(root, TopLevelSchema(), "");
  c.name = top.String("name");
  c.seed = static_cast<uint64_t>(top.Int("seed"));
  c.threads = static_cast<int>(top.Int("threads"));
  if (c.threads < 0) doc.Fail(root["threads"], "threads", "must be >= 0");
  if (c.threads == 0) c.threads = static_cast<int>(std::thread::hardware_concurrency());

  const Args data = ReadData(doc, c);
  ReadModel(doc, c);
  const Args train = ReadTrain(doc, path, c);
  const Args graph = ReadGraph(doc, path, c);
  ReadDeviceResident(data, c);
  BuildGraphs(doc, data, train, graph, c);

  Args out = doc.CheckArgs(Section(root, "output"), OutputSchema(), "output");
  c.output_dir = out.String("dir");
  return c;
}

}  // namespace cnnflow
