// Which kernel runs a layer shape: measured once, then remembered, like
// cuDNN's algorithm search, and on disk, like MIOpen's find-db, so that every
// process on this machine (a resumed run, each MPI rank, the next run) takes
// the same pick and so computes bitwise the same results.
//
// The file is $CNNFLOW_CACHE_DIR/kernel-picks.tsv (default
// $XDG_CACHE_HOME/cnnflow, else ~/.cache/cnnflow; CNNFLOW_CACHE_DIR= empty
// keeps picks in this process only): one "machine<TAB>key<TAB>pick" line per
// pick, where machine names the CPU model, its ISA, the oneDNN version and
// the generation of cnnflow's own kernels, so that another machine, or a
// build whose kernels run at other speeds, measures anew. The first line for a key wins; the
// file is locked (flock) while a pick is measured, so two processes never
// pick differently.
#pragma once

#include <functional>
#include <string>

namespace cnnflow::cpu {

// The pick for `key`: from this process's memory, else from the file, else
// measure() (its answer is then recorded). measure() runs at most once per
// key per process; concurrent callers of the same key wait for it.
std::string FindOrMeasure(const std::string& key, const std::function<std::string()>& measure);

// This process's picks, as text ("key<TAB>pick" lines), for another process
// to adopt.
std::string ExportPicks();
// Takes `text` (another process's ExportPicks) as this process's picks:
// they win over the file and over measuring, so the processes of a job
// compute with one process's picks whatever their own pick files hold.
void AdoptPicks(const std::string& text);

// This machine's line prefix: CPU model, ISA, oneDNN version, kernel generation.
const std::string& MachineId();

// The cache file, or "" when picks stay in memory.
std::string KernelPickFile();

}  // namespace cnnflow::cpu
