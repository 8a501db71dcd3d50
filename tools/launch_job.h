// What `cnnflow launch` runs: the `cnnflow train` inside COMMAND and its run
// folder, the command of a restart (`--resume RUN_DIR`), and, for an
// elastic job, the mpirun line over the hosts in use and the remote-shell
// agent that mpirun reaches them with (which probes them too). Pure
// functions of strings, unit-tested in tests/tools/launch_job_test.cc.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tools/hosts.h"

namespace cnnflow {

struct LoadedCheckpoint;

struct Job {
  std::vector<std::string> command;
  size_t train = 0;     // index of `train` in command (after the cnnflow binary)
  size_t dir_flag = 0;  // index of --out/-o/--resume in command (0: none)
  std::string run_dir;
};

// Finds the `cnnflow train` in `command` and its run folder; ConfigError
// when there is none.
Job ParseJob(std::vector<std::string> command);

// The job's command, resuming from RUN_DIR's newest checkpoint when `resume`.
std::vector<std::string> JobCommand(const Job& job, bool resume);

// "step 40 (epoch 1, batch 10)".
std::string DescribeCheckpoint(const LoadedCheckpoint& ck);

// "a, b, c" / "a b c" (`sep`).
std::string Join(const std::vector<std::string>& v, const std::string& sep = " ");

// The hosts an attempt runs on, each with its process count.
struct Layout {
  std::vector<std::string> hosts;
  std::vector<int64_t> procs;
  int64_t Processes() const;
  // "3 hosts (a,b,c; 3 processes)".
  std::string Describe() const;
};

// The layout of `hosts` (in their order): `procs_per_host` each, or where
// that is 0 the host's slots, or 1.
Layout MakeLayout(const std::vector<Host>& hosts, int64_t procs_per_host);

// The attempt's command over `layout`: `mpirun --host a:K,b:K -n N` before
// the train command (`mpirun` being the --mpirun PATH), or those options
// put into COMMAND's own mpirun line (`mpirun ... cnnflow train ...`).
std::vector<std::string> MpirunLine(const std::vector<std::string>& command, size_t train,
                                    const std::string& mpirun, const Layout& layout);

// Fails (ConfigError) unless `command` can be placed on hosts by
// MpirunLine: `cnnflow train ...`, or an mpirun/mpiexec line around it
// that chooses neither its hosts nor its process count.
void CheckElasticCommand(const std::vector<std::string>& command, size_t train);

// The remote-shell agent, as argv (HOST and a command follow it): `agent`
// when given, else the `--mca plm_rsh_agent X` of the command's mpirun
// line, else $OMPI_MCA_plm_rsh_agent (`env_agent`), else ssh. Open MPI's
// "ssh : rsh" takes the first; ssh gets `-o BatchMode=yes`, so that a probe
// never waits on a password prompt.
std::vector<std::string> RemoteAgent(const std::string& agent,
                                     const std::vector<std::string>& command, size_t train,
                                     const char* env_agent);

}  // namespace cnnflow
