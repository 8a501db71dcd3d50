// The load_batch stage: batches in the sampler's order (or any order when
// unordered), decode concurrency bounded by its threads and moved by its
// knob while running, and bad records failing the run or skipped, from a
// device-resident set too (whose one decode found them).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "loaders/source_registry.h"
#include "pipeline/executor.h"
#include "stages/resident_data.h"
#include "stages/stage.h"
#include "tests/testing/helpers.h"
#include "tests/testing/stage_test_util.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

using testing::g_seen;
using testing::Graph;
using testing::JitterDataset;
using LoadBatchTest = testing::StageGraphTest;

TEST_F(LoadBatchTest, OrderedLoadDeliversBatchesInSamplerOrder) {
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 5}
    prefetch: {stage: prefetch, depth: 8}
    load: {stage: load_batch, threads: 4}
    record: {stage: test_record}
  edges: [sample -> prefetch -> load -> record]
)"),
           run, *pass);
  ASSERT_EQ(g_seen.size(), 40u);
  for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(g_seen[i], i);
}

TEST_F(LoadBatchTest, UnorderedLoadStillDeliversEveryBatchOnce) {
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 5}
    prefetch: {stage: prefetch, depth: 8}
    load: {stage: load_batch, threads: 4, ordered: false}
    record: {stage: test_record}
  edges: [sample -> prefetch -> load -> record]
)"),
           run, *pass);
  std::vector<int64_t> sorted = g_seen;
  std::sort(sorted.begin(), sorted.end());
  ASSERT_EQ(sorted.size(), 40u);
  for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(sorted[i], i);
}

TEST_F(LoadBatchTest, DecodeConcurrencyIsBoundedByLoadThreads) {
  auto data = std::make_shared<JitterDataset>(200);
  run.datasets["train"] = data;
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 8}
    prefetch: {stage: prefetch, depth: 8}
    load: {stage: load_batch, threads: 2, slice: 2}
    record: {stage: test_record}
  edges: [sample -> prefetch -> load -> record]
)"),
           run, *pass);
  EXPECT_EQ(g_seen.size(), 25u);
  EXPECT_EQ(data->max_reading_.load(), 2) << "4 TBB threads, 2 decode tasks at most";
}

TEST_F(LoadBatchTest, KnobsMoveDecodeConcurrencyWhileRunning) {
  // Batch 10 lowers load.threads from 4 to 1, then (second run) raises it
  // from 1 to 4; reads of later batches see the new bound.
  for (const auto& [from, to] : {std::pair<int64_t, int64_t>{4, 1}, {1, 4}}) {
    auto data = std::make_shared<JitterDataset>(400);
    data->watch_from_ = 200;  // batch 20 on: long after the move
    run.datasets["train"] = data;
    pass = std::make_unique<PassState>();
    pass->on_batch = [&, to = to](const BatchMessage& m, PassState&) {
      if (m.index != 10) return;
      for (TunableKnob& k : pass->knobs)
        if (k.name == "load.threads") {
          EXPECT_EQ(k.set(to), to);
        }
    };
    run.threads = 4;
    RunGraph(Graph(StrCat(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 10, shuffle: false}
    prefetch: {stage: prefetch, depth: 4}
    load: {stage: load_batch, threads: )",
                          from, R"(, slice: 1}
    metrics: {stage: metrics}
  edges: [sample -> prefetch -> load -> metrics]
)")),
             run, *pass);
    EXPECT_EQ(pass->metrics.samples, 400);
    if (to == 1) {
      EXPECT_EQ(data->max_reading_.load(), 1);
    } else {
      EXPECT_GE(data->max_reading_.load(), 2);
    }
  }
}

TEST_F(LoadBatchTest, BadRecordFailsTheRunNamingItsKey) {
  auto data = std::make_shared<JitterDataset>(200);
  data->bad_every_ = 50;  // records 3, 53, 103, 153
  run.datasets["train"] = data;
  const GraphSpec spec = Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 5, shuffle: false}
    load: {stage: load_batch}
    record: {stage: test_record}
  edges: [sample -> load -> record]
)");
  testing::ExpectContains(testing::ErrorOf<StageError>([&] { RunGraph(spec, run, *pass); }),
                          {"node 'load' (load_batch): bad record k3 (sample 3): corrupt record "
                           "(on_bad_record: fail)"});
}

TEST_F(LoadBatchTest, BadRecordsAreSkippedCountedAndNamed) {
  auto data = std::make_shared<JitterDataset>(200);
  data->bad_every_ = 50;
  run.datasets["train"] = data;
  int64_t samples = 0;
  pass->on_batch = [&](const BatchMessage& m, PassState&) {
    samples += static_cast<int64_t>(m.labels.size());
    // The kept samples moved up with their labels: a sample's pixels hold
    // its index, its label is index % 10, and no bad index is left.
    ASSERT_EQ(m.inputs.dim(0), static_cast<int64_t>(m.labels.size()));
    for (size_t i = 0; i < m.labels.size(); ++i) {
      const auto index = static_cast<int64_t>(m.inputs.At(static_cast<int64_t>(i) * 4));
      EXPECT_EQ(index % 10, m.labels[i]);
      EXPECT_NE(index % 50, 3);
    }
  };
  RunGraph(Graph(R"(
train:
  nodes:
    sample: {stage: sampler, batch: 5, shuffle: false}
    prefetch: {stage: prefetch, depth: 4}
    load: {stage: load_batch, threads: 2, on_bad_record: skip}
    metrics: {stage: metrics}
  edges: [sample -> prefetch -> load -> metrics]
)"),
           run, *pass);
  EXPECT_EQ(samples, 196);
  EXPECT_EQ(pass->metrics.samples, 196);
  std::vector<std::string> bad = pass->bad_records;
  std::sort(bad.begin(), bad.end());
  EXPECT_EQ(bad, (std::vector<std::string>{
                     "k103 (sample 103): corrupt record", "k153 (sample 153): corrupt record",
                     "k3 (sample 3): corrupt record", "k53 (sample 53): corrupt record"}));
}

// data.device_resident: the set's one decode notes a corrupt JPEG instead of
// failing the run; load_batch, which then reads labels only, applies
// on_bad_record to it when it is drawn, as to a record it reads itself:
// skip drops it (and names it), fail stops the run naming it.
TEST_F(LoadBatchTest, AResidentSetsBadRecordFollowsOnBadRecord) {
  namespace fs = std::filesystem;
  const char* src = std::getenv("CNNFLOW_SOURCE_DIR");
  const fs::path dir = testing::TestDir();
  fs::copy(fs::path(src ? src : ".") / "tests/data/cifar10-jpeg-sample", dir / "set",
           fs::copy_options::recursive);
  std::ofstream(dir / "set" / "bird" / "0000.jpg", std::ios::trunc) << "not a JPEG";
  Args a;
  a.Set("path", (dir / "set").string());
  a.Set("shape", std::vector<int64_t>{3, 32, 32});
  a.Set("hflip", std::string("alternate"));
  const SourceType* folder = SourceRegistry::Get().Find("folder");
  a.FillDefaults(folder->schema);
  const std::shared_ptr<Dataset> data = folder->open(a);
  const ResidentData::Made made = ResidentData::Make("train", *data, true, {}, 2);
  ASSERT_NE(made.data, nullptr) << made.why_not;
  int64_t bad = -1;
  for (int64_t i = 0; i < data->size(); ++i) {
    if (!made.data->BadRecord(i).empty()) {
      EXPECT_EQ(bad, -1) << "one bad record only";
      bad = i;
    }
  }
  ASSERT_GE(bad, 0);
  EXPECT_NE(data->Key(bad).find("bird"), std::string::npos) << data->Key(bad);
  run.datasets["train"] = data;
  run.resident = made.data;
  pass->pass = "train";
  const std::string graph = R"(
train:
  nodes:
    sample: {stage: sampler, batch: 8, shuffle: false}
    load: {stage: load_batch, threads: 2, on_bad_record: ON_BAD}
    metrics: {stage: metrics}
  edges: [sample -> load -> metrics]
)";
  auto with = [&](const std::string& policy) {
    std::string g = graph;
    g.replace(g.find("ON_BAD"), 6, policy);
    return Graph(g);
  };
  int64_t samples = 0;
  pass->on_batch = [&](const BatchMessage& m, PassState&) {
    EXPECT_TRUE(m.rows_on_device);
    ASSERT_EQ(m.sample_ids.size(), m.labels.size());
    for (size_t i = 0; i < m.labels.size(); ++i) {
      EXPECT_NE(m.sample_ids[i], bad);
      EXPECT_EQ(m.labels[i], made.data->label(m.sample_ids[i]));
    }
    samples += static_cast<int64_t>(m.labels.size());
  };
  RunGraph(with("skip"), run, *pass);
  EXPECT_EQ(samples, data->size() - 1);
  ASSERT_EQ(pass->bad_records.size(), 1u);
  EXPECT_NE(pass->bad_records[0].find(data->Key(bad)), std::string::npos) << pass->bad_records[0];

  pass = std::make_unique<PassState>();
  pass->pass = "train";
  testing::ExpectContains(testing::ErrorOf<StageError>([&] { RunGraph(with("fail"), run, *pass); }),
                          {"bad record", data->Key(bad), "(on_bad_record: fail)"});
  fs::remove_all(dir);
}

}  // namespace
}  // namespace cnnflow
