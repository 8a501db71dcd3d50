// Persistent threads for the members of a tensor-parallel group, so that a
// group's forward at batch 1 (the latency TP is for) does not pay for new
// threads each call: a fresh thread starts with cold per-thread state
// (oneDNN's scratchpad, the allocator's thread cache, an OpenMP team), and
// at a few milliseconds a layer that is a large share of the call.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace cnnflow {

class MemberThreads {
 public:
  // members - 1 threads; member 0 runs on the caller of Run.
  explicit MemberThreads(int members);
  ~MemberThreads();
  MemberThreads(const MemberThreads&) = delete;
  MemberThreads& operator=(const MemberThreads&) = delete;

  int members() const { return members_; }

  // fn(0) on the calling thread and fn(1..members-1) on the member threads,
  // all at once; returns when every one has returned, rethrowing the first
  // (lowest member's) exception. `on_error(member, what)` runs on the
  // failing member's thread before it returns, so that the others, blocked
  // in a collective with it, can be released (LocalGroup::Abort). Not
  // reentrant: one Run at a time.
  void Run(const std::function<void(int)>& fn,
           const std::function<void(int, const char*)>& on_error = nullptr);

 private:
  void Loop(int member);
  void RunOne(int member);

  const int members_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* fn_ = nullptr;
  const std::function<void(int, const char*)>* on_error_ = nullptr;
  long generation_ = 0;  // Run calls so far
  int running_ = 0;      // member threads still in this generation's fn
  bool stop_ = false;
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

}  // namespace cnnflow
