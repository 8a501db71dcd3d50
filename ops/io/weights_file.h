// The one way cnnflow opens a file of weights someone gives it (train.init,
// eval, predict, export, models --check): safetensors, or PyTorch's .pth /
// .pt as torch.save writes it (ops/io/pth.h), told apart by the file's
// first bytes. What the names mean and which tensors must match is the
// next step's (ops/model.h LoadStateDict / MatchStateDict).
#pragma once

#include <string>

#include "ops/io/safetensors.h"

namespace cnnflow {

// Reads `path` into host tensors:
//  - a zip archive ("PK\3\4", or "PK\5\6" when empty) or PyTorch's legacy
//    pickle (its magic number; refused, saying what to do): LoadPth;
//  - anything else: LoadSafetensors. When that fails on a file named
//    *.pth / *.pt, the error is LoadPth's (not a torch.save file), which
//    says more than the safetensors reader's would.
// metadata["format"] is "pth" for PyTorch files. Throws Error naming the
// file and what is wrong.
SafetensorsFile LoadWeightsFile(const std::string& path);

}  // namespace cnnflow
