// `cnnflow convert`: writes a data set (an image folder or IDX files) into a
// new LMDB of records (loaders/record.h), like Caffe's convert_imageset.
#pragma once

#include <string>
#include <vector>

namespace cnnflow {

// args: the command line after "convert". Prints progress and a summary on
// stderr/stdout. Returns the exit code: 0 ok, 1 error (the message names
// what failed and where, e.g. the file), 2 usage error (usage printed).
int RunConvert(const std::vector<std::string>& args);

}  // namespace cnnflow
