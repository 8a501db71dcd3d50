// The restricted pickle machine that the .pth reader (ops/io/pth.cc) runs a
// torch.save archive's <archive>/data.pkl on; internal to that reader, not
// a general unpickler. Nothing from the file is ever called: it builds plain
// values in an arena of its own and hands back the root.
// Accepts only the opcodes torch.load(weights_only=True) accepts
// (torch/_weights_only_unpickler.py), of any protocol, and of those only
// what a state dict of tensors needs: containers (tuple, list, dict, an
// empty set), None, bools, ints up to 64 bits, floats, strings, the memo,
// and the globals collections.OrderedDict, torch._utils._rebuild_tensor_v2
// and _rebuild_parameter, and the torch.<Type>Storage classes, which only
// persistent ids ('storage', type, key, location, numel) may name.
// Refuses everything else, NEWOBJ included (a pickled class; a state dict
// has none): a global torch allows but cnnflow does not read (a tensor
// subclass, a complex or quantized storage) and one torch refuses too
// (os.system, builtins.eval, a whole nn.Module) are told apart in the
// message, which names the file, the byte offset and the opcode. A tensor
// view that reaches past its storage is refused when it is rebuilt.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ops/dtype.h"

namespace cnnflow {

// A state dict's pickle is KBs per thousand tensors; the .pth reader refuses
// a bigger one before the machine runs (values are indexed by 32 bits).
constexpr uint64_t kMaxPickleBytes = 1 << 30;

// The values the restricted pickle machine builds. They live in one arena
// and refer to each other by index, so a pickle that makes a container hold
// itself (through the memo) costs nothing and leaks nothing.
enum class PickleKind : uint8_t {
  kNone,
  kBool,
  kInt,
  kFloat,
  kString,
  kTuple,
  kList,
  kDict,
  kSet,
  kGlobal,
  kStorage,
  kTensor
};

// "a list", "an int": for messages.
std::string KindWithArticle(PickleKind k);

// The globals a state dict needs; every other is refused at GLOBAL.
enum class PickleGlobal : uint8_t {
  kOrderedDict,
  kRebuildTensorV2,
  kRebuildParameter,
  kStorageType
};

// How a storage's elements read: as they are, or widened to int64.
enum class StorageElem : uint8_t { kSame, kI32, kI16, kI8, kU8, kBool };

struct TorchStorageType {
  const char* name;  // torch.<name>
  DType dtype;       // of the tensors it yields
  int bytes;         // per element in the file
  StorageElem elem;
};

inline constexpr TorchStorageType kTorchStorageTypes[] = {
    {"FloatStorage", DType::kF32, 4, StorageElem::kSame},
    {"DoubleStorage", DType::kF64, 8, StorageElem::kSame},
    {"HalfStorage", DType::kF16, 2, StorageElem::kSame},
    {"BFloat16Storage", DType::kBF16, 2, StorageElem::kSame},
    {"LongStorage", DType::kI64, 8, StorageElem::kSame},
    {"IntStorage", DType::kI64, 4, StorageElem::kI32},
    {"ShortStorage", DType::kI64, 2, StorageElem::kI16},
    {"CharStorage", DType::kI64, 1, StorageElem::kI8},
    {"ByteStorage", DType::kI64, 1, StorageElem::kU8},
    {"BoolStorage", DType::kI64, 1, StorageElem::kBool},
};

// PickleValue::type of a dict that collections.OrderedDict made (BUILD may
// set its attributes, as torch allows for OrderedDict only).
constexpr uint8_t kPickleOrderedDict = 1;

// 16 bytes: what a value holds beyond a number lives in a side table.
struct PickleValue {
  PickleKind kind = PickleKind::kNone;
  PickleGlobal global = PickleGlobal::kOrderedDict;  // kGlobal
  uint8_t type = 0;  // kGlobal kStorageType: in kTorchStorageTypes; kDict: kPickleOrderedDict or 0
  // kBool, kInt: the number; kFloat: its bits; kString, kGlobal ("module.name"):
  // index into strings_; kTuple, kList: lists_; kDict: dicts_; kStorage:
  // storages_; kTensor: tensors_.
  int64_t i = 0;
};

// A storage a persistent id names.
struct PickleStorage {
  std::string key;  // <archive>/data/<key>
  int type;         // in kTorchStorageTypes
  int64_t numel;
};

// A tensor _rebuild_tensor_v2 made: a view of a storage that lies within it.
struct PickleTensor {
  int storage;  // in Unpickler::storage
  int64_t offset;
  std::vector<int64_t> size, stride;
};

struct PickleDict {
  std::vector<std::pair<uint32_t, uint32_t>> entries;  // key, value; in insertion order
  std::unordered_map<std::string, size_t> index;       // by KeyText, where it has one
};

// A string for an error message: quoted, cut at 60 bytes, control bytes escaped.
std::string QuoteForMessage(std::string_view s);

// A pickle machine that knows only the opcodes torch's weights-only
// unpickler knows (torch/_weights_only_unpickler.py), and of those not
// NEWOBJ (it builds classes; a state dict has none). Globals are names that
// map to the fixed set above; REDUCE calls only those, by our code.
class Unpickler {
 public:
  // `data` must outlive the machine; `where` ("<file>: <archive>/data.pkl")
  // begins every error message.
  Unpickler(std::string_view data, std::string where) : data_(data), where_(std::move(where)) {}

  // Runs to STOP; returns the root value. Throws Error.
  uint32_t Run();

  const PickleValue& at(uint32_t v) const { return values_[v]; }
  const std::string& str(const PickleValue& v) const { return strings_[v.i]; }
  const PickleDict& dict(const PickleValue& v) const { return dicts_[v.i]; }
  const PickleTensor& tensor(const PickleValue& v) const { return tensors_[v.i]; }
  const PickleStorage& storage(int s) const { return storages_[s]; }

 private:
  [[noreturn]] void Fail(const std::string& what, const char* sep = ": ") const;

  // ---- reading
  std::string_view Bytes(uint64_t n);
  uint8_t U8();
  uint32_t U32();
  std::string_view Line();

  // ---- values and the stack
  uint32_t New(PickleKind kind, size_t side = 0);
  uint32_t NewList(PickleKind kind, std::vector<uint32_t> items = {});
  uint32_t NewDict();
  uint32_t Push(uint32_t v);
  size_t Base() const;
  uint32_t Pop();
  uint32_t Top();
  std::vector<uint32_t> PopMark();
  PickleValue Expect(uint32_t v, PickleKind kind, const char* what) const;
  std::vector<uint32_t>& ListAt(uint32_t v);

  // ---- the opcodes
  void Step();
  void PushScalar();
  void PushGlobal();
  void Reduce();
  void RebuildTensor(const std::vector<uint32_t>& args);
  void PersistentId();
  void SetItem(uint32_t dict, uint32_t key, uint32_t value);
  std::string KeyText(uint32_t key) const;

  std::string_view data_;
  std::string where_;
  size_t pos_ = 0, op_at_ = 0;
  uint8_t op_ = 0;
  std::vector<PickleValue> values_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, uint32_t> memo_;
  uint32_t empty_tuple_ = UINT32_MAX;  // tuples are immutable: one () serves all
  std::vector<std::string> strings_;
  std::vector<std::vector<uint32_t>> lists_;
  std::vector<PickleDict> dicts_;
  std::vector<PickleTensor> tensors_;
  std::vector<PickleStorage> storages_;
  std::map<std::string, int> storage_by_key_;
};

}  // namespace cnnflow
