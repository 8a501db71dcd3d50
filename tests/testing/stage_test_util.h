// Helpers for tests that run a stage in a small flow graph: a data set whose
// reads take a random time (so concurrent loads finish out of order), two
// test-only stages (test_record keeps the batch indices it sees,
// test_capture every batch), a graph from YAML text and a fixture with a
// run over the jittery data set.
#pragma once

#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "loaders/dataset.h"
#include "pipeline/executor.h"
#include "pipeline/graph_spec.h"
#include "stages/message.h"
#include "stages/pass_state.h"
#include "stages/run_context.h"

namespace cnnflow::testing {

// A data set whose reads take a random few hundred microseconds, so batches
// loaded concurrently finish out of order. Sample `index` holds 4 copies of
// its index, its label is index % 10 and its key "k<index>".
class JitterDataset : public Dataset {
 public:
  explicit JitterDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  Shape sample_shape() const override { return {1, 2, 2}; }
  int num_classes() const override { return 10; }
  ReadResult Read(int64_t index, const ReadContext&, float* dst) const override;
  std::string Key(int64_t index) const override;
  int64_t bad_every_ = 0;  // every record with index % bad_every_ == 3 is bad
  // Reads running at once, and the most seen by reads of index >= watch_from_.
  mutable std::atomic<int64_t> reading_{0}, max_reading_{0};
  int64_t watch_from_ = 0;
  std::string description() const override { return "jitter"; }

 private:
  int64_t n_;
};

// What the test stages saw, guarded by g_mu: test_record appends each batch
// index to g_seen, test_capture a copy of each batch to g_captured.
extern std::mutex g_mu;
extern std::vector<int64_t> g_seen;
extern std::vector<BatchMessage> g_captured;

// The graph 'train' of a graph file's text (named test_graph.yaml in errors).
GraphSpec Graph(const std::string& text);

// A run over JitterDataset(200) as "train", four TBB threads, and a
// training pass to run graphs as.
struct StageGraphTest : ::testing::Test {
  void SetUp() override {
    run.datasets["train"] = std::make_shared<JitterDataset>(200);
    g_seen.clear();
  }
  RunControl control;
  RunContext run{.control = &control};
  std::unique_ptr<PassState> pass = std::make_unique<PassState>();
  tbb::global_control threads{tbb::global_control::max_allowed_parallelism, 4};
};

}  // namespace cnnflow::testing
