// The `cnnflow._cnnflow` extension module (nanobind): cnnflow's loader
// (pipeline/batch_loader.h) and trainer (pipeline/trainer.h) for Python.
// Tensors cross by DLPack, never copied: a batch's memory is the pooled
// tensor the loader filled, held by the array's owner until Python lets it
// go. cnnflow/__init__.py wraps these classes with the documented API.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <thread>

#include "onnx/export.h"
#include "ops/io/safetensors.h"
#include "pipeline/batch_loader.h"
#include "pipeline/trainer.h"

namespace nb = nanobind;

namespace cnnflow {
namespace {

// A host tensor as an array object with __dlpack__ and the buffer protocol
// (nanobind's nb_ndarray); the array's owner holds the tensor's storage.
nb::object ToArray(const Tensor& t) {
  CNNFLOW_ENFORCE(t.device().is_cpu() && t.is_contiguous(), "a DLPack array needs a contiguous ",
                  "host tensor");
  auto* held = new Tensor(t);
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  std::vector<size_t> shape;
  for (int64_t d : t.shape().dims()) shape.push_back(static_cast<size_t>(d));
  nb::dlpack::dtype dtype;
  switch (t.dtype()) {
    case DType::kF32:
      dtype = nb::dtype<float>();
      break;
    case DType::kF64:
      dtype = nb::dtype<double>();
      break;
    case DType::kI64:
      dtype = nb::dtype<int64_t>();
      break;
    default:
      throw Error(StrCat("no DLPack export for ", DTypeName(t.dtype()), " tensors"));
  }
  return nb::cast(nb::ndarray<nb::array_api>(held->raw_data(), shape.size(), shape.data(), owner,
                                             nullptr, dtype));
}

nb::object LabelsArray(std::vector<int64_t> labels) {
  auto* held = new std::vector<int64_t>(std::move(labels));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<std::vector<int64_t>*>(p); });
  const size_t n = held->size();
  return nb::cast(nb::ndarray<nb::array_api, int64_t>(held->data(), 1, &n, owner));
}

// An array from Python (anything with __dlpack__ or the buffer protocol) as
// a host tensor of its dtype (a copy: the model keeps its own storage).
Tensor FromArray(const nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>& a,
                 const std::string& name) {
  std::vector<int64_t> dims;
  for (size_t i = 0; i < a.ndim(); ++i) dims.push_back(static_cast<int64_t>(a.shape(i)));
  DType dtype;
  if (a.dtype() == nb::dtype<float>()) {
    dtype = DType::kF32;
  } else if (a.dtype() == nb::dtype<double>()) {
    dtype = DType::kF64;
  } else if (a.dtype() == nb::dtype<int64_t>()) {
    dtype = DType::kI64;
  } else {
    throw ConfigError(StrCat("state_dict['", name, "']: dtype not float32, float64 or int64"));
  }
  Tensor t = Tensor::Empty(Shape(dims), dtype);
  std::memcpy(t.raw_data(), a.data(), t.nbytes());
  return t;
}

nb::dict PassDict(const PassMetrics& m) {
  nb::dict d;
  d["loss"] = m.mean_loss();
  d["accuracy"] = m.accuracy();
  d["samples"] = m.samples;
  d["batches"] = m.batches;
  d["skipped"] = m.skipped;
  d["seconds"] = m.seconds;
  d["images_per_s"] = m.samples_per_second();
  return d;
}

// ----- cnnflow.Loader ------------------------------------------------------

// A data set and its loader options, from a config or a spec. Unset
// options (negative, empty) take the config's values, else the defaults.
struct LoaderArgs {
  int64_t batch = -1;
  int shuffle = -1;  // -1: unset
  int64_t seed = -1;
  bool drop_last = false;
  int64_t threads = -1, prefetch = 4;
  int rank = 0, world = 1;
  std::string on_bad_record;
};

class PyLoader {
 public:
  PyLoader(const RunConfig& config, const std::string& name, const Args& data_args,
           const LoaderArgs& a, bool from_config) {
    if (name != "train" && name != "test") {
      throw ConfigError(StrCat("the data set is 'train' or 'test', got '", name, "'"));
    }
    if (a.batch == 0 || a.batch < -1) throw ConfigError(StrCat("batch must be > 0, got ", a.batch));
    SampleTransform transform;
    std::shared_ptr<Dataset> data = OpenDataSet(config, name, &transform);
    BatchLoaderOptions o;
    o.train = name == "train";
    o.batch = a.batch > 0   ? a.batch
              : from_config ? (o.train ? config.batch : config.eval_batch)
                            : 64;
    o.shuffle = a.shuffle >= 0 ? a.shuffle != 0 : o.train;
    o.seed = a.seed >= 0 ? static_cast<uint64_t>(a.seed) : config.seed;
    o.drop_last = a.drop_last;
    o.threads = a.threads != -1 ? a.threads
                : from_config   ? config.threads
                                : std::max<int64_t>(1, std::thread::hardware_concurrency());
    o.prefetch = a.prefetch;
    o.rank = a.rank;
    o.world = a.world;
    o.on_bad_record = a.on_bad_record.empty() ? data_args.String("on_bad_record") : a.on_bad_record;
    loader_ = std::make_unique<BatchLoader>(std::move(data), std::move(transform), o);
  }
  BatchLoader& loader() { return *loader_; }
  int64_t epoch = 0;                     // the next iteration's
  std::vector<std::string> bad_records;  // the last epoch's (on_bad_record: skip)

 private:
  std::unique_ptr<BatchLoader> loader_;
};

// One epoch being iterated. It holds no reference the loop does not: a
// loop that breaks drops it, and its destructor stops the loader's thread.
class PyEpoch {
 public:
  PyEpoch(PyLoader& loader, std::unique_ptr<BatchLoader::Epoch> e)
      : loader_(loader), epoch_(std::move(e)) {}
  ~PyEpoch() { Close(); }
  nb::object Next() {
    if (!epoch_) throw nb::stop_iteration();
    LoadedBatch b;
    bool got;
    {
      nb::gil_scoped_release unlocked;
      got = epoch_->Next(b);
    }
    if (!got) {
      Close();
      throw nb::stop_iteration();
    }
    return nb::make_tuple(ToArray(b.inputs), LabelsArray(std::move(b.labels)));
  }
  // Stops the epoch's thread (waiting without the GIL); what it skipped
  // stays with the loader.
  void Close() {
    if (!epoch_) return;
    loader_.bad_records = epoch_->bad_records();
    nb::gil_scoped_release unlocked;
    epoch_.reset();
  }

 private:
  PyLoader& loader_;  // kept alive by the binding (keep_alive)
  std::unique_ptr<BatchLoader::Epoch> epoch_;
};

PyLoader* LoaderFromConfig(const std::string& path, const std::string& name,
                           const std::vector<std::string>& overrides, const LoaderArgs& a) {
  const RunConfig config = LoadRunConfig(path, overrides);
  RunConfig scratch;  // the section's arguments (on_bad_record), read again
  const Args data_args = ReadDataSection(config.doc, scratch);
  return new PyLoader(config, name, data_args, a, /*from_config=*/true);
}

// `section`: {"data": {"train": spec, "transform": [...]}} as JSON (YAML's
// flow style), so messages name "data.train (lmdb)" as a config's do.
PyLoader* LoaderFromSpec(const std::string& section, const std::string& name, const LoaderArgs& a) {
  RunConfig config;
  config.doc = YamlDoc::Parse(section, "cnnflow.Loader(data)");
  const Args data_args = ReadDataSection(config.doc, config);
  return new PyLoader(config, name, data_args, a, /*from_config=*/false);
}

// ----- cnnflow.Run ---------------------------------------------------------

class PyRun {
 public:
  PyRun(const std::string& path, std::vector<std::string> overrides, bool verbose)
      : path_(path), overrides_(std::move(overrides)) {
    trainer_ = std::make_unique<Trainer>(LoadRunConfig(path_, overrides_));
    if (verbose) {
      progress_ = std::make_unique<Progress>(Progress::ForStderr());
      trainer_->set_progress(progress_.get());
    }
    trainer_->set_epoch_observer([this](const EpochReport& r) {
      std::lock_guard<std::mutex> lock(mu_);
      reports_.push_back({r, {}});
      cv_.notify_all();
    });
    // fit(every_steps=N): a report of this process's last N training batches
    // (the observer runs on the graph's serial metrics node, one batch at a
    // time, so the window needs no lock of its own).
    trainer_->set_batch_observer([this](const BatchMessage& m, const PassMetrics&) {
      if (every_steps_ <= 0 || m.dropped) return;
      const auto n = static_cast<int64_t>(m.labels.size());
      window_.loss_sum += m.loss * static_cast<double>(n);
      window_.correct += m.correct;
      window_.samples += n;
      if (++window_.batches < every_steps_) return;
      window_.epoch = m.epoch + 1;
      window_.step = m.global_step + 1;
      std::lock_guard<std::mutex> lock(mu_);
      reports_.push_back({std::nullopt, window_});
      window_ = {};
      cv_.notify_all();
    });
  }
  ~PyRun() { Join(); }

  // Starts Train in a thread of its own (fit's generator takes the reports);
  // every_steps > 0 adds a report every that many training batches.
  void Start(const std::string& run_dir, int64_t every_steps) {
    if (thread_.joinable()) throw Error("this Run is already training");
    if (every_steps < 0) throw Error(StrCat("fit: every_steps must be >= 0, got ", every_steps));
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = false;
      error_ = nullptr;
      reports_.clear();
    }
    every_steps_ = every_steps;
    window_ = {};
    trainer_->control().stop_requested = false;
    thread_ = std::thread([this, run_dir] {
      std::exception_ptr error;
      try {
        trainer_->Train(run_dir);
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      error_ = error;
      cv_.notify_all();
    });
  }

  // The next epoch's report, or None when training ended. Ctrl-C (Python's
  // SIGINT handler, checked every 0.1 s): the step in flight finishes, the
  // checkpoint is written, then KeyboardInterrupt is raised.
  nb::object NextEpoch() {
    for (;;) {
      {
        nb::gil_scoped_release unlocked;
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait_for(lock, std::chrono::milliseconds(100),
                     [&] { return !reports_.empty() || done_; });
      }
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!reports_.empty()) {
          const Report r = reports_.front();
          reports_.pop_front();
          lock.unlock();
          return r.epoch ? EpochDict(*r.epoch) : StepsDict(r.steps);
        }
        if (done_) {
          lock.unlock();
          Join();
          std::exception_ptr e = error_;
          error_ = nullptr;
          if (e) std::rethrow_exception(e);
          return nb::none();
        }
      }
      if (PyErr_CheckSignals() != 0) {  // KeyboardInterrupt is now pending
        Stop();
        throw nb::python_error();
      }
    }
  }

  // Asks Train to stop after the step in flight and waits for it (it writes
  // its checkpoint).
  void Stop() {
    if (!thread_.joinable()) return;
    trainer_->RequestStop();
    Join();
    trainer_->control().stop_requested = false;  // evaluate() and a next fit() run whole
  }

  void Join() {
    if (!thread_.joinable()) return;
    if (PyGILState_Check()) {
      nb::gil_scoped_release unlocked;
      thread_.join();
    } else {
      thread_.join();
    }
  }

  nb::dict Evaluate() {
    Idle("evaluate");
    PassMetrics m;
    {
      nb::gil_scoped_release unlocked;
      m = trainer_->Evaluate();
    }
    return PassDict(m);
  }

  // A copy of every tensor model.safetensors holds, under its names.
  nb::dict StateDict() {
    Idle("state_dict");
    nb::dict d;
    for (const auto& [name, t] : trainer_->Tensors().Exported())
      d[name.c_str()] = ToArray(t.To(Device::Cpu()));
    return d;
  }

  void LoadStateDict(const nb::dict& tensors, bool strict) {
    Idle("load_state_dict");
    std::vector<std::pair<std::string, Tensor>> file;
    for (const auto& [k, v] : tensors) {
      const std::string name = nb::cast<std::string>(k);
      file.emplace_back(
          name, FromArray(nb::cast<nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>>(v), name));
    }
    StateDictRules rules;
    rules.strict = strict;
    cnnflow::LoadStateDict(file, trainer_->Tensors().models, rules, "load_state_dict");
  }

  // The live model with its current weights as ONNX (onnx/export.h); an
  // error is a cnnflow.Error with the message.
  void ExportOnnx(const std::string& out) {
    Idle("export_onnx");
    ExportOptions options;
    options.name = trainer_->config().name;
    options.doc = StrCat("cnnflow config ", trainer_->config().name, " (", path_,
                         "), weights of cnnflow.Run at step ", trainer_->global_step());
    WriteOnnx(ExportModel(trainer_->model(), options), out);
  }

  const std::string& run_dir() const { return trainer_->run_dir(); }
  int64_t steps_per_epoch() const { return trainer_->steps_per_epoch(); }
  int64_t global_step() const { return trainer_->global_step(); }

 private:
  void Idle(const char* what) {
    if (thread_.joinable()) throw Error(StrCat(what, "() while fit() is training"));
  }
  // A window of training batches (fit(every_steps=N)).
  struct StepWindow {
    int64_t epoch = 0, step = 0;  // 1-based; step: the optimizer steps done
    int64_t batches = 0, correct = 0, samples = 0;
    double loss_sum = 0;
  };
  // An epoch's report, or (epoch unset) a window's.
  struct Report {
    std::optional<EpochReport> epoch;
    StepWindow steps;
  };

  static nb::dict StepsDict(const StepWindow& w) {
    nb::dict d;
    d["epoch"] = w.epoch;
    d["step"] = w.step;
    d["loss"] = w.samples ? w.loss_sum / static_cast<double>(w.samples) : 0.0;
    d["accuracy"] = w.samples ? static_cast<double>(w.correct) / w.samples : 0.0;
    d["samples"] = w.samples;
    return d;
  }

  static nb::dict EpochDict(const EpochReport& r) {
    nb::dict d;
    d["epoch"] = r.epoch;
    d["lr"] = r.lr;
    d["train_loss"] = r.train.mean_loss();
    d["train_accuracy"] = r.train.accuracy();
    d["train_images_per_s"] = r.train.samples_per_second();
    if (r.test.samples > 0) {
      d["test_loss"] = r.test.mean_loss();
      d["test_accuracy"] = r.test.accuracy();
    }
    return d;
  }

  std::string path_;
  std::vector<std::string> overrides_;
  std::unique_ptr<Progress> progress_;
  std::unique_ptr<Trainer> trainer_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Report> reports_;
  int64_t every_steps_ = 0;
  StepWindow window_;
  bool done_ = true;
  std::exception_ptr error_;
};

}  // namespace
}  // namespace cnnflow

NB_MODULE(_cnnflow, m) {
  using namespace cnnflow;
  // Objects still alive at exit (a loader at module level) are not bugs.
  nb::set_leak_warnings(false);
  static nb::exception<Error> error(m, "Error", PyExc_RuntimeError);
  static nb::exception<ConfigError> config_error(m, "ConfigError", error.ptr());
  static nb::exception<ShapeError> shape_error(m, "ShapeError", error.ptr());

  nb::class_<LoaderArgs>(m, "_LoaderArgs")
      .def(nb::init<>())
      .def_rw("batch", &LoaderArgs::batch)
      .def_rw("shuffle", &LoaderArgs::shuffle)
      .def_rw("seed", &LoaderArgs::seed)
      .def_rw("drop_last", &LoaderArgs::drop_last)
      .def_rw("threads", &LoaderArgs::threads)
      .def_rw("prefetch", &LoaderArgs::prefetch)
      .def_rw("rank", &LoaderArgs::rank)
      .def_rw("world", &LoaderArgs::world)
      .def_rw("on_bad_record", &LoaderArgs::on_bad_record);

  nb::class_<PyEpoch>(m, "_Epoch", nb::is_weak_referenceable())
      .def("__next__", &PyEpoch::Next)
      .def("__iter__", [](nb::handle self) { return self; })
      .def("close", &PyEpoch::Close);

  nb::class_<PyLoader>(m, "_Loader")
      .def_static("from_config", &LoaderFromConfig, nb::rv_policy::take_ownership)
      .def_static("from_spec", &LoaderFromSpec, nb::rv_policy::take_ownership)
      .def("__len__", [](PyLoader& l) { return l.loader().size(); })
      .def_rw("epoch", &PyLoader::epoch)
      .def_ro("bad_records", &PyLoader::bad_records)
      .def(
          "start",
          [](PyLoader& l, int64_t epoch) { return new PyEpoch(l, l.loader().Start(epoch)); },
          nb::keep_alive<0, 1>(), nb::rv_policy::take_ownership)
      .def_prop_ro("batch", [](PyLoader& l) { return l.loader().options().batch; })
      .def_prop_ro("threads", [](PyLoader& l) { return l.loader().options().threads; })
      .def_prop_ro("seed", [](PyLoader& l) { return l.loader().options().seed; })
      .def_prop_ro("shuffle", [](PyLoader& l) { return l.loader().options().shuffle; })
      .def_prop_ro("sample_shape",
                   [](PyLoader& l) { return l.loader().data().sample_shape().dims(); })
      .def_prop_ro("num_samples", [](PyLoader& l) { return l.loader().data().size(); })
      .def_prop_ro("num_classes", [](PyLoader& l) { return l.loader().data().num_classes(); });

  nb::class_<PyRun>(m, "_Run", nb::is_weak_referenceable())
      .def(nb::init<const std::string&, std::vector<std::string>, bool>())
      .def("start", &PyRun::Start)
      .def("next_epoch", &PyRun::NextEpoch)
      .def("stop", &PyRun::Stop)
      .def("evaluate", &PyRun::Evaluate)
      .def("state_dict", &PyRun::StateDict)
      .def("load_state_dict", &PyRun::LoadStateDict)
      .def("export_onnx", &PyRun::ExportOnnx)
      .def_prop_ro("run_dir", &PyRun::run_dir)
      .def_prop_ro("steps_per_epoch", &PyRun::steps_per_epoch)
      .def_prop_ro("global_step", &PyRun::global_step);
}
