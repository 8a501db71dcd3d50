// LMDB access for data sets: LmdbReader (read-only, memory-mapped, random
// access by index, zero-copy values, one read transaction per reader
// thread) and LmdbWriter (creates a new LMDB atomically, batched commits,
// map grown automatically). Values are opaque bytes here; loaders/record.h
// decodes them. Every LMDB call is checked: a failure throws Error naming
// the call, the path and mdb_strerror's text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace cnnflow {

class LmdbReader {
 public:
  // Opens the LMDB at `path`: a directory holding data.mdb, or the data file
  // itself (MDB_NOSUBDIR). Flags: MDB_RDONLY; MDB_NOTLS, so a read
  // transaction is not tied to the thread that began it; MDB_NOLOCK: no lock
  // file is used or created, so data sets on read-only media open, several
  // readers in one process are fine, and no reader-slot limit applies; the
  // price is that a writer changing the LMDB while it is read is NOT
  // detected (data sets are written once by LmdbWriter, then only read).
  // Scans the keys once, in LMDB order (bytewise; "%08d" keys = index
  // order). Throws Error for a missing path, a file or directory that is
  // not an LMDB, or an empty database, with the path in the message.
  explicit LmdbReader(const std::string& path);
  ~LmdbReader();
  LmdbReader(const LmdbReader&) = delete;
  LmdbReader& operator=(const LmdbReader&) = delete;

  int64_t size() const { return count_; }
  const std::string& path() const { return path_; }

  // The value of record `index` (0 <= index < size(), else Error), zero-copy
  // from the memory map. Safe from any number of threads at once. Each
  // calling thread gets its own read-only transaction on first use (taken
  // from a pool owned by the reader); it stays open, so a returned view is
  // valid until the SAME thread calls ReleaseThreadTransaction(), or the
  // reader is destroyed. Views from different threads are independent.
  // The bytes may be unaligned (LMDB aligns values to 2 bytes).
  std::string_view Get(int64_t index) const;

  // Ends the calling thread's read transaction (mdb_txn_reset): its views
  // become invalid; the next Get renews it. Only needed to let LMDB reclaim
  // pages under a concurrent writer, or to bound a thread's snapshot.
  void ReleaseThreadTransaction() const;

  // Record `index`'s key, for messages (valid while the reader lives).
  std::string_view Key(int64_t index) const;

 private:
  struct Env;  // the environment and its transaction pool, shared with threads' caches
  struct Txn;
  Txn* ThreadTxn() const;

  std::string path_;
  std::shared_ptr<Env> env_;
  uint64_t id_ = 0;  // unique per reader, keys the thread-local caches
  int64_t count_ = 0;
  // Keys, compactly: one blob; either a fixed stride (all keys the same
  // length, as with "%08d") or offsets (size count_ + 1).
  std::string key_blob_;
  size_t key_stride_ = 0;
  std::vector<uint64_t> key_offsets_;
};

class LmdbWriter {
 public:
  struct Options {
    // The first map size; doubled (mdb_env_set_mapsize, then the batch is
    // replayed) whenever LMDB reports MDB_MAP_FULL.
    size_t initial_map_size = size_t{64} << 20;
    // Commit after this many puts, or this many bytes of values, whichever
    // comes first. The uncommitted batch is kept in memory for the replay.
    int64_t commit_every = 1000;
    size_t commit_bytes = size_t{64} << 20;
    // Replace an existing LMDB at `path` on Finish(); else the constructor
    // throws if `path` exists.
    bool overwrite = false;
  };

  // Creates the LMDB as the directory `path` + ".tmp" (a stale one is
  // removed); Finish() renames it to `path`, so readers never see a half
  // written data set. Throws Error if `path` exists (without overwrite) or
  // LMDB fails.
  explicit LmdbWriter(const std::string& path) : LmdbWriter(path, Options()) {}
  LmdbWriter(const std::string& path, Options options);
  // Without Finish(): the pending batch is dropped and the .tmp directory
  // removed (no partial data set is left behind).
  ~LmdbWriter();
  LmdbWriter(const LmdbWriter&) = delete;
  LmdbWriter& operator=(const LmdbWriter&) = delete;

  // Stores value under key. A key already written throws Error ("duplicate
  // key"). Keys in increasing byte order are appended (MDB_APPEND: fast,
  // dense pages); others are inserted normally.
  void Put(std::string_view key, std::string_view value);
  // Commits, syncs to disk, closes, renames to `path`. Idempotent.
  void Finish();

  int64_t count() const { return count_; }
  size_t map_size() const { return map_size_; }
  const std::string& path() const { return path_; }

  // "%08d"-style key for record `index` (zero-padded to 8 digits, more
  // digits when needed), so bytewise order = index order up to 10^8.
  static std::string IndexKey(int64_t index);

 private:
  void Begin();
  void Commit();
  void GrowAndReplay();
  void Close();

  std::string path_, tmp_path_;
  Options options_;
  struct State;
  std::unique_ptr<State> state_;
  size_t map_size_ = 0;
  int64_t count_ = 0;
  bool finished_ = false;
};

}  // namespace cnnflow
