// PyTorch's .pth / .pt weights, read as torch.save (PyTorch 1.6 and newer)
// writes them, without Python and without running any of the file's code:
//   a zip archive (entries stored, or deflated; ZIP64 where the end record
//   says so) holding
//     <archive>/data.pkl   a pickle (protocol 2) of the saved object
//     <archive>/data/<key> each storage's raw little-endian bytes
//     <archive>/version, byteorder, ...
// The pickle runs on a restricted machine that accepts only the opcodes and
// globals torch.load(weights_only=True) accepts, and of those only what a
// state dict of tensors needs: containers, numbers, strings, the memo,
// collections.OrderedDict, torch._utils._rebuild_tensor_v2 and
// _rebuild_parameter, and the torch.<Type>Storage classes in persistent ids.
// Anything else (os.system, builtins.eval, a whole pickled nn.Module, a
// tensor subclass) is refused naming the opcode or the global and its byte
// offset in data.pkl; nothing from the file is ever called.
#pragma once

#include <string>

#include "ops/io/safetensors.h"

namespace cnnflow {

// Reads the state dict a torch.save file holds into host tensors, in the
// dict's order, under the dict's keys (a "module." prefix is kept here; the
// readers of weights drop it, ops/model.h MatchStateDict).
//  - The saved object is a dict of tensors (state_dict(), an OrderedDict),
//    or a dict whose "state_dict", "model" or "model_state_dict" entry is
//    one (a training checkpoint); the unwrapped key is in
//    metadata["pth.wrapper"]. metadata["format"] is "pth".
//  - Dtypes: float32, float64, float16 and bfloat16 load as they are;
//    int64 (BatchNorm's num_batches_tracked) as I64; int32, int16, int8,
//    uint8 and bool are widened to I64. Complex, float8, quantized and
//    other tensors are refused by name.
//  - A tensor that views part of its storage (an offset, any non-negative
//    strides) is copied out contiguous; tensors that share a storage share
//    nothing in the result except when they are the same view.
//  - The legacy format (torch < 1.6, or _use_new_zipfile_serialization=False:
//    a bare pickle) and TorchScript archives (torch.jit.save) are refused
//    with what to do instead.
// Every offset and size is checked against the file before it is used, and
// memory grows only with what the file holds. Throws Error naming the file
// and what is wrong.
SafetensorsFile LoadPth(const std::string& path);

}  // namespace cnnflow
