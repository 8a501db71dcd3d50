// ops/trace.h: nothing recorded when off, spans from many threads, proper
// nesting, the Chrome trace JSON, the summary's ranking, the step window and
// lanes of spans timed elsewhere (GPU).
#include "ops/trace.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ops/error.h"
#include "ops/io/json.h"
#include "ops/model.h"
#include "tests/ops/gpu_check.h"
#include "tests/ops/run_threads.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

TEST(Trace, OffRecordsNothingAndBuildsNoName) {
  Tracer::Start();
  Tracer::Stop();
  int built = 0;
  for (int i = 0; i < 10; ++i) {
    const TraceSpan a("forward", "literal");
    const TraceSpan b("backward", [&] {
      ++built;
      return std::string("lazy");
    });
  }
  EXPECT_FALSE(Tracer::on());
  EXPECT_EQ(built, 0);
  EXPECT_TRUE(Tracer::Spans().empty());
}

TEST(Trace, SpansFromSeveralThreadsAllLand) {
  constexpr int kThreads = 4, kSpans = 700;  // more than one buffer chunk per thread
  Tracer::Start();
  const auto errors = testing::RunRanks(kThreads, [](int r) {
    for (int i = 0; i < kSpans; ++i) {
      const TraceSpan span(r % 2 ? "odd" : "even", [r, i] { return StrCat("t", r, " #", i); });
    }
  });
  Tracer::Stop();
  for (const auto& e : errors) EXPECT_FALSE(e);
  const std::vector<TraceEvent> spans = Tracer::Spans();
  ASSERT_EQ(spans.size(), static_cast<size_t>(kThreads * kSpans));
  std::map<int, std::set<int>> tids;  // rank -> threads it recorded on
  std::set<std::string> names;
  for (const TraceEvent& e : spans) {
    const int r = e.name[1] - '0';
    EXPECT_EQ(e.category, r % 2 ? "odd" : "even") << e.name;
    EXPECT_GE(e.duration_us, 0);
    tids[r].insert(e.thread);
    names.insert(e.name);
  }
  EXPECT_EQ(names.size(), spans.size());
  std::set<int> all;
  for (const auto& [r, t] : tids) {
    EXPECT_EQ(t.size(), 1u) << "rank " << r;
    all.insert(*t.begin());
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads));
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].begin_us, spans[i].begin_us);
}

TEST(Trace, NestedSpansLieInsideTheirParent) {
  Tracer::Start();
  {
    const TraceSpan parent("step", "parent");
    SleepMs(2);
    {
      const TraceSpan child("forward", "child");
      SleepMs(3);
    }
    SleepMs(2);
  }
  Tracer::Stop();
  const auto spans = Tracer::Spans();
  ASSERT_EQ(spans.size(), 2u);
  const TraceEvent& p = spans[0];
  const TraceEvent& c = spans[1];
  EXPECT_EQ(p.name, "parent");
  EXPECT_EQ(c.name, "child");
  EXPECT_EQ(p.thread, c.thread);
  EXPECT_GE(c.begin_us, p.begin_us + 1500);
  EXPECT_LE(c.end_us(), p.end_us() - 1500);
  EXPECT_GE(c.duration_us, 2500);
  EXPECT_GE(Tracer::WallSeconds(), p.duration_us * 1e-6);
}

TEST(Trace, ChromeTraceParsesWithTheFields) {
  const std::string dir = testing::TestDir();
  Tracer::Start();
  const auto errors = testing::RunRanks(2, [](int r) {
    const TraceSpan outer("load", "decode \"slice\"");  // a quote to escape
    const TraceSpan inner("forward", [r] { return StrCat("conv", r, " (conv2d)"); });
  });
  Tracer::Stop();
  const std::string path = dir + "/trace.json";
  Tracer::WriteChromeTrace(path, 3);
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
  }
  const Json doc = ParseJson(testing::ReadBytes(path));
  const Json& events = doc.At("traceEvents");
  ASSERT_TRUE(events.is_array());
  int complete = 0, metadata = 0;
  std::set<std::string> names;
  for (const Json& e : events.items()) {
    EXPECT_EQ(e.At("pid").AsInt64(), 3);
    EXPECT_GE(e.At("tid").AsInt64(), 1);
    if (e.At("ph").AsString() == "M") {
      ++metadata;
      EXPECT_EQ(e.At("name").AsString(), "thread_name");
      EXPECT_FALSE(e.At("args").At("name").AsString().empty());
      continue;
    }
    ++complete;
    EXPECT_EQ(e.At("ph").AsString(), "X");
    names.insert(e.At("name").AsString() + " / " + e.At("cat").AsString());
    EXPECT_GE(e.At("ts").AsDouble(), 0);
    EXPECT_GE(e.At("dur").AsDouble(), 0);
  }
  EXPECT_EQ(complete, 4);
  EXPECT_EQ(metadata, 2);
  EXPECT_EQ(names, (std::set<std::string>{"decode \"slice\" / load", "conv0 (conv2d) / forward",
                                          "conv1 (conv2d) / forward"}));
  EXPECT_THROW(Tracer::WriteChromeTrace(dir + "/no/such/dir/trace.json"), Error);
}

TEST(Trace, SummaryRanksTheLongestSpanFirst) {
  Tracer::Start();
  for (int i = 0; i < 3; ++i) {
    const TraceSpan s("optimizer", "short one");
    SleepMs(1);
  }
  {
    const TraceSpan s("backward", "long one");
    SleepMs(20);
  }
  Tracer::Stop();
  const std::string summary = Tracer::Summary();
  const size_t long_at = summary.find("long one"), short_at = summary.find("short one");
  ASSERT_NE(long_at, std::string::npos) << summary;
  ASSERT_NE(short_at, std::string::npos) << summary;
  EXPECT_LT(long_at, short_at) << summary;
  EXPECT_LT(summary.find("backward"), summary.find("optimizer")) << summary;
  EXPECT_NE(summary.find("trace: 4 spans on 1 threads"), std::string::npos) << summary;
}

TEST(Trace, StepWindowTracesOnlyItsSteps) {
  Tracer::TraceSteps(2, 4);
  for (int64_t step = 0; step < 6; ++step) {
    Tracer::AtStep(step);
    const TraceSpan s("step", [step] { return StrCat("step ", step); });
  }
  EXPECT_FALSE(Tracer::on());
  std::set<std::string> names;
  for (const auto& e : Tracer::Spans()) names.insert(e.name);
  EXPECT_EQ(names, (std::set<std::string>{"step 2", "step 3"}));
}

// Spans timed by another clock (the GPU spans of ops/cuda/gpu_trace.cc): a
// flusher records them on a named lane when the trace is read; the lane
// shows as a thread of its own, and a second read does not repeat them.
std::atomic<int> g_lane_spans{0};
uint32_t g_lane_session = 0;
void FakeGpuFlush() {
  const int n = g_lane_spans.exchange(0);
  for (int i = 0; i < n; ++i) {
    Tracer::RecordOn("fake:0", g_lane_session, "gpu forward", StrCat("layer", i),
                     Tracer::NowNs() + 10 * i, Tracer::NowNs() + 10 * i + 5);
  }
}

TEST(Trace, FlushedLaneSpansShowAsTheirOwnThread) {
  Tracer::AddFlusher(&FakeGpuFlush);
  Tracer::AddFlusher(&FakeGpuFlush);  // once per registration, however often asked
  Tracer::Start();
  { const TraceSpan host("forward", "host side"); }
  g_lane_session = Tracer::session();
  g_lane_spans = 3;
  Tracer::Stop();
  const std::vector<TraceEvent> spans = Tracer::Spans();
  int host_thread = -1;
  std::set<int> lane_threads;
  int lane = 0;
  for (const TraceEvent& e : spans) {
    if (e.category == "gpu forward") {
      ++lane;
      lane_threads.insert(e.thread);
    } else {
      host_thread = e.thread;
    }
  }
  EXPECT_EQ(lane, 3);
  ASSERT_EQ(lane_threads.size(), 1u);
  EXPECT_NE(*lane_threads.begin(), host_thread);
  EXPECT_EQ(Tracer::Spans().size(), spans.size()) << "a second read repeats nothing";
  const std::string path = testing::TestDir() + "/lanes.json";
  Tracer::WriteChromeTrace(path);
  EXPECT_NE(testing::ReadBytes(path).find("\"name\":\"fake:0\""), std::string::npos);
}

// A model on a GPU, traced: every layer's forward and backward also has a
// span of GPU time on the lane "cuda:0", inside the traced wall time.
TEST(TraceGPU, GpuModelLayersGetSpansOfGpuTime) {
  CNNFLOW_SKIP_WITHOUT_GPU();
  const std::vector<LayerSpec> net = {
      testing::Spec("conv1", "conv2d", {{"out", int64_t{8}}, {"kernel", int64_t{3}}}),
      testing::Spec("relu1", "relu"), testing::Spec("flatten", "flatten"),
      testing::Spec("fc", "linear", {{"out", int64_t{4}}})};
  auto model = Model::Build(net, Shape{3, 12, 12}, {.seed = 1, .device = Device::Cuda(0)});
  const Tensor x = testing::RandomTensor(Shape{16, 3, 12, 12}, 2, -1, 1, DType::kF32);
  ForwardContext ctx;
  model->Forward(x.To(Device::Cuda(0)), ctx);  // warm-up: cuDNN's search, outside the trace
  Tracer::Start();
  const Tensor& y = model->Forward(x.To(Device::Cuda(0)), ctx);
  Tensor dy = Tensor::Zeros(y.shape(), DType::kF32, Device::Cuda(0));
  model->Backward(dy);
  Tracer::Stop();
  std::map<std::string, int> gpu;
  for (const TraceEvent& e : Tracer::Spans()) {
    if (e.category.rfind("gpu ", 0) != 0) continue;
    ++gpu[e.category + " " + e.name];
    EXPECT_GE(e.duration_us, 0) << e.name;
  }
  for (const char* layer : {"conv1 (conv2d)", "relu1 (relu)", "fc (linear)"}) {
    EXPECT_EQ(gpu[StrCat("gpu forward ", layer)], 1) << layer;
    EXPECT_EQ(gpu[StrCat("gpu backward ", layer)], 1) << layer;
  }
}

}  // namespace
}  // namespace cnnflow
