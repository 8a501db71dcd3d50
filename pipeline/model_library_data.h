// The model library's YAML files (models/*.yaml), built into the binary by
// cmake/EmbedModels.cmake so that `model: {library: ...}` works from any
// directory.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace cnnflow {

// (path in the repository, text) of each library file, sorted by path.
const std::vector<std::pair<std::string, std::string>>& ModelLibraryFiles();

}  // namespace cnnflow
