// An elastic `cnnflow launch`: the job runs on those of its hosts that
// answer, shrinks when one is lost and grows when one comes back (torchrun
// --nnodes MIN:MAX, Horovod Elastic). Every change is a fresh mpirun over
// the new hosts, resuming from the newest checkpoint (see tools/launch.cc).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tools/hosts.h"
#include "tools/launch_job.h"

namespace cnnflow {

struct ElasticOptions {
  std::vector<Host> hosts;  // in order: the first ones are used first
  int64_t min_hosts = 1;
  int64_t max_hosts = 0;        // 0: all
  int64_t procs_per_host = 0;   // 0: each host's slots, or 1
  double probe_every_s = 30;    // the hosts not in use are probed this often
  double join_timeout_s = 600;  // how long to wait for --min-hosts to answer
  std::string agent;            // --agent; "" for mpirun's own (RemoteAgent)
  std::string mpirun = "mpirun";
  int64_t max_restarts = 3;  // failures; a grow is not one
};

// Runs the job to its end; returns the exit status (RunLaunch's).
int RunElastic(const ElasticOptions& options, const Job& job);

}  // namespace cnnflow
