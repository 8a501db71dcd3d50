#include "loaders/lmdb_store.h"

#include <lmdb.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <system_error>
#include <utility>

#include "ops/error.h"

namespace cnnflow {
namespace {

namespace fs = std::filesystem;

// Throws Error naming the LMDB function, the path and LMDB's message.
void LmdbCheck(int rc, const char* expr, const std::string& path) {
  if (rc == MDB_SUCCESS) return;
  std::string_view call(expr);
  call = call.substr(0, call.find('('));
  throw Error(StrCat(call, " failed for LMDB '", path, "': ", mdb_strerror(rc)));
}

#define CNNFLOW_LMDB_CHECK(call, path) ::cnnflow::LmdbCheck((call), #call, (path))

MDB_val Val(std::string_view s) { return MDB_val{s.size(), const_cast<char*>(s.data())}; }
std::string_view View(const MDB_val& v) { return {static_cast<const char*>(v.mv_data), v.mv_size}; }

std::atomic<uint64_t> next_reader_id{1};

}  // namespace

// ---------------------------------------------------------------- reader

struct LmdbReader::Env {
  std::string path;
  MDB_env* env = nullptr;
  MDB_dbi dbi = 0;
  std::mutex mu;               // guards the pool
  std::vector<MDB_txn*> all;   // every transaction made; aborted at the end
  std::vector<MDB_txn*> free;  // reset transactions returned by exited threads

  ~Env() {
    for (MDB_txn* t : all) mdb_txn_abort(t);
    if (env) mdb_env_close(env);
  }
};

struct LmdbReader::Txn {
  MDB_txn* txn = nullptr;
  bool active = false;  // false: reset, renew before use
};

LmdbReader::LmdbReader(const std::string& path) : path_(path), id_(next_reader_id++) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw Error(StrCat("LMDB path does not exist: '", path, "'"));
  unsigned flags = MDB_RDONLY | MDB_NOTLS | MDB_NOLOCK;
  if (fs::is_directory(st)) {
    if (!fs::exists(fs::path(path) / "data.mdb", ec)) {
      throw Error(StrCat("'", path, "' is a directory without data.mdb: not an LMDB"));
    }
  } else {
    flags |= MDB_NOSUBDIR;
  }
  env_ = std::make_shared<Env>();
  env_->path = path;
  CNNFLOW_LMDB_CHECK(mdb_env_create(&env_->env), path);
  CNNFLOW_LMDB_CHECK(mdb_env_open(env_->env, path.c_str(), flags, 0664), path);

  MDB_txn* txn = nullptr;
  CNNFLOW_LMDB_CHECK(mdb_txn_begin(env_->env, nullptr, MDB_RDONLY, &txn), path);
  env_->all.push_back(txn);  // owned by the pool from here on
  CNNFLOW_LMDB_CHECK(mdb_dbi_open(txn, nullptr, 0, &env_->dbi), path);
  MDB_stat stat;
  CNNFLOW_LMDB_CHECK(mdb_stat(txn, env_->dbi, &stat), path);
  if (stat.ms_entries == 0)
    throw Error(StrCat("LMDB '", path, "' holds no records (empty database)"));

  // One cursor scan: keys in LMDB order.
  MDB_cursor* cursor = nullptr;
  CNNFLOW_LMDB_CHECK(mdb_cursor_open(txn, env_->dbi, &cursor), path);
  std::vector<uint64_t> offsets;
  offsets.reserve(stat.ms_entries + 1);
  offsets.push_back(0);
  MDB_val k, v;
  int rc = mdb_cursor_get(cursor, &k, &v, MDB_FIRST);
  while (rc == MDB_SUCCESS) {
    key_blob_.append(static_cast<const char*>(k.mv_data), k.mv_size);
    offsets.push_back(key_blob_.size());
    rc = mdb_cursor_get(cursor, &k, &v, MDB_NEXT);
  }
  mdb_cursor_close(cursor);
  if (rc != MDB_NOTFOUND) CNNFLOW_LMDB_CHECK(rc, path);
  count_ = static_cast<int64_t>(offsets.size()) - 1;
  if (count_ == 0) throw Error(StrCat("LMDB '", path, "' holds no records (empty database)"));

  // Fixed-length keys need no offsets.
  const uint64_t stride = offsets[1];
  bool uniform = stride > 0;
  for (size_t i = 1; uniform && i < offsets.size(); ++i)
    uniform = offsets[i] - offsets[i - 1] == stride;
  if (uniform) {
    key_stride_ = stride;
  } else {
    key_offsets_ = std::move(offsets);
  }
  key_blob_.shrink_to_fit();

  mdb_txn_reset(txn);
  env_->free.push_back(txn);
}

LmdbReader::~LmdbReader() = default;  // the last owner of env_ aborts all transactions

LmdbReader::Txn* LmdbReader::ThreadTxn() const {
  // Per thread: the transactions this thread holds, one per reader. On
  // thread exit they go back to their reader's pool (if it still lives).
  struct Entry {
    uint64_t id;
    std::weak_ptr<Env> env;
    Txn txn;
  };
  struct Cache {
    std::vector<Entry> entries;
    ~Cache() {
      for (Entry& e : entries) {
        if (std::shared_ptr<Env> env = e.env.lock()) {
          if (e.txn.active) mdb_txn_reset(e.txn.txn);
          std::lock_guard<std::mutex> lock(env->mu);
          env->free.push_back(e.txn.txn);
        }
      }
    }
  };
  thread_local Cache cache;

  for (size_t i = 0; i < cache.entries.size(); ++i) {
    Entry& e = cache.entries[i];
    if (e.id == id_) return &e.txn;
    if (e.env.expired()) {  // its reader is gone and has aborted the txn
      cache.entries.erase(cache.entries.begin() + i);
      --i;
    }
  }
  Txn txn;
  {
    std::lock_guard<std::mutex> lock(env_->mu);
    if (!env_->free.empty()) {
      txn.txn = env_->free.back();
      env_->free.pop_back();
    }
  }
  if (txn.txn == nullptr) {
    CNNFLOW_LMDB_CHECK(mdb_txn_begin(env_->env, nullptr, MDB_RDONLY, &txn.txn), path_);
    txn.active = true;
    std::lock_guard<std::mutex> lock(env_->mu);
    env_->all.push_back(txn.txn);
  }
  cache.entries.push_back(Entry{id_, env_, txn});
  return &cache.entries.back().txn;
}

std::string_view LmdbReader::Get(int64_t index) const {
  CNNFLOW_ENFORCE(index >= 0 && index < count_, "LMDB '", path_, "': index ", index,
                  " out of range [0, ", count_, ")");
  Txn* t = ThreadTxn();
  if (!t->active) {
    CNNFLOW_LMDB_CHECK(mdb_txn_renew(t->txn), path_);
    t->active = true;
  }
  MDB_val k = Val(Key(index)), v;
  const int rc = mdb_get(t->txn, env_->dbi, &k, &v);
  if (rc == MDB_NOTFOUND) {
    throw Error(StrCat("LMDB '", path_, "': key '", Key(index), "' (index ", index,
                       ") vanished: was the LMDB changed while open?"));
  }
  CNNFLOW_LMDB_CHECK(rc, path_);
  return View(v);
}

void LmdbReader::ReleaseThreadTransaction() const {
  Txn* t = ThreadTxn();
  if (t->active) {
    mdb_txn_reset(t->txn);
    t->active = false;
  }
}

std::string_view LmdbReader::Key(int64_t index) const {
  CNNFLOW_ENFORCE(index >= 0 && index < count_, "LMDB '", path_, "': index ", index,
                  " out of range [0, ", count_, ")");
  if (key_stride_) return std::string_view(key_blob_).substr(index * key_stride_, key_stride_);
  return std::string_view(key_blob_).substr(key_offsets_[index],
                                            key_offsets_[index + 1] - key_offsets_[index]);
}

// ---------------------------------------------------------------- writer

struct LmdbWriter::State {
  MDB_env* env = nullptr;
  MDB_txn* txn = nullptr;
  MDB_dbi dbi = 0;
  // The uncommitted batch, replayed after the map grows.
  std::vector<std::pair<std::string, std::string>> pending;
  size_t pending_bytes = 0;
  std::string max_key, committed_max_key;  // the largest key written / committed
  bool any_key = false, any_committed_key = false;
};

std::string LmdbWriter::IndexKey(int64_t index) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%08lld", static_cast<long long>(index));
  return buf;
}

LmdbWriter::LmdbWriter(const std::string& path, Options options)
    : path_(path), tmp_path_(path + ".tmp"), options_(options), state_(std::make_unique<State>()) {
  CNNFLOW_ENFORCE(options_.initial_map_size > 0 && options_.commit_every > 0, "LmdbWriter for '",
                  path, "': initial_map_size and commit_every must be positive");
  std::error_code ec;
  if (!options_.overwrite && fs::exists(path, ec)) {
    throw Error(StrCat("LMDB '", path, "' already exists (set overwrite to replace it)"));
  }
  fs::remove_all(tmp_path_, ec);
  if (ec) throw Error(StrCat("cannot remove the stale '", tmp_path_, "': ", ec.message()));
  fs::create_directories(tmp_path_, ec);
  if (ec) throw Error(StrCat("cannot create '", tmp_path_, "': ", ec.message()));
  map_size_ = options_.initial_map_size;
  try {
    CNNFLOW_LMDB_CHECK(mdb_env_create(&state_->env), tmp_path_);
    CNNFLOW_LMDB_CHECK(mdb_env_set_mapsize(state_->env, map_size_), tmp_path_);
    // MDB_NOSYNC: one fsync at Finish() instead of one per commit.
    CNNFLOW_LMDB_CHECK(mdb_env_open(state_->env, tmp_path_.c_str(), MDB_NOSYNC, 0664), tmp_path_);
    MDB_envinfo info;
    CNNFLOW_LMDB_CHECK(mdb_env_info(state_->env, &info), tmp_path_);
    map_size_ = info.me_mapsize;  // LMDB rounds up to whole pages
    Begin();
  } catch (...) {
    Close();
    fs::remove_all(tmp_path_, ec);
    throw;
  }
}

LmdbWriter::~LmdbWriter() {
  if (finished_) return;
  Close();
  std::error_code ec;
  fs::remove_all(tmp_path_, ec);
}

void LmdbWriter::Close() {
  if (state_->txn) mdb_txn_abort(state_->txn);
  state_->txn = nullptr;
  if (state_->env) mdb_env_close(state_->env);
  state_->env = nullptr;
}

void LmdbWriter::Begin() {
  CNNFLOW_LMDB_CHECK(mdb_txn_begin(state_->env, nullptr, 0, &state_->txn), tmp_path_);
  CNNFLOW_LMDB_CHECK(mdb_dbi_open(state_->txn, nullptr, 0, &state_->dbi), tmp_path_);
}

namespace {

// One put: appended when the key is past every key written (fast, dense
// pages), else a normal insert; never overwrites. Returns LMDB's code.
int PutOne(MDB_txn* txn, MDB_dbi dbi, std::string_view key, std::string_view value,
           std::string* max_key, bool* any_key) {
  const bool append = !*any_key || key > std::string_view(*max_key);
  MDB_val k = Val(key), v = Val(value);
  const int rc = mdb_put(txn, dbi, &k, &v, MDB_NOOVERWRITE | (append ? MDB_APPEND : 0));
  if (rc == MDB_SUCCESS && append) {
    max_key->assign(key);
    *any_key = true;
  }
  return rc;
}

}  // namespace

void LmdbWriter::GrowAndReplay() {
  State& s = *state_;
  for (;;) {
    if (s.txn) mdb_txn_abort(s.txn);
    s.txn = nullptr;
    map_size_ *= 2;
    CNNFLOW_LMDB_CHECK(mdb_env_set_mapsize(s.env, map_size_), tmp_path_);
    Begin();
    s.max_key = s.committed_max_key;
    s.any_key = s.any_committed_key;
    int rc = MDB_SUCCESS;
    for (const auto& [key, value] : s.pending) {
      rc = PutOne(s.txn, s.dbi, key, value, &s.max_key, &s.any_key);
      if (rc != MDB_SUCCESS) break;
    }
    if (rc == MDB_MAP_FULL) continue;
    CNNFLOW_LMDB_CHECK(rc, tmp_path_);
    return;
  }
}

void LmdbWriter::Commit() {
  State& s = *state_;
  for (;;) {
    const int rc = mdb_txn_commit(s.txn);
    s.txn = nullptr;  // freed by commit, even on failure
    if (rc == MDB_MAP_FULL) {
      GrowAndReplay();
      continue;
    }
    CNNFLOW_LMDB_CHECK(rc, tmp_path_);
    break;
  }
  s.pending.clear();
  s.pending_bytes = 0;
  s.committed_max_key = s.max_key;
  s.any_committed_key = s.any_key;
}

void LmdbWriter::Put(std::string_view key, std::string_view value) {
  CNNFLOW_ENFORCE(!finished_, "LmdbWriter '", path_, "': Put after Finish");
  State& s = *state_;
  CNNFLOW_ENFORCE(s.txn != nullptr, "LmdbWriter '", path_, "': Put after an earlier LMDB failure");
  if (static_cast<int64_t>(s.pending.size()) >= options_.commit_every ||
      s.pending_bytes >= options_.commit_bytes) {
    Commit();
    Begin();
  }
  for (;;) {
    const int rc = PutOne(s.txn, s.dbi, key, value, &s.max_key, &s.any_key);
    if (rc == MDB_MAP_FULL) {
      GrowAndReplay();
      continue;
    }
    if (rc == MDB_KEYEXIST) throw Error(StrCat("LMDB '", path_, "': duplicate key '", key, "'"));
    CNNFLOW_LMDB_CHECK(rc, tmp_path_);
    break;
  }
  s.pending.emplace_back(key, value);
  s.pending_bytes += key.size() + value.size();
  ++count_;
}

void LmdbWriter::Finish() {
  if (finished_) return;
  State& s = *state_;
  Commit();
  CNNFLOW_LMDB_CHECK(mdb_env_sync(s.env, 1), tmp_path_);
  Close();
  std::error_code ec;
  if (options_.overwrite) fs::remove_all(path_, ec);
  fs::rename(tmp_path_, path_, ec);
  if (ec) throw Error(StrCat("cannot rename '", tmp_path_, "' to '", path_, "': ", ec.message()));
  finished_ = true;
}

}  // namespace cnnflow
