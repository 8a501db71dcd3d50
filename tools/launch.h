// `cnnflow launch [--max-restarts N] [-n RANKS] [--mpirun PATH] -- COMMAND...`:
// gang restart. Runs COMMAND (a `cnnflow train ... --out RUN_DIR`, or
// `mpirun -n N cnnflow train ...`, or with -n the launcher's own mpirun);
// when it fails, runs the whole job again, every rank, continuing from the
// newest valid checkpoint of RUN_DIR (`--resume RUN_DIR`), up to N times.
// With hosts (--hosts, --hostfile, or Slurm's $SLURM_JOB_NODELIST) the job
// is elastic: it runs on those that answer, shrinks when one is lost and
// grows when one comes back (tools/elastic_launch.h).
// `cnnflow train ... --max-restarts N` (one process) is the same launcher
// around that train command. Returns the exit code (the last attempt's).
#pragma once

#include <string>
#include <vector>

namespace cnnflow {

inline constexpr const char* kLaunchUsage =
    "usage: cnnflow launch [--max-restarts N] [-n RANKS] [--mpirun PATH] -- COMMAND...\n"
    "       cnnflow launch (--hosts A,B:2,... | --hostfile FILE) [--min-hosts N] [--max-hosts M]\n"
    "                      [--procs-per-host K] [--probe-every S] [--join-timeout S]\n"
    "                      [--agent CMD] [--max-restarts N] [--mpirun PATH] -- COMMAND...\n"
    "  run COMMAND (cnnflow train CONFIG --out RUN_DIR ..., or an mpirun/srun line around it);\n"
    "  when it fails, relaunch the whole job (every rank) from the newest valid checkpoint of\n"
    "  RUN_DIR (--resume RUN_DIR), at most N times (3). -n RANKS: run it as\n"
    "  `mpirun -n RANKS COMMAND` (--mpirun: the launcher, default mpirun). A job stopped by\n"
    "  Ctrl-C/SIGTERM (exit 130) is not restarted; the exit status is the last attempt's.\n"
    "  Elastic, with hosts (a hostfile: one a line, `# comments`, `slots=N`; under Slurm\n"
    "  without -n, $SLURM_JOB_NODELIST): runs `mpirun --host h1:K,... -n HOSTS*K COMMAND` on\n"
    "  the first M (all) hosts that answer `CMD HOST true` (--agent; default mpirun's\n"
    "  plm_rsh_agent, else ssh) once N (1) do, waiting up to --join-timeout (600 s); K is\n"
    "  --procs-per-host, else the host's slots, else 1. A failed attempt probes every host\n"
    "  and restarts on those that answer (a restart of N); while on fewer than M hosts the\n"
    "  others are probed every S s (30) and one that answers joins: the job stops after the\n"
    "  current step with a checkpoint (SIGUSR1) and restarts with it (not counted in N)\n";

int RunLaunch(const std::vector<std::string>& args);

// A rank's fatal error (`line`, one line), told to a `cnnflow launch` on this
// host ($CNNFLOW_LAUNCH_NOTIFY, a FIFO it made): it then ends the job if
// mpirun does not within a few seconds (a far host unreachable). Does
// nothing without one.
void TellLauncherOfFailure(const std::string& line);

// `cnnflow train ARGS... --max-restarts N` (args without the command name):
// RunLaunch around `<this binary> train ARGS...` (without --max-restarts).
// Refused under mpirun/srun, where one rank cannot relaunch the others.
int RunTrainWithRestarts(const std::vector<std::string>& train_args);

}  // namespace cnnflow
