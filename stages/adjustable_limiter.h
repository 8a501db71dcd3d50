// A limiter_node whose limit can move while the graph runs, between 1 and
// the maximum it was built with (autotuning changes prefetch depth and
// decode concurrency this way). oneTBB's limiter has a fixed threshold, so
// the gap below the maximum is held as parked tokens: lowering the limit
// parks tokens as they come back (in-flight work is never cut short),
// raising it unparks them at once.
#pragma once

#include <tbb/flow_graph.h>

#include <algorithm>
#include <cstdint>
#include <mutex>

#include "ops/error.h"

namespace cnnflow {

template <typename T>
class AdjustableLimiter {
 public:
  using Node = tbb::flow::limiter_node<T, long long>;

  AdjustableLimiter(tbb::flow::graph& g, int64_t limit, int64_t max_limit)
      : max_(std::max(limit, max_limit)), limit_(limit), node_(g, static_cast<size_t>(max_)) {
    CNNFLOW_ENFORCE(limit >= 1, "limit must be >= 1, got ", limit);
    // Nothing is in flight yet, so the parked tokens can be taken now.
    if (max_ > limit_) node_.decrementer().try_put(-static_cast<long long>(max_ - limit_));
  }

  Node& node() { return node_; }
  int64_t limit() const {
    std::lock_guard<std::mutex> lock(mu_);
    return limit_;
  }
  int64_t max_limit() const { return max_; }

  // One message that passed the limiter is done: its token comes back,
  // unless a lowered limit is still owed tokens.
  void Release() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (owed_ > 0) {
        --owed_;
        return;
      }
    }
    node_.decrementer().try_put(1);
  }

  // Clamped to [1, max_limit()]; returns the limit now in force.
  int64_t SetLimit(int64_t limit) {
    limit = std::clamp<int64_t>(limit, 1, max_);
    int64_t unpark = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      const int64_t delta = limit - limit_;
      limit_ = limit;
      if (delta < 0) {
        owed_ += -delta;  // taken from the next returns
      } else {
        const int64_t cancel = std::min(owed_, delta);
        owed_ -= cancel;
        unpark = delta - cancel;
      }
    }
    if (unpark > 0) node_.decrementer().try_put(static_cast<long long>(unpark));
    return limit;
  }

 private:
  const int64_t max_;
  mutable std::mutex mu_;
  int64_t limit_;
  int64_t owed_ = 0;
  Node node_;
};

}  // namespace cnnflow
