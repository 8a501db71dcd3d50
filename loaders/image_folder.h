// Image folders as torchvision's ImageFolder lays them out:
// root/<class>/<file>, one sub-directory per class. Classes are sorted by
// name (bytewise, as Python's sorted() on names) and numbered 0.., files
// sorted by name within their class, so the listing (and the labels) are the
// same on every machine and every run.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cnnflow {

struct ImageFolderEntry {
  std::string path;   // root/<class>/<file>
  int64_t label = 0;  // index into ImageFolder::classes
};

struct ImageFolder {
  std::vector<std::string> classes;       // sorted class (directory) names
  std::vector<ImageFolderEntry> entries;  // class by class, files sorted by name
};

// True for names ending in .jpg, .jpeg or .png (case-insensitive).
bool HasImageExtension(std::string_view filename);

// Lists root/<class>/<file>. Only regular files (or links to them) with an
// image extension (HasImageExtension) count; hidden entries (names starting
// with '.') and files directly under root are ignored. Throws Error, naming
// the path, when root is missing or not a directory, has no class
// directories, or a class directory holds no image (as torchvision does:
// an empty class would be a label that never occurs).
ImageFolder ScanImageFolder(const std::string& root);

}  // namespace cnnflow
