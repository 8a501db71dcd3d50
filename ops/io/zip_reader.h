// A minimal reader of zip archives from untrusted files: what PyTorch's
// torch.save writes (ops/io/pth.h), and nothing more. It reads the end of
// central directory record (and its ZIP64 form where the record says so),
// the central directory and each entry's local header; entries are stored
// or deflated (zlib); encrypted, multi-disk and other methods are refused.
// Every offset and size is checked against the file size before it is used,
// and no buffer grows beyond what the file holds (a deflated entry grows
// only as its data inflates). Errors are Error values naming the file.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace cnnflow {

struct ZipEntry {
  std::string name;
  uint16_t method = 0;  // 0 stored, 8 deflated
  uint32_t crc32 = 0;   // 0: not recorded (torch's writer may skip it)
  uint64_t compressed_size = 0;
  uint64_t size = 0;  // uncompressed
  uint64_t local_header_offset = 0;
};

class ZipReader {
 public:
  // Opens `path` and reads its central directory. Throws Error when it is not
  // a zip archive, is truncated, or any record points outside the file.
  explicit ZipReader(const std::string& path);
  ~ZipReader();
  ZipReader(const ZipReader&) = delete;
  ZipReader& operator=(const ZipReader&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_size() const { return file_size_; }
  // In the central directory's order.
  const std::vector<ZipEntry>& entries() const { return entries_; }
  // nullptr when absent.
  const ZipEntry* Find(const std::string& name) const;

  // The whole entry, inflated where deflated, its CRC-32 checked.
  std::string Read(const ZipEntry& e) const;
  // A stored entry's `e.size` bytes into `dst`, its CRC-32 checked.
  void ReadStored(const ZipEntry& e, void* dst) const;

 private:
  void ReadAt(uint64_t offset, uint64_t n, void* dst, const std::string& what) const;
  struct EndRecord;  // where the central directory lies (zip_reader.cc)
  void ReadCentralDirectory();
  // The end of central directory record, in its ZIP64 form where it says so.
  EndRecord ReadEndRecord() const;
  void ReadZip64EndRecord(EndRecord* r) const;
  // Where the entry's data begins, from its local header.
  uint64_t DataOffset(const ZipEntry& e) const;
  std::string Inflate(const ZipEntry& e, uint64_t offset) const;
  void CheckCrc(const ZipEntry& e, const void* data) const;

  std::string path_;
  int fd_ = -1;
  uint64_t file_size_ = 0;
  std::vector<ZipEntry> entries_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace cnnflow
