#include "ops/parallel/member_threads.h"

namespace cnnflow {

MemberThreads::MemberThreads(int members) : members_(members < 1 ? 1 : members) {
  errors_.resize(members_);
  for (int m = 1; m < members_; ++m) threads_.emplace_back([this, m] { Loop(m); });
}

MemberThreads::~MemberThreads() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void MemberThreads::RunOne(int member) {
  try {
    (*fn_)(member);
  } catch (const std::exception& e) {
    errors_[member] = std::current_exception();
    if (*on_error_) (*on_error_)(member, e.what());
  } catch (...) {
    errors_[member] = std::current_exception();
    if (*on_error_) (*on_error_)(member, "unknown exception");
  }
}

void MemberThreads::Loop(int member) {
  long seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    RunOne(member);
    std::lock_guard<std::mutex> lock(mu_);
    if (--running_ == 0) done_.notify_one();
  }
}

void MemberThreads::Run(const std::function<void(int)>& fn,
                        const std::function<void(int, const char*)>& on_error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = &fn;
    on_error_ = &on_error;
    for (auto& e : errors_) e = nullptr;
    running_ = members_ - 1;
    ++generation_;
  }
  wake_.notify_all();
  RunOne(0);
  {
    std::unique_lock<std::mutex> lock(mu_);
    done_.wait(lock, [&] { return running_ == 0; });
  }
  for (auto& e : errors_)
    if (e) std::rethrow_exception(e);
}

}  // namespace cnnflow
