// ScanImageFolder: class order and labels, file order, extension filtering,
// hidden entries, and the errors for bad trees. Fixtures are tiny JPEGs
// written by EncodeJpeg into a per-test directory.
#include "loaders/image_folder.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "loaders/jpeg_decoder.h"
#include "ops/error.h"
#include "tests/testing/helpers.h"
#include "tests/testing/test_dir.h"

namespace cnnflow {
namespace {
namespace fs = std::filesystem;

void WriteFile(const fs::path& path, const std::string& bytes) {
  fs::create_directories(path.parent_path());
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

std::string TinyJpeg(uint8_t value) {
  std::vector<uint8_t> px(4 * 4 * 3, value);
  return EncodeJpeg(px.data(), 4, 4, 3);
}

// Expects ScanImageFolder(root) to throw Error whose message contains `part`.
void ExpectScanError(const std::string& root, const std::string& part) {
  testing::ExpectContains(testing::ErrorOf([&] { ScanImageFolder(root); }), {part});
}

TEST(ImageFolderTest, ClassesSortedFilesSortedLabelsByClass) {
  const fs::path root = testing::TestDir();
  // Created out of order: the listing must not depend on creation order.
  WriteFile(root / "zebra" / "b.jpg", TinyJpeg(10));
  WriteFile(root / "zebra" / "a.JPEG", TinyJpeg(20));
  WriteFile(root / "ant" / "2.jpeg", TinyJpeg(30));
  WriteFile(root / "ant" / "10.jpg", TinyJpeg(40));  // "10" < "2" bytewise
  WriteFile(root / "Bee" / "x.PNG", "not decoded by the scan");
  const ImageFolder f = ScanImageFolder(root.string());
  ASSERT_EQ(f.classes, (std::vector<std::string>{"Bee", "ant", "zebra"}));  // bytewise
  ASSERT_EQ(f.entries.size(), 5u);
  const std::vector<std::pair<fs::path, int64_t>> want = {{root / "Bee" / "x.PNG", 0},
                                                          {root / "ant" / "10.jpg", 1},
                                                          {root / "ant" / "2.jpeg", 1},
                                                          {root / "zebra" / "a.JPEG", 2},
                                                          {root / "zebra" / "b.jpg", 2}};
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(f.entries[i].path, want[i].first.string()) << i;
    EXPECT_EQ(f.entries[i].label, want[i].second) << i;
  }
}

TEST(ImageFolderTest, FiltersNonImagesHiddenAndRootFiles) {
  const fs::path root = testing::TestDir();
  WriteFile(root / "cat" / "1.jpg", TinyJpeg(1));
  WriteFile(root / "cat" / "notes.txt", "text");
  WriteFile(root / "cat" / "2.jpg.bak", "backup");
  WriteFile(root / "cat" / ".hidden.jpg", TinyJpeg(2));
  fs::create_directories(root / "cat" / "sub.jpg");  // a directory named like an image
  WriteFile(root / "cat" / "sub.jpg" / "deep.jpg", TinyJpeg(3));
  WriteFile(root / ".git" / "x.jpg", TinyJpeg(4));  // hidden class dir
  WriteFile(root / "stray.jpg", TinyJpeg(5));       // not in a class
  WriteFile(root / "dog" / "a.png", "png bytes");
  const ImageFolder f = ScanImageFolder(root.string());
  ASSERT_EQ(f.classes, (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(f.entries.size(), 2u);
  EXPECT_EQ(f.entries[0].path, (root / "cat" / "1.jpg").string());
  EXPECT_EQ(f.entries[0].label, 0);
  EXPECT_EQ(f.entries[1].path, (root / "dog" / "a.png").string());
  EXPECT_EQ(f.entries[1].label, 1);
}

TEST(ImageFolderTest, FollowsSymlinkedClassDirectory) {
  const fs::path root = testing::TestDir();
  WriteFile(root / "elsewhere" / "img.jpg", TinyJpeg(7));
  fs::create_directories(root / "tree");
  fs::create_directory_symlink(root / "elsewhere", root / "tree" / "linked");
  const ImageFolder f = ScanImageFolder((root / "tree").string());
  ASSERT_EQ(f.classes, (std::vector<std::string>{"linked"}));
  ASSERT_EQ(f.entries.size(), 1u);
}

TEST(ImageFolderTest, HasImageExtension) {
  EXPECT_TRUE(HasImageExtension("a.jpg"));
  EXPECT_TRUE(HasImageExtension("a.JpEg"));
  EXPECT_TRUE(HasImageExtension("a.Png"));
  EXPECT_TRUE(HasImageExtension(".jpg"));
  EXPECT_FALSE(HasImageExtension("jpg"));
  EXPECT_FALSE(HasImageExtension("a.jpgx"));
  EXPECT_FALSE(HasImageExtension("a.gif"));
  EXPECT_FALSE(HasImageExtension(""));
}

TEST(ImageFolderTest, Errors) {
  const fs::path root = testing::TestDir();
  ExpectScanError((root / "missing").string(), "does not exist");
  WriteFile(root / "file.jpg", TinyJpeg(1));
  ExpectScanError((root / "file.jpg").string(), "is not a directory");
  fs::create_directories(root / "empty");
  ExpectScanError((root / "empty").string(), "no class directories");
  WriteFile(root / "noimg" / "a" / "1.jpg", TinyJpeg(1));
  WriteFile(root / "noimg" / "b" / "readme.txt", "x");
  ExpectScanError((root / "noimg").string(), (root / "noimg" / "b").string());
  ExpectScanError((root / "noimg").string(), "holds no images");
}

}  // namespace
}  // namespace cnnflow
