// `cnnflow launch [--max-restarts N] [-n RANKS] [--mpirun PATH] -- COMMAND...`:
// gang restart. Runs COMMAND (a `cnnflow train ... --out RUN_DIR`, or
// `mpirun -n N cnnflow train ...`, or with -n the launcher's own mpirun);
// when it fails, runs the whole job again, every rank, continuing from the
// newest valid checkpoint of RUN_DIR (`--resume RUN_DIR`), up to N times.
// `cnnflow train ... --max-restarts N` (one process) is the same launcher
// around that train command. Returns the exit code (the last attempt's).
#pragma once

#include <string>
#include <vector>

namespace cnnflow {

inline constexpr const char* kLaunchUsage =
    "usage: cnnflow launch [--max-restarts N] [-n RANKS] [--mpirun PATH] -- COMMAND...\n"
    "  run COMMAND (cnnflow train CONFIG --out RUN_DIR ..., or an mpirun/srun line around it);\n"
    "  when it fails, relaunch the whole job (every rank) from the newest valid checkpoint of\n"
    "  RUN_DIR (--resume RUN_DIR), at most N times (3). -n RANKS: run it as\n"
    "  `mpirun -n RANKS COMMAND` (--mpirun: the launcher, default mpirun). A job stopped by\n"
    "  Ctrl-C/SIGTERM (exit 130) is not restarted; the exit status is the last attempt's\n";

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
