// The hosts of an elastic `cnnflow launch`: from `--hosts a,b:2`, from a
// hostfile in Open MPI's form, or from Slurm's compressed node list
// ($SLURM_JOB_NODELIST). Parsing only; a malformed input throws ConfigError
// naming what is wrong and where (the variable or file:line, the character).
#pragma once

#include <string>
#include <vector>

namespace cnnflow {

struct Host {
  std::string name;
  int slots = 0;  // processes the host offers; 0: not said
};

// Slurm's compressed form: comma-separated names, each with bracketed
// ranges whose zero padding is kept:
//   "node[01-03,07],gpu5,rack[1-2]-n[3-4]" -> node01 node02 node03 node07 gpu5
//   rack1-n3 rack1-n4 rack2-n3 rack2-n4.
// `origin` names the input in errors (e.g. "SLURM_JOB_NODELIST").
std::vector<std::string> ParseSlurmNodeList(const std::string& list,
                                            const std::string& origin = "node list");

// A hostfile's text, Open MPI's form: one host a line, `# comments`, blank
// lines, and optional `slots=N` (`max_slots=N` is accepted and ignored).
// `origin` is the file's name, for "FILE:LINE: ..." errors.
std::vector<Host> ParseHostFile(const std::string& text, const std::string& origin);

// ParseHostFile of the file at `path` (ConfigError when it cannot be read).
std::vector<Host> ReadHostFile(const std::string& path);

// `--hosts a,b:2,c`: names with optional `:SLOTS`, mpirun's --host form.
std::vector<Host> ParseHostList(const std::string& list);

}  // namespace cnnflow
