// The tracer's buffers, Chrome trace writer and summary (ops/trace.h).
#include "ops/trace.h"

#include <pthread.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <set>

#include "ops/error.h"
#include "ops/io/file_write.h"
#include "ops/io/json.h"

namespace cnnflow {

std::atomic<uint32_t> Tracer::session_{0};
std::atomic<bool> Tracer::window_armed_{false};

namespace {

struct Span {
  std::string name;
  const char* category;
  uint32_t session;
  int64_t begin_ns, end_ns;
};

// Spans in fixed chunks: the owner thread fills a slot and then publishes
// it (release on size); readers see only published slots, so neither side
// locks and a chunk never moves.
struct Chunk {
  static constexpr int kSpans = 512;
  Span spans[kSpans];
  std::atomic<int> size{0};
  std::atomic<Chunk*> next{nullptr};
};

struct ThreadBuffer {
  int tid = 0;
  std::string thread_name;
  Chunk head;
  Chunk* tail = &head;  // the owner's only

  void Append(Span s) {
    int n = tail->size.load(std::memory_order_relaxed);
    if (n == Chunk::kSpans) {
      Chunk* c = new Chunk();
      tail->next.store(c, std::memory_order_release);
      tail = c;
      n = 0;
    }
    tail->spans[n] = std::move(s);
    tail->size.store(n + 1, std::memory_order_release);
  }

  ~ThreadBuffer() {
    for (Chunk* c = head.next.load(); c != nullptr;) {
      Chunk* next = c->next.load();
      delete c;
      c = next;
    }
  }
};

struct Registry {
  std::mutex mu;
  std::vector<std::unique_ptr<ThreadBuffer>> buffers;  // never shrinks: spans outlive threads
  std::map<std::string, ThreadBuffer*> lanes;          // RecordOn's, among the buffers
  std::vector<void (*)()> flushers;
  uint32_t last_session = 0;  // the latest trace (0: none yet)
  int64_t start_ns = 0, stop_ns = 0;
  bool running = false;
  int64_t window_begin = 0, window_end = 0;
};

Registry& Reg() {
  static Registry* r = new Registry();  // never destroyed: threads may record at exit
  return *r;
}

const std::chrono::steady_clock::time_point kOrigin = std::chrono::steady_clock::now();

ThreadBuffer& ThisThread() {
  thread_local ThreadBuffer* buffer = nullptr;
  if (buffer == nullptr) {
    auto b = std::make_unique<ThreadBuffer>();
    char name[32] = "";
    pthread_getname_np(pthread_self(), name, sizeof(name));
    Registry& r = Reg();
    std::lock_guard<std::mutex> lock(r.mu);
    b->tid = static_cast<int>(r.buffers.size()) + 1;
    b->thread_name = StrCat(name[0] ? name : "thread", " ", b->tid);
    buffer = b.get();
    r.buffers.push_back(std::move(b));
  }
  return *buffer;
}

std::string Fixed(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", digits, v);
  return buf;
}

}  // namespace

int64_t Tracer::NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                              kOrigin)
      .count();
}

void Tracer::Record(uint32_t session, const char* category, std::string name, int64_t begin_ns,
                    int64_t end_ns) {
  ThisThread().Append(Span{std::move(name), category, session, begin_ns, end_ns});
}

void Tracer::RecordOn(const std::string& lane, uint32_t session, const char* category,
                      std::string name, int64_t begin_ns, int64_t end_ns) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);  // a lane has no owner thread: appends take the lock
  ThreadBuffer*& b = r.lanes[lane];
  if (b == nullptr) {
    auto fresh = std::make_unique<ThreadBuffer>();
    fresh->tid = static_cast<int>(r.buffers.size()) + 1;
    fresh->thread_name = lane;
    b = fresh.get();
    r.buffers.push_back(std::move(fresh));
  }
  b->Append(Span{std::move(name), category, session, begin_ns, end_ns});
}

void Tracer::AddFlusher(void (*flush)()) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  if (std::find(r.flushers.begin(), r.flushers.end(), flush) == r.flushers.end()) {
    r.flushers.push_back(flush);
  }
}

void Tracer::Start() {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.last_session += 1;
  r.start_ns = NowNs();
  r.running = true;
  session_.store(r.last_session, std::memory_order_relaxed);
}

void Tracer::Stop() {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  window_armed_.store(false, std::memory_order_relaxed);
  if (!r.running) return;
  session_.store(0, std::memory_order_relaxed);
  r.stop_ns = NowNs();
  r.running = false;
}

void Tracer::TraceSteps(int64_t begin, int64_t end) {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  r.window_begin = begin;
  r.window_end = end;
  window_armed_.store(end > begin, std::memory_order_relaxed);
}

void Tracer::AtStepSlow(int64_t step) {
  bool start = false, stop = false;
  {
    Registry& r = Reg();
    std::lock_guard<std::mutex> lock(r.mu);
    if (!window_armed_.load(std::memory_order_relaxed)) return;
    stop = step >= r.window_end;
    start = !stop && !r.running && step >= r.window_begin;
  }
  if (start) Start();
  if (stop) Stop();
}

double Tracer::WallSeconds() {
  Registry& r = Reg();
  std::lock_guard<std::mutex> lock(r.mu);
  if (r.last_session == 0) return 0;
  return static_cast<double>((r.running ? NowNs() : r.stop_ns) - r.start_ns) * 1e-9;
}

std::vector<TraceEvent> Tracer::Spans() {
  Registry& r = Reg();
  std::vector<void (*)()> flushers;
  {
    std::lock_guard<std::mutex> lock(r.mu);
    flushers = r.flushers;
  }
  for (auto* flush : flushers) flush();  // they record (and lock) themselves
  std::vector<TraceEvent> out;
  std::lock_guard<std::mutex> lock(r.mu);  // keeps the buffer list still; owners append freely
  for (const auto& b : r.buffers) {
    for (const Chunk* c = &b->head; c != nullptr; c = c->next.load(std::memory_order_acquire)) {
      const int n = c->size.load(std::memory_order_acquire);
      for (int i = 0; i < n; ++i) {
        const Span& s = c->spans[i];
        if (s.session != r.last_session) continue;
        out.push_back(TraceEvent{s.name, s.category, b->tid, static_cast<double>(s.begin_ns) * 1e-3,
                                 static_cast<double>(s.end_ns - s.begin_ns) * 1e-3});
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.begin_us < b.begin_us;
  });
  return out;
}

void Tracer::WriteChromeTrace(const std::string& path, int pid) {
  const std::vector<TraceEvent> spans = Spans();
  std::string text = "{\"traceEvents\":[\n";
  bool first = true;
  auto event_start = [&] {
    text += first ? "" : ",\n";
    first = false;
  };
  std::set<int> threads;
  for (const TraceEvent& e : spans) threads.insert(e.thread);
  {
    Registry& r = Reg();
    std::lock_guard<std::mutex> lock(r.mu);
    for (const auto& b : r.buffers) {
      if (!threads.count(b->tid)) continue;
      event_start();
      text += StrCat("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", pid, ",\"tid\":", b->tid,
                     ",\"args\":{\"name\":");
      AppendJsonString(text, b->thread_name);
      text += "}}";
    }
  }
  for (const TraceEvent& e : spans) {
    event_start();
    text += "{\"name\":";
    AppendJsonString(text, e.name);
    text += ",\"cat\":";
    AppendJsonString(text, e.category);
    text +=
        StrCat(",\"ph\":\"X\",\"ts\":", Fixed(e.begin_us, 3), ",\"dur\":", Fixed(e.duration_us, 3),
               ",\"pid\":", pid, ",\"tid\":", e.thread, "}");
  }
  text += "\n],\"displayTimeUnit\":\"ms\"}\n";

  WriteFileAtomically(path, text);
}

std::string Tracer::Summary() {
  const std::vector<TraceEvent> spans = Spans();
  const double wall = WallSeconds();
  struct Total {
    int64_t count = 0;
    double us = 0;
    std::set<int> threads;
    std::string category;
  };
  std::map<std::string, Total> by_category, by_name;
  std::set<int> threads;
  for (const TraceEvent& e : spans) {
    Total& c = by_category[e.category];
    c.count += 1;
    c.us += e.duration_us;
    c.threads.insert(e.thread);
    Total& n = by_name[e.category + '\0' + e.name];  // forward and backward of a layer apart
    n.count += 1;
    n.us += e.duration_us;
    n.category = e.category;
    threads.insert(e.thread);
  }
  std::string out = StrCat("trace: ", spans.size(), " spans on ", threads.size(), " threads over ",
                           Fixed(wall, 3), " s of wall time\n");
  if (spans.empty()) return out;
  auto ranked = [](const std::map<std::string, Total>& m) {
    std::vector<std::pair<std::string, Total>> v(m.begin(), m.end());
    std::stable_sort(v.begin(), v.end(),
                     [](const auto& a, const auto& b) { return a.second.us > b.second.us; });
    return v;
  };
  char line[512];
  // % of wall: over 100% when spans of the category ran on several threads
  // at once; per thread: the same divided by the threads it ran on.
  std::snprintf(line, sizeof(line), "  %-16s %8s %10s %9s %9s %11s\n", "category", "spans",
                "total s", "% of wall", "threads", "per thread");
  out += line;
  for (const auto& [name, t] : ranked(by_category)) {
    const double share = wall > 0 ? t.us * 1e-6 / wall : 0;
    std::snprintf(line, sizeof(line), "  %-16s %8lld %10.3f %8.1f%% %9zu %10.1f%%\n", name.c_str(),
                  static_cast<long long>(t.count), t.us * 1e-6, 100 * share, t.threads.size(),
                  100 * share / static_cast<double>(t.threads.size()));
    out += line;
  }
  std::snprintf(line, sizeof(line), "  %-32s %-14s %8s %11s %11s\n", "top spans by total time",
                "category", "count", "total ms", "mean us");
  out += line;
  const auto names = ranked(by_name);
  for (size_t i = 0; i < names.size() && i < 15; ++i) {
    const Total& t = names[i].second;
    const std::string name = names[i].first.substr(t.category.size() + 1);
    std::snprintf(line, sizeof(line), "  %-32s %-14s %8lld %11.2f %11.1f\n", name.c_str(),
                  t.category.c_str(), static_cast<long long>(t.count), t.us * 1e-3,
                  t.us / static_cast<double>(t.count));
    out += line;
  }
  out += "(spans nest: a step's time also counts in its forward, backward and optimizer)\n";
  return out;
}

}  // namespace cnnflow
