// The CLI's signal handlers: one way to install them (the train command's
// stop request, the launcher's forwarding to its job).
#pragma once

#include <signal.h>

#include <initializer_list>

namespace cnnflow {

// `handler` for each of `signals`, restarting interrupted system calls.
inline void HandleSignals(void (*handler)(int), std::initializer_list<int> signals) {
  struct sigaction sa {};
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : signals) sigaction(sig, &sa, nullptr);
}

}  // namespace cnnflow
