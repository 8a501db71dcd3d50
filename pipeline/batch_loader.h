// The loader graph alone behind an iterator: sampler -> prefetch ->
// load_batch -> metrics, the stages `cnnflow train` feeds its model with,
// run in a thread of its own for one epoch while the caller takes the
// batches (cnnflow.Loader in python/ is this). Its batches are the train
// graph's for the same data set, seed, epoch and batch, whatever the
// thread count: the sampler's order is seeded by (seed, epoch) and each
// sample's augmentation by (seed, epoch, index).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "loaders/dataset.h"
#include "loaders/transform.h"
#include "ops/tensor.h"
#include "pipeline/run_config.h"

namespace cnnflow {

struct RunContext;
struct PassState;
struct RunControl;

// Data set `name` of a config ("train", "test"), opened as the trainer
// opens it: normalising as it writes each sample when it can (else
// `transform` does it after the read).
std::shared_ptr<Dataset> OpenDataSet(const RunConfig& config, const std::string& name,
                                     SampleTransform* transform);

struct BatchLoaderOptions {
  int64_t batch = 64;
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;
  int64_t threads = 1;   // slices decoded at once (load_batch's threads)
  int64_t prefetch = 4;  // batches being loaded ahead, and as many ready
  int rank = 0, world = 1;
  std::string on_bad_record = "fail";  // or "skip"
  // A training pass: augmentation on, each rank's shard padded as
  // DistributedSampler's; else every sample once, as evaluation reads them.
  bool train = true;
};

// One batch as it left the graph: [N, ...] f32 (pooled storage, held as
// long as this handle is) and N labels.
struct LoadedBatch {
  Tensor inputs;
  std::vector<int64_t> labels;
  int64_t index = 0;  // in the epoch
};

class BatchLoader {
 public:
  // Checks the options (ConfigError names the one that is wrong).
  BatchLoader(std::shared_ptr<const Dataset> data, SampleTransform transform,
              BatchLoaderOptions options);
  ~BatchLoader();

  // Batches per epoch on this rank.
  int64_t size() const { return batches_; }
  const Dataset& data() const { return *data_; }
  const BatchLoaderOptions& options() const { return options_; }

  // One epoch's batches, loaded by a thread of its own while the caller
  // takes them; ending it early (destroying it, or Close) stops the sampler,
  // lets what is in flight drain and joins the thread.
  class Epoch {
   public:
    ~Epoch();
    // Waits for the next batch; false at the end of the epoch. Rethrows the
    // graph's error (the node's name and cnnflow's message).
    bool Next(LoadedBatch& out);
    void Close();
    // Records skipped so far (on_bad_record: skip), "key (sample i): error".
    std::vector<std::string> bad_records() const;

   private:
    friend class BatchLoader;
    Epoch() = default;
    void Put(LoadedBatch b);  // from the graph's sink: waits while `prefetch` are ready

    std::unique_ptr<RunControl> control_;
    std::unique_ptr<RunContext> run_;
    std::unique_ptr<PassState> pass_;
    size_t capacity_ = 1;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<LoadedBatch> ready_;
    bool done_ = false, closed_ = false;
    std::exception_ptr error_;
    std::thread thread_;
  };
  std::unique_ptr<Epoch> Start(int64_t epoch) const;

 private:
  std::shared_ptr<const Dataset> data_;
  SampleTransform transform_;
  BatchLoaderOptions options_;
  int64_t batches_ = 0;
  std::shared_ptr<void> arena_;  // a tbb::task_arena of threads + 1 slots
};

}  // namespace cnnflow
