// The profiler: a process-wide tracer of timed spans (where a training
// run's time goes), written as a Chrome trace (chrome://tracing,
// ui.perfetto.dev) and summarised as a table by category and by name.
//
// Off by default. A TraceSpan then costs one relaxed atomic load: no clock
// read, no allocation, and a name given as a callable is never built. When
// on, each thread appends its spans to a buffer of its own (registered once
// in a global list), so recording takes no lock.
//
//   TraceSpan span("forward", [&] { return StrCat(layer.name(), " (", layer.type(), ")"); });
//   TraceSpan span("loss", "softmax cross-entropy");
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace cnnflow {

// One finished span, as Tracer::Spans() returns it.
struct TraceEvent {
  std::string name;
  std::string category;
  int thread = 0;       // 1, 2, ... in the order threads first recorded
  double begin_us = 0;  // steady clock, from a process-wide origin
  double duration_us = 0;
  double end_us() const { return begin_us + duration_us; }
};

class Tracer {
 public:
  // Starts a new trace (the spans of an earlier one are no longer returned).
  static void Start();
  // Stops recording; spans still open finish into the trace. Idempotent.
  static void Stop();
  static bool on() { return session_.load(std::memory_order_relaxed) != 0; }

  // Traces training steps [begin, end): AtStep(s) starts the trace when s
  // reaches begin and stops it when s reaches end.
  static void TraceSteps(int64_t begin, int64_t end);
  // The step about to run (the train loop calls it once per step; one
  // relaxed load when no window is armed).
  static void AtStep(int64_t step) {
    if (window_armed_.load(std::memory_order_relaxed)) AtStepSlow(step);
  }

  // All threads' spans of the latest trace, ordered by begin time.
  static std::vector<TraceEvent> Spans();
  // Seconds from Start() to Stop() (or to now while on); 0 before any Start.
  static double WallSeconds();

  // The Trace Event Format ({"traceEvents": [{"name", "cat", "ph": "X",
  // "ts", "dur", "pid", "tid"}, ...]}, times in microseconds) with one "M"
  // thread_name event per thread. Written to PATH.tmp, then renamed, so
  // PATH is whole or absent. Throws Error naming the path.
  static void WriteChromeTrace(const std::string& path, int pid = 0);

  // Per category: threads, total seconds, share of (traced wall time x its
  // threads); then the 15 names with the most total time: count, total ms,
  // mean us. Nested spans (a step holds its layers) count in both.
  static std::string Summary();

  // Spans timed by another clock (a GPU's, with CUDA events) are recorded
  // into the buffer of a named lane ("cuda:0"), which shows as a thread of
  // its own. A source that holds spans not yet recorded registers a flusher,
  // called (once per registration) before spans are read.
  static void RecordOn(const std::string& lane, uint32_t session, const char* category,
                       std::string name, int64_t begin_ns, int64_t end_ns);
  static void AddFlusher(void (*flush)());

  // Implementation of TraceSpan.
  static uint32_t session() { return session_.load(std::memory_order_relaxed); }
  static int64_t NowNs();
  static void Record(uint32_t session, const char* category, std::string name, int64_t begin_ns,
                     int64_t end_ns);

 private:
  static void AtStepSlow(int64_t step);

  static std::atomic<uint32_t> session_;  // 0: off; else the trace being recorded
  static std::atomic<bool> window_armed_;
};

// Records [construction, destruction) as one complete span of the calling
// thread. `category` must outlive the trace (a string literal); the name is a
// const char* or a callable returning std::string, called only when on.
class TraceSpan {
 public:
  TraceSpan(const char* category, const char* name) : category_(category) {
    session_ = Tracer::session();
    if (session_ != 0) {
      name_ = name;
      begin_ns_ = Tracer::NowNs();
    }
  }
  template <typename MakeName,
            typename = std::enable_if_t<std::is_invocable_r_v<std::string, MakeName&>>>
  TraceSpan(const char* category, MakeName&& make_name) : category_(category) {
    session_ = Tracer::session();
    if (session_ != 0) {
      name_ = make_name();
      begin_ns_ = Tracer::NowNs();
    }
  }
  ~TraceSpan() {
    if (session_ != 0)
      Tracer::Record(session_, category_, std::move(name_), begin_ns_, Tracer::NowNs());
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  const char* category_;
  uint32_t session_ = 0;
  int64_t begin_ns_ = 0;
  std::string name_;  // empty (no allocation) when off
};

}  // namespace cnnflow
