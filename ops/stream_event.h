// A point in a GPU lane's compute stream (ops/device.h's lanes,
// ops/cuda/context.h's ordering rule), for work of one lane that another
// lane's work must follow without the host waiting: a pipeline stage hands
// its activations to the next stage's lane this way. On a CPU device every
// call does nothing (the host's own order is the order).
//
// Memory crossing lanes: a block may go back to its lane's pool once the
// host has issued the last use on THAT lane's stream. A lane that reads
// another lane's tensor therefore copies it into its own lane (after
// waiting for the event of the lane that wrote it) and keeps the original
// alive until its own event for the copy has passed (StreamEvent::passed).
#pragma once

#include "ops/device.h"

namespace cnnflow {

class StreamEvent {
 public:
  // Records the point the calling thread's lane of `device` has reached.
  explicit StreamEvent(Device device);
  ~StreamEvent();
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;

  // The calling thread's lane of `waiter` (a GPU: this one or another)
  // waits for it: what it issues later runs after the recorded point. A
  // CPU waiter blocks until then.
  void Await(Device waiter) const;
  // Whether the GPU has passed the point (never waits).
  bool passed() const;

 private:
  Device device_;
  void* event_ = nullptr;  // cudaEvent_t
};

}  // namespace cnnflow
