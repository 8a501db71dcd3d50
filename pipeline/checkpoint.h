// Training checkpoints for exact resume: where a run is, its weights and its
// optimizer state, written so that a crash at any instant never leaves a
// checkpoint that loads as valid but is not.
//
// Layout, under <run_dir>/checkpoints/:
//   step-000000300.safetensors  model tensors under their own (PyTorch
//                               state_dict) names, then the optimizer's state
//                               as "optimizer.<param>.<state>": any
//                               safetensors reader loads it.
//   step-000000300.json         the sidecar: CheckpointState plus the data
//                               file's size and CRC-32 (zlib's).
// Write order: the data file (temp name, fsync, rename, fsync of the
// directory), then the sidecar the same way, LAST. A checkpoint counts only
// when its sidecar parses and the data file has the recorded size and CRC,
// so a writer killed at any point leaves either a complete checkpoint or one
// that FindLatestCheckpoint skips with a warning.
//
// There is no `latest` pointer file: it would be one more file to update
// atomically and could still name a checkpoint whose data was damaged later.
// FindLatestCheckpoint scans the directory (keep_last files at most, so the
// scan is cheap) and verifies, newest first.
//
// Randomness needs no saved stream state: cnnflow's random numbers are
// counter-based (ops/random.h, a pure function of seed, epoch, step and
// sample index), and the sampler's order is a function of (seed, epoch). So
// the seed and the counters below (epoch, batch_in_epoch, global_step) are
// the whole RNG and sampler state; resuming at (epoch, batch_in_epoch)
// replays the same batches and draws the same dropout masks and
// augmentations as an uninterrupted run.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "ops/tensor.h"

namespace cnnflow {

// Where a run stands. The default operator== compares every field (metrics
// bitwise as doubles, so a NaN row never equals itself).
struct CheckpointState {
  int64_t epoch = 0;           // completed epochs
  int64_t batch_in_epoch = 0;  // batches of epoch `epoch` already trained
  int64_t global_step = 0;     // optimizer steps so far; names the files
  int64_t optimizer_step = 0;  // Optimizer::step_count() (Adam's bias correction)
  int64_t lr_step = 0;         // the step the LR schedule resumes at
  uint64_t seed = 0;
  std::string config_hash;  // ConfigHash of the resolved config
  std::map<std::string, std::string> extra;
  // metrics.csv so far: one row per finished epoch, one value per column.
  // Non-finite values are kept (stored as "NaN", "Infinity", "-Infinity").
  std::vector<std::string> metrics_columns;
  std::vector<std::vector<double>> metrics_rows;

  bool operator==(const CheckpointState&) const = default;
};

struct LoadedCheckpoint {
  CheckpointState state;
  std::string data_path;     // .../step-000000300.safetensors
  std::string sidecar_path;  // .../step-000000300.json
  // Host tensors, in the order they were written.
  std::vector<std::pair<std::string, Tensor>> model_tensors;
  // Names without the "optimizer." prefix, as Optimizer::LoadStateTensors
  // takes them.
  std::vector<std::pair<std::string, Tensor>> optimizer_tensors;
  // Newer checkpoints that were skipped and temporary files of writes that
  // did not finish, one line each ("skipped step-000000400: data file is
  // 1234 bytes, sidecar says 5678").
  std::vector<std::string> warnings;
};

// The prefix of optimizer tensors inside a checkpoint's safetensors file.
inline constexpr char kOptimizerTensorPrefix[] = "optimizer.";

// <run_dir>/checkpoints
std::string CheckpointDir(const std::string& run_dir);
// "step-000000300" (zero-padded to 9 digits; wider steps still work).
std::string CheckpointName(int64_t global_step);

// Writes checkpoint state.global_step into <run_dir>/checkpoints (created
// if needed) as described above and returns the data file's path. Then
// tidies the directory:
//  - keeps the newest `keep_last` complete checkpoints (this one included;
//    keep_last <= 0 keeps all) and deletes older ones, sidecar first so a
//    half-deleted checkpoint is never taken for a valid one;
//  - deletes incomplete older checkpoints (no sidecar, or a data file of the
//    wrong size) and every checkpoint of a LATER step: after a resume from
//    an earlier one those belong to an abandoned timeline;
//  - deletes temporary files whose writer process no longer exists.
// Rewriting an existing step removes its old sidecar first, so a crash
// during the rewrite leaves it invalid (older ones stay). One writer per
// run directory at a time (rank 0). Tensors may be on any device. Throws
// Error naming the path on I/O failure and for metrics rows whose length
// differs from the columns'.
std::string WriteCheckpoint(const std::string& run_dir, const CheckpointState& state,
                            const std::vector<std::pair<std::string, Tensor>>& model_tensors,
                            const std::vector<std::pair<std::string, Tensor>>& optimizer_tensors,
                            int keep_last);

// Loads and verifies one checkpoint from its sidecar's path: the sidecar
// parses, the data file has the recorded size and CRC-32, the safetensors
// header is valid and holds the recorded tensor counts. Throws Error saying
// what does not match.
LoadedCheckpoint LoadCheckpoint(const std::string& sidecar_path);

// The newest valid checkpoint in <run_dir>/checkpoints, or nullopt when
// there is none (or no such directory). Invalid newer ones and temporary
// files are skipped, each with a line in `warnings` (when not null) and in
// the result's `warnings`. Never modifies the directory.
std::optional<LoadedCheckpoint> FindLatestCheckpoint(const std::string& run_dir,
                                                     std::vector<std::string>* warnings = nullptr);

// A stable hash of a text (64-bit FNV-1a) as 16 lowercase hex digits, for
// checking on resume that the config is the one the checkpoint was made
// with.
std::string ConfigHash(const std::string& text);

}  // namespace cnnflow
