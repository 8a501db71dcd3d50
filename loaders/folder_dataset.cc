#include "loaders/folder_dataset.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "loaders/source_registry.h"
#include "ops/error.h"

namespace cnnflow {

std::string ReadWholeFile(const std::string& path, std::vector<uint8_t>* bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return StrCat("cannot open '", path, "': ", std::strerror(errno));
  struct stat st;
  std::string error;
  if (::fstat(fd, &st) != 0) {
    error = StrCat("cannot stat '", path, "': ", std::strerror(errno));
  } else if (!S_ISREG(st.st_mode)) {
    error = StrCat("'", path, "' is not a regular file");
  } else {
    bytes->resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (done < bytes->size()) {
      const ssize_t n = ::read(fd, bytes->data() + done, bytes->size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        error = StrCat("cannot read '", path, "': ", std::strerror(errno));
        break;
      }
      if (n == 0) {  // shrank since fstat: keep what is there
        bytes->resize(done);
        break;
      }
      done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  return error;
}

FolderDataset::FolderDataset(const Args& args)
    : root_(args.String("path")), folder_(ScanImageFolder(root_)) {
  const int64_t given_classes = args.Int("num_classes");
  num_classes_ = static_cast<int>(given_classes > 0 ? given_classes
                                                    : static_cast<int64_t>(folder_.classes.size()));
  if (num_classes_ < static_cast<int>(folder_.classes.size())) {
    throw ConfigError(StrCat("image folder '", root_, "' has ", folder_.classes.size(),
                             " classes but num_classes is ", num_classes_));
  }
  std::vector<int64_t> shape = args.Ints("shape");
  if (shape.size() == 1 && shape[0] == 0) {  // the first image's
    const std::string& first = folder_.entries.front().path;
    std::vector<uint8_t> bytes;
    std::string error = ReadWholeFile(first, &bytes);
    ImageResult header;
    if (error.empty()) {
      header = ReadImageHeader(bytes.data(), bytes.size());
      error = header.error;
    }
    if (!error.empty()) {
      throw Error(StrCat("image folder '", root_, "': cannot take the sample shape from '", first,
                         "' (", error, "); give shape: [C, H, W]"));
    }
    shape = {DefaultImageChannels(header.channels), header.height, header.width};
  }
  if (shape.size() != 3 || shape[0] <= 0 || shape[1] <= 0 || shape[2] <= 0) {
    throw ConfigError(
        StrCat("image folder '", root_, "': shape must be [C, H, W], got ", Shape(shape)));
  }
  shape_ = Shape(shape);
  decoder_ = std::make_unique<ImageSampleDecoder>(shape_, args);
}

ReadResult FolderDataset::Read(int64_t index, const ReadContext& ctx, float* dst) const {
  const ImageFolderEntry& e = folder_.entries.at(static_cast<size_t>(index));
  thread_local std::vector<uint8_t> bytes;
  std::string error = ReadWholeFile(e.path, &bytes);
  if (!error.empty()) return {-1, error};
  error = decoder_->DecodeEncoded(bytes.data(), bytes.size(), ctx, index, dst);
  if (!error.empty()) return {-1, StrCat("'", e.path, "': ", error)};
  return {e.label, ""};
}

std::string FolderDataset::Key(int64_t index) const {
  return folder_.entries.at(static_cast<size_t>(index)).path;
}

std::string FolderDataset::description() const {
  return StrCat("image folder ", root_, " (", size(), " images, samples of ", shape_, ", ",
                num_classes_, " classes)");
}

CNNFLOW_REGISTER_SOURCE(
    folder,
    AddImageAugmentParams(
        Schema("An image folder as torchvision's ImageFolder: path/<class>/<image> (.jpg, .jpeg, "
               ".png), classes numbered in name order; each file is read and decoded (TurboJPEG "
               "/ libpng) when sampled; augmentation in training passes only.")
            .Required("path", ParamType::kString, "the folder root")
            .Optional("shape", ParamType::kIntList, std::vector<int64_t>{0},
                      "sample shape [C, H, W] (0: the first image's)")
            .Optional("num_classes", ParamType::kInt, int64_t{0},
                      "0: the number of class directories")),
    [](const Args& a) -> std::shared_ptr<Dataset> { return std::make_shared<FolderDataset>(a); });

}  // namespace cnnflow
