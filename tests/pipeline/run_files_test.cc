// The run folder's logs (pipeline/run_files.h): what a fresh run writes,
// epoch rows with and without a test set, the train/* window across a
// checkpoint, and what a resume keeps and drops.
#include "pipeline/run_files.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;
using testing::ReadBytes;
using testing::TestDir;

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

PassMetrics Pass(double mean_loss, int64_t correct, int64_t samples, double seconds) {
  PassMetrics m;
  m.loss_sum = mean_loss * static_cast<double>(samples);
  m.correct = correct;
  m.samples = samples;
  m.batches = 1;
  m.seconds = seconds;
  return m;
}

TEST(RunFiles, FreshRunWritesConfigAndHeaders) {
  const std::string dir = TestDir() + "/run";
  { RunFiles files(dir, "name: x\n", /*autotune=*/true, std::nullopt, {}, ""); }
  EXPECT_EQ(ReadBytes(dir + "/config.yaml"), "name: x\n");
  EXPECT_EQ(Lines(ReadBytes(dir + "/metrics.csv")),
            std::vector<std::string>{"epoch,train_loss,train_accuracy,test_loss,test_accuracy,"
                                     "images_per_s,seconds,lr,skipped_records"});
  EXPECT_EQ(Lines(ReadBytes(dir + "/steps.csv")).size(), 1u);
  EXPECT_EQ(Lines(ReadBytes(dir + "/autotune.csv")).size(), 1u);
  bool events = false;
  for (const auto& e : fs::directory_iterator(dir)) {
    events |= e.path().filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  EXPECT_TRUE(events);
}

TEST(RunFiles, NoAutotuneFileWithoutAutotune) {
  const std::string dir = TestDir();
  { RunFiles files(dir, "", false, std::nullopt, {}, ""); }
  EXPECT_FALSE(fs::exists(dir + "/autotune.csv"));
}

TEST(RunFiles, EpochRowsWithAndWithoutTestSet) {
  const std::string dir = TestDir();
  RunFiles files(dir, "", false, std::nullopt, {}, "");
  EpochRecord r;
  r.epoch = 1;
  r.global_step = 10;
  r.train = Pass(0.5, 30, 40, 2.0);
  r.train.skipped = 2;
  r.test = Pass(0.25, 9, 10, 1.0);
  r.test->skipped = 1;
  r.lr = 0.1;
  files.Epoch(r);
  r.epoch = 2;
  r.global_step = 20;
  r.test.reset();
  files.Epoch(r);
  const auto metrics = Lines(ReadBytes(dir + "/metrics.csv"));
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_EQ(metrics[1], "1,0.500000,0.750000,0.250000,0.900000,20.0,2.000,0.1,3");
  // No test set: empty fields, not a loss and accuracy of 0.
  EXPECT_EQ(metrics[2], "2,0.500000,0.750000,,,20.0,2.000,0.1,2");
  // The test figures also go to steps.csv, at the epoch's last step; an
  // epoch without a test set adds no row.
  const auto steps = Lines(ReadBytes(dir + "/steps.csv"));
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[1], "10,1,,,0.25,0.9,,,,");
  ASSERT_EQ(files.metrics_rows().size(), 2u);
}

TEST(RunFiles, StepScalarsAverageTheWindow) {
  const std::string dir = TestDir();
  RunFiles files(dir, "", false, std::nullopt, {}, "");
  files.StartEpoch(/*busy=*/-1, 0);
  files.StartSegment();
  files.AddBatch(1.0, 3, 4);
  files.AddBatch(2.0, 1, 4);
  files.StepScalars(2, 1, 0.05, -1, 0, /*segment_seconds=*/0.5);
  files.AddBatch(4.0, 2, 2);
  files.StepScalars(3, 1, 0.05, -1, 0, 1.0);
  const auto steps = Lines(ReadBytes(dir + "/steps.csv"));
  ASSERT_EQ(steps.size(), 3u);
  // Step 2: loss (1*4 + 2*4) / 8, accuracy 4/8, 8 samples in 0.5 s.
  EXPECT_EQ(steps[1], "2,1,1.5,0.5,,,0.05,16,,");
  // Step 3: only the batch since step 2: 2 samples in 0.5 s.
  EXPECT_EQ(steps[2], "3,1,4,1,,,0.05,4,,");
}

TEST(RunFiles, MeasuredSharesFromReplicaCounters) {
  const std::string dir = TestDir();
  RunFiles files(dir, "", false, std::nullopt, {}, "");
  files.StartEpoch(/*busy=*/10.0, /*reduce_wait=*/1.0);
  files.StartSegment();
  files.AddBatch(1.0, 1, 2);
  // 2 s of wall time, 1.5 s busy: a quarter waiting for data; 0.5 s of it
  // waiting for the reduction.
  files.StepScalars(1, 1, 0.1, 11.5, 1.5, 2.0);
  EXPECT_EQ(Lines(ReadBytes(dir + "/steps.csv"))[1], "1,1,1,0.5,,,0.1,1,0.25,0.25");
}

// A checkpoint in the middle of a window: the resumed run goes on with the
// window's sums, so the next scalars are the same as without the stop.
TEST(RunFiles, WindowSurvivesResume) {
  const std::string a = TestDir() + "/a";
  std::string window;
  {
    RunFiles files(a, "", false, std::nullopt, {}, "");
    files.StartEpoch(-1, 0);
    files.StartSegment();
    files.AddBatch(1.0, 1, 2);
    files.StepScalars(1, 1, 0.1, -1, 0, 1.0);
    files.AddBatch(3.0, 2, 2);  // step 2, then a checkpoint
    window = files.WindowState();
    files.EndSegment(2.0);
    files.AddBatch(5.0, 0, 2);  // step 3, lost with the process
    files.StepScalars(3, 1, 0.1, -1, 0, 3.0);
  }
  RunFiles resumed(a, "", false, /*resumed_step=*/2, {}, window);
  // steps.csv keeps the rows up to step 2; the step-3 row goes, to be
  // written again.
  auto steps = Lines(ReadBytes(a + "/steps.csv"));
  ASSERT_EQ(steps.size(), 2u);
  EXPECT_EQ(steps[1].substr(0, 2), "1,");
  resumed.StartEpoch(-1, 0);  // the same epoch: the restored window goes on
  resumed.StartSegment();
  resumed.AddBatch(5.0, 0, 2);
  resumed.StepScalars(3, 1, 0.1, -1, 0, 1.0);
  steps = Lines(ReadBytes(a + "/steps.csv"));
  ASSERT_EQ(steps.size(), 3u);
  // Batches of steps 2 and 3: loss (3*2 + 5*2) / 4, accuracy 2/4.
  EXPECT_EQ(steps[2], "3,1,4,0.5,,,0.1,4,,");
  // A later epoch starts a fresh window.
  resumed.StartEpoch(-1, 0);
  resumed.StartSegment();
  resumed.AddBatch(1.0, 1, 1);
  resumed.StepScalars(4, 2, 0.1, -1, 0, 1.0);
  EXPECT_EQ(Lines(ReadBytes(a + "/steps.csv"))[3], "4,2,1,1,,,0.1,1,,");
}

TEST(RunFiles, ResumeRewritesMetricsFromCheckpointRows) {
  const std::string dir = TestDir();
  {
    RunFiles files(dir, "first\n", false, std::nullopt, {}, "");
    EpochRecord r;
    r.train = Pass(1.0, 1, 2, 1.0);
    for (int e = 1; e <= 3; ++e) {
      r.epoch = e;
      files.Epoch(r);
    }
  }
  // The checkpoint was taken after epoch 1: the rows of epochs 2 and 3 go.
  const std::vector<double> row = {1, 1.0, 0.5, -1, -1, 2.0, 1.0, 0, 0};
  RunFiles resumed(dir, "second\n", false, /*resumed_step=*/1, {row}, "");
  const auto metrics = Lines(ReadBytes(dir + "/metrics.csv"));
  ASSERT_EQ(metrics.size(), 2u);
  EXPECT_EQ(metrics[1], "1,1.000000,0.500000,,,2.0,1.000,0,0");
  EXPECT_EQ(ReadBytes(dir + "/config.yaml"), "first\n");  // a resume keeps the run's config
}

TEST(RunFiles, UnwritableFolderNamesIt) {
  const std::string file = TestDir() + "/not_a_dir";
  testing::WriteBytes(file, "x");
  testing::ExpectContains(testing::ErrorOf<std::exception>([&] {
                            RunFiles files(file + "/run", "", false, std::nullopt, {}, "");
                          }),
                          {"not_a_dir"});
}

}  // namespace
}  // namespace cnnflow
