// graph.deterministic's record of the cuDNN convolution algorithms a run
// took, so that a resume takes the same ones (ops/cuda/conv_cudnn.cc).
//
// Deterministic mode picks by cuDNN's heuristics (cudnnGet*Algorithm_v7, as
// PyTorch does with cudnn.deterministic and benchmark off), not by timing,
// so two fresh runs on one GPU model and cuDNN version already agree; the
// file keeps a run's picks when the heuristics would move (another cuDNN,
// less free memory). The file is <run>/cudnn-picks.tsv (pipeline/trainer.cc):
// one "machine<TAB>key<TAB>pick" line per pick, machine naming the GPU
// model, its compute capability and the cuDNN version (lines of another
// machine are kept and not used: that GPU picks anew), key the pass and the
// convolution's shape, pick "algo math". Written atomically (ops/io/file_write.h)
// each time a pick is added. Plain C++: no CUDA types.
#pragma once

#include <string>

namespace cnnflow::cuda {

// The file this process's picks go to from now on ("": memory only), loaded
// now when it exists: its picks join this process's and win over them for
// a key in both (a resume runs what the run it resumes ran). With `write`
// (process 0 of a job), the union is written back at once and after every
// new pick. A malformed file is an Error naming it and the line.
void SetCudnnPicksFile(const std::string& path, bool write);

// The pick recorded for `key` on `machine`, or "" when there is none.
std::string FindCudnnPick(const std::string& machine, const std::string& key);

// Records `pick` for `key` on `machine` (the first record of a key wins;
// returns the pick that holds), and rewrites the file when this process
// writes one.
std::string RecordCudnnPick(const std::string& machine, const std::string& key,
                            const std::string& pick);

}  // namespace cnnflow::cuda
