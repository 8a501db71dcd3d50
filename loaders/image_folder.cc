#include "loaders/image_folder.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <system_error>

#include "ops/error.h"

namespace cnnflow {
namespace fs = std::filesystem;

namespace {

bool EndsWithNoCase(std::string_view s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  s.remove_prefix(s.size() - suffix.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[i])) != suffix[i]) return false;
  }
  return true;
}

bool Hidden(const fs::path& p) {
  const std::string name = p.filename().string();
  return !name.empty() && name[0] == '.';
}

}  // namespace

bool HasImageExtension(std::string_view filename) {
  return EndsWithNoCase(filename, ".jpg") || EndsWithNoCase(filename, ".jpeg") ||
         EndsWithNoCase(filename, ".png");
}

ImageFolder ScanImageFolder(const std::string& root) {
  std::error_code ec;
  if (!fs::exists(root, ec)) throw Error(StrCat("image folder '", root, "' does not exist"));
  if (!fs::is_directory(root, ec)) {
    throw Error(StrCat("image folder '", root, "' is not a directory"));
  }
  ImageFolder folder;
  std::vector<std::string> class_dirs;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    // is_directory follows links, so a class may be a symlinked directory.
    if (!Hidden(it->path()) && fs::is_directory(it->path(), ec)) {
      class_dirs.push_back(it->path().filename().string());
    }
  }
  if (ec) throw Error(StrCat("cannot list image folder '", root, "': ", ec.message()));
  if (class_dirs.empty()) {
    throw Error(StrCat("image folder '", root,
                       "' has no class directories (expected root/<class>/<image>)"));
  }
  std::sort(class_dirs.begin(), class_dirs.end());
  std::vector<std::string> files;
  for (size_t label = 0; label < class_dirs.size(); ++label) {
    const fs::path dir = fs::path(root) / class_dirs[label];
    files.clear();
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
      const fs::path& p = it->path();
      if (Hidden(p) || !HasImageExtension(p.filename().string())) continue;
      if (fs::is_regular_file(p, ec)) files.push_back(p.filename().string());
    }
    if (ec) throw Error(StrCat("cannot list class directory '", dir.string(), "': ", ec.message()));
    if (files.empty()) {
      throw Error(
          StrCat("class directory '", dir.string(), "' holds no images (.jpg, .jpeg or .png)"));
    }
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      folder.entries.push_back({(dir / f).string(), static_cast<int64_t>(label)});
    }
  }
  folder.classes = std::move(class_dirs);
  return folder;
}

}  // namespace cnnflow
