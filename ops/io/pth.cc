#include "ops/io/pth.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ops/error.h"
#include "ops/io/zip_reader.h"

namespace cnnflow {

static_assert(std::endian::native == std::endian::little,
              "torch.save data is little-endian; a big-endian host needs byte swaps here");

namespace {

// ------------------------------------------------------------------ values

// A state dict's pickle is KBs per thousand tensors; bigger is refused.
constexpr uint64_t kMaxPickleBytes = 1 << 30;

// The values the restricted pickle machine builds. They live in one arena
// and refer to each other by index, so a pickle that makes a container hold
// itself (through the memo) costs nothing and leaks nothing.
enum class Kind : uint8_t {
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

const char* KindName(Kind k) {
  static const char* const kNames[] = {"None", "bool", "int", "float",  "str",     "tuple",
                                       "list", "dict", "set", "global", "storage", "tensor"};
  return kNames[static_cast<int>(k)];
}

// "a list", "an int": for messages.
std::string AKind(Kind k) {
  const std::string name = KindName(k);
  return (name == "int" ? "an " : "a ") + name;
}

// The globals a state dict needs; every other is refused at GLOBAL.
enum class Global : uint8_t { kOrderedDict, kRebuildTensorV2, kRebuildParameter, kStorageType };

// How a storage's elements read: as they are, or widened to int64.
enum class Elem : uint8_t { kSame, kI32, kI16, kI8, kU8, kBool };

struct StorageType {
  const char* name;  // torch.<name>
  DType dtype;       // of the tensors it yields
  int bytes;         // per element in the file
  Elem elem;
};

constexpr StorageType kStorageTypes[] = {
    {"FloatStorage", DType::kF32, 4, Elem::kSame},
    {"DoubleStorage", DType::kF64, 8, Elem::kSame},
    {"HalfStorage", DType::kF16, 2, Elem::kSame},
    {"BFloat16Storage", DType::kBF16, 2, Elem::kSame},
    {"LongStorage", DType::kI64, 8, Elem::kSame},
    {"IntStorage", DType::kI64, 4, Elem::kI32},
    {"ShortStorage", DType::kI64, 2, Elem::kI16},
    {"CharStorage", DType::kI64, 1, Elem::kI8},
    {"ByteStorage", DType::kI64, 1, Elem::kU8},
    {"BoolStorage", DType::kI64, 1, Elem::kBool},
};

// Value::type of a dict that collections.OrderedDict made (BUILD may set
// its attributes, as torch allows for OrderedDict only).
constexpr uint8_t kOrdered = 1;

// 16 bytes: what a value holds beyond a number lives in a side table.
struct Value {
  Kind kind = Kind::kNone;
  Global global = Global::kOrderedDict;  // kGlobal
  uint8_t type = 0;  // kGlobal kStorageType: in kStorageTypes; kDict: kOrdered or 0
  // kBool, kInt: the number; kFloat: its bits; kString, kGlobal ("module.name"):
  // index into strings_; kTuple, kList: lists_; kDict: dicts_; kStorage:
  // storages_; kTensor: tensors_.
  int64_t i = 0;
};

struct StorageRef {
  std::string key;  // <archive>/data/<key>
  int type;         // in kStorageTypes
  int64_t numel;
};

struct TensorRef {
  int storage;  // in storages_
  int64_t offset;
  std::vector<int64_t> size, stride;
};

struct Dict {
  std::vector<std::pair<uint32_t, uint32_t>> entries;  // key, value; in insertion order
  std::unordered_map<std::string, size_t> index;       // by KeyText, where it has one
};

// A string for an error message: quoted, cut at 60 bytes, control bytes escaped.
std::string Quote(std::string_view s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 60; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += (c < 0x20 || c == 0x7f) ? std::string(hex) : std::string(1, static_cast<char>(c));
  }
  return out + (s.size() > 60 ? "...'" : "'");
}

// "opcode 0x63 GLOBAL": every protocol's opcodes by name, for messages.
std::string OpName(uint8_t op) {
  // Protocols 0-3 use printable characters; 2, 4 and 5 added 0x80-0x98.
  static constexpr std::string_view kLow = "(.012FIJKLMNPQRSTUVXabcd}eghijl]opqrst)uGBC";
  static constexpr std::string_view kLowNames =
      "MARK STOP POP POP_MARK DUP FLOAT INT BININT BININT1 LONG BININT2 NONE PERSID BINPERSID "
      "REDUCE STRING BINSTRING SHORT_BINSTRING UNICODE BINUNICODE APPEND BUILD GLOBAL DICT "
      "EMPTY_DICT APPENDS GET BINGET INST LONG_BINGET LIST EMPTY_LIST OBJ PUT BINPUT LONG_BINPUT "
      "SETITEM TUPLE EMPTY_TUPLE SETITEMS BINFLOAT BINBYTES SHORT_BINBYTES";
  static constexpr std::string_view kHighNames =
      "PROTO NEWOBJ EXT1 EXT2 EXT4 TUPLE1 TUPLE2 TUPLE3 NEWTRUE NEWFALSE LONG1 LONG4 "
      "SHORT_BINUNICODE BINUNICODE8 BINBYTES8 EMPTY_SET ADDITEMS FROZENSET NEWOBJ_EX "
      "STACK_GLOBAL MEMOIZE FRAME BYTEARRAY8 NEXT_BUFFER READONLY_BUFFER";
  // The k-th space-separated word of `names`, or "(unknown)".
  auto word = [](std::string_view names, size_t k) -> std::string_view {
    size_t at = 0;
    for (; k > 0 && at != std::string_view::npos; --k) {
      at = names.find(' ', at);
      if (at != std::string_view::npos) ++at;
    }
    if (at == std::string_view::npos || at >= names.size()) return "(unknown)";
    return names.substr(at, names.find(' ', at) - at);
  };
  const size_t low = kLow.find(static_cast<char>(op));
  const std::string_view name = op >= 0x80                      ? word(kHighNames, op - 0x80u)
                                : low != std::string_view::npos ? word(kLowNames, low)
                                                                : "(unknown)";
  char hex[8];
  std::snprintf(hex, sizeof hex, "0x%02x", op);
  return StrCat("opcode ", hex, " ", name);
}

// Globals torch.load(weights_only=True) allows that a state dict of plain
// tensors does not need (tensor subclasses, sizes, devices, dtypes, other
// rebuilds: torch/_weights_only_unpickler.py _get_allowed_globals).
bool TorchAllows(const std::string& g) {
  static constexpr std::string_view kExact =
      " collections.Counter torch.nn.parameter.Parameter torch.serialization._get_layout "
      "torch.Size torch.Tensor torch.device _codecs.encode builtins.bytearray builtins.set "
      "builtins.complex torch._tensor._rebuild_from_type_v2 torch.storage.UntypedStorage "
      "torch.storage.TypedStorage ";
  if (kExact.find(" " + g + " ") != std::string_view::npos) return true;
  if (g.rfind("torch._utils._rebuild_", 0) == 0) return true;
  if (g.rfind("torch.", 0) != 0 || g.find('.', 6) != std::string::npos) return false;
  // torch.<Type>Storage, torch.<Type>Tensor, torch.<dtype>, torch.<qscheme>
  const std::string name = g.substr(6);
  auto ends = [&](const std::string& e) {
    return name.size() > e.size() && name.compare(name.size() - e.size(), e.size(), e) == 0;
  };
  if (ends("Storage") || ends("Tensor")) return true;
  for (const char* p : {"float", "bfloat", "half", "double", "long", "short", "int", "uint", "bool",
                        "complex", "cfloat", "cdouble", "chalf", "qint", "quint", "bits", "per_"})
    if (name.rfind(p, 0) == 0) return true;
  return false;
}

// ------------------------------------------------------------------ the machine

// A pickle machine that knows only the opcodes torch's weights-only
// unpickler knows (torch/_weights_only_unpickler.py), and of those not
// NEWOBJ (it builds classes; a state dict has none). Globals are names that
// map to the fixed set above; REDUCE calls only those, by our code.
class Unpickler {
 public:
  Unpickler(std::string_view data, std::string where) : data_(data), where_(std::move(where)) {}

  // Runs to STOP; returns the root value.
  uint32_t Run() {
    while (pos_ < data_.size()) {
      op_at_ = pos_;
      op_ = U8();
      if (op_ == '.') return Pop();
      Step();
    }
    throw Error(StrCat(where_, ": ends at byte ", data_.size(), " without STOP (truncated?)"));
  }

  const Value& at(uint32_t v) const { return values_[v]; }
  const std::string& str(const Value& v) const { return strings_[v.i]; }
  const Dict& dict(const Value& v) const { return dicts_[v.i]; }
  const TensorRef& tensor(const Value& v) const { return tensors_[v.i]; }
  const StorageRef& storage(int s) const { return storages_[s]; }

 private:
  // "<file>: <archive>/data.pkl byte N: opcode 0xNN NAME<sep><what>"
  [[noreturn]] void Fail(const std::string& what, const char* sep = ": ") const {
    throw Error(StrCat(where_, " byte ", op_at_, ": ", OpName(op_), sep, what));
  }

  // ---- reading
  std::string_view Bytes(uint64_t n) {
    if (n > data_.size() - pos_) {
      Fail(StrCat("needs ", n, " bytes, ", data_.size() - pos_, " are left (truncated?)"));
    }
    std::string_view b = data_.substr(pos_, n);
    pos_ += n;
    return b;
  }
  uint8_t U8() { return static_cast<uint8_t>(Bytes(1)[0]); }
  uint32_t U32() {
    const std::string_view b = Bytes(4);
    uint32_t v;
    std::memcpy(&v, b.data(), 4);
    return v;
  }
  std::string_view Line() {
    const size_t end = data_.find('\n', pos_);
    if (end == std::string_view::npos) Fail("its line has no end (truncated?)");
    std::string_view line = data_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return line;
  }

  // ---- values and the stack
  // A new value; `side` is the size of its side table before it grows.
  uint32_t New(Kind kind, size_t side = 0) {
    values_.push_back({kind, Global::kOrderedDict, 0, static_cast<int64_t>(side)});
    return static_cast<uint32_t>(values_.size() - 1);
  }
  uint32_t NewList(Kind kind, std::vector<uint32_t> items = {}) {
    const uint32_t v = New(kind, lists_.size());
    lists_.push_back(std::move(items));
    return v;
  }
  uint32_t NewDict() {
    const uint32_t v = New(Kind::kDict, dicts_.size());
    dicts_.emplace_back();
    return v;
  }
  uint32_t Push(uint32_t v) {
    stack_.push_back(v);
    return v;
  }
  size_t Base() const { return marks_.empty() ? 0 : marks_.back(); }
  uint32_t Pop() {
    if (stack_.size() <= Base()) Fail("the stack is empty (past the last MARK)");
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  uint32_t Top() {
    if (stack_.size() <= Base()) Fail("the stack is empty (past the last MARK)");
    return stack_.back();
  }
  std::vector<uint32_t> PopMark() {
    if (marks_.empty()) Fail("no MARK to pop to");
    std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()),
                                stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  // The value (a copy: 16 bytes), failing unless it is of `kind`.
  Value Expect(uint32_t v, Kind kind, const char* what) const {
    if (values_[v].kind != kind) {
      Fail(StrCat(what, " is ", AKind(values_[v].kind), ", not ", AKind(kind)));
    }
    return values_[v];
  }
  std::vector<uint32_t>& ListAt(uint32_t v) {
    return lists_[Expect(v, Kind::kList, "the target").i];
  }

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
  std::vector<Value> values_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint32_t, uint32_t> memo_;
  uint32_t empty_tuple_ = UINT32_MAX;  // tuples are immutable: one () serves all
  std::vector<std::string> strings_;
  std::vector<std::vector<uint32_t>> lists_;
  std::vector<Dict> dicts_;
  std::vector<TensorRef> tensors_;
  std::vector<StorageRef> storages_;
  std::map<std::string, int> storage_by_key_;
};

void Unpickler::Step() {
  switch (op_) {
    case 0x80:  // PROTO: any protocol number; only the opcodes matter
      U8();
      return;
    case '(':  // MARK
      marks_.push_back(stack_.size());
      return;
    case 't':  // TUPLE
      Push(NewList(Kind::kTuple, PopMark()));
      return;
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
      std::vector<uint32_t> items(op_ - 0x84);
      for (size_t k = items.size(); k-- > 0;) items[k] = Pop();
      Push(NewList(Kind::kTuple, std::move(items)));
      return;
    }
    case ')':  // EMPTY_TUPLE
      if (empty_tuple_ == UINT32_MAX) empty_tuple_ = NewList(Kind::kTuple);
      Push(empty_tuple_);
      return;
    case ']':
      Push(NewList(Kind::kList));
      return;
    case 0x8f:
      Push(New(Kind::kSet));  // EMPTY_SET: stays empty (torch allows no ADDITEMS)
      return;
    case '}':
      Push(NewDict());
      return;
    case 'a': {  // APPEND
      const uint32_t item = Pop();
      ListAt(Top()).push_back(item);
      return;
    }
    case 'e': {  // APPENDS
      const std::vector<uint32_t> items = PopMark();
      std::vector<uint32_t>& list = ListAt(Top());
      list.insert(list.end(), items.begin(), items.end());
      return;
    }
    case 's': {  // SETITEM
      const uint32_t value = Pop(), key = Pop();
      SetItem(Top(), key, value);
      return;
    }
    case 'u': {  // SETITEMS
      const std::vector<uint32_t> items = PopMark();
      if (items.size() % 2) Fail(StrCat(items.size(), " items: keys and values do not pair"));
      const uint32_t d = Top();
      for (size_t k = 0; k < items.size(); k += 2) SetItem(d, items[k], items[k + 1]);
      return;
    }
    case 'q':    // BINPUT
    case 'r': {  // LONG_BINPUT
      const uint32_t slot = op_ == 'q' ? U8() : U32();
      memo_[slot] = Top();
      return;
    }
    case 'h':    // BINGET
    case 'j': {  // LONG_BINGET
      const uint32_t slot = op_ == 'h' ? U8() : U32();
      auto it = memo_.find(slot);
      if (it == memo_.end()) Fail(StrCat("memo slot ", slot, " is empty"));
      Push(it->second);
      return;
    }
    case 'c':
      PushGlobal();
      return;
    case 'R':
      Reduce();
      return;
    case 'b':  // BUILD: only an OrderedDict's attributes (state_dict's _metadata), ignored
      Pop();
      if (Expect(Top(), Kind::kDict, "the object BUILD sets the state of").type != kOrdered) {
        Fail("sets the state of a plain dict (torch.load(weights_only=True) refuses it too)");
      }
      return;
    case 'Q':
      PersistentId();
      return;
    default:
      PushScalar();
  }
}

void Unpickler::PushScalar() {
  const auto number = [&](Kind kind, int64_t i) { values_[Push(New(kind))].i = i; };
  switch (op_) {
    case 'N':
      Push(New(Kind::kNone));
      return;
    case 0x88:  // NEWTRUE
    case 0x89:  // NEWFALSE
      return number(Kind::kBool, op_ == 0x88);
    case 'K':  // BININT1
      return number(Kind::kInt, U8());
    case 'M': {  // BININT2
      const uint32_t lo = U8();
      return number(Kind::kInt, lo | (static_cast<uint32_t>(U8()) << 8));
    }
    case 'J':  // BININT
      return number(Kind::kInt, static_cast<int32_t>(U32()));
    case 0x8a: {  // LONG1: n bytes, little-endian two's complement
      const uint8_t n = U8();
      if (n > 8) Fail(StrCat("a ", int{n}, "-byte integer is wider than the 64 bits read here"));
      const std::string_view b = Bytes(n);
      uint64_t u = 0;
      for (size_t k = 0; k < n; ++k) u |= uint64_t{static_cast<uint8_t>(b[k])} << (8 * k);
      if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) u |= ~0ull << (8 * n);
      return number(Kind::kInt, static_cast<int64_t>(u));
    }
    case 'G': {  // BINFLOAT: a big-endian double, kept as its bits
      const std::string_view b = Bytes(8);
      uint64_t u = 0;
      for (size_t k = 0; k < 8; ++k) u = (u << 8) | static_cast<uint8_t>(b[k]);
      return number(Kind::kFloat, static_cast<int64_t>(u));
    }
    case 'X':    // BINUNICODE
    case 'U': {  // SHORT_BINSTRING
      const uint64_t n = op_ == 'X' ? U32() : U8();
      const std::string_view text = Bytes(n);
      Push(New(Kind::kString, strings_.size()));
      strings_.emplace_back(text);
      return;
    }
    case 0x81:
      Fail("builds an object of a class: a state dict has none (cnnflow reads tensors only)");
    default:
      Fail(
          "is not allowed (torch.load(weights_only=True) refuses it too); a state dict "
          "saved by torch.save needs only protocol 2's plain opcodes",
          " ");
  }
}

void Unpickler::PushGlobal() {
  std::string module(Line());
  const std::string name(Line());
  if (module == "__builtin__") module = "builtins";  // protocol 2's Python 2 name, as torch maps it
  const std::string full = StrCat(module, ".", name);
  Global g;
  uint8_t type = 0;
  if (full == "collections.OrderedDict") {
    g = Global::kOrderedDict;
  } else if (full == "torch._utils._rebuild_tensor_v2") {
    g = Global::kRebuildTensorV2;
  } else if (full == "torch._utils._rebuild_parameter") {
    g = Global::kRebuildParameter;
  } else {
    g = Global::kStorageType;
    while (type < std::size(kStorageTypes) &&
           (module != "torch" || name != kStorageTypes[type].name))
      ++type;
    if (type == std::size(kStorageTypes)) {
      if (TorchAllows(full)) {
        Fail(StrCat(Quote(full),
                    " is allowed by torch.load(weights_only=True) but not read by cnnflow, which "
                    "reads float32/64, float16, bfloat16, integer and bool tensors in dicts, "
                    "lists and tuples of plain values"),
             " ");
      }
      Fail(StrCat(Quote(full),
                  " is not allowed (torch.load(weights_only=True) refuses it too): a weights "
                  "file needs only collections.OrderedDict, torch._utils._rebuild_tensor_v2 "
                  "and torch.*Storage (save model.state_dict(), not the model)"),
           " ");
    }
  }
  const uint32_t v = Push(New(Kind::kGlobal, strings_.size()));
  strings_.push_back(full);
  values_[v].global = g;
  values_[v].type = type;
}

void Unpickler::Reduce() {
  const uint32_t args = Pop();
  const Value func = Expect(Top(), Kind::kGlobal, "the callable");
  const std::vector<uint32_t> a = lists_[Expect(args, Kind::kTuple, "the arguments").i];
  switch (func.global) {
    case Global::kOrderedDict:
      if (!a.empty()) Fail("collections.OrderedDict with arguments is not read");
      stack_.back() = NewDict();
      values_[stack_.back()].type = kOrdered;
      return;
    case Global::kRebuildTensorV2:
      RebuildTensor(a);
      return;
    case Global::kRebuildParameter:  // (data, requires_grad, backward_hooks): the tensor
      if (a.size() != 3) Fail("torch._utils._rebuild_parameter takes 3 arguments");
      Expect(a[0], Kind::kTensor, "the parameter's data");
      stack_.back() = a[0];
      return;
    case Global::kStorageType:
      Fail(StrCat("calls ", Quote(str(func)), ", a class only read in persistent ids"));
  }
}

void Unpickler::RebuildTensor(const std::vector<uint32_t>& a) {
  // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  if (a.size() != 6 && a.size() != 7) {
    Fail(StrCat("torch._utils._rebuild_tensor_v2 takes 6 or 7 arguments, not ", a.size()));
  }
  TensorRef t;
  t.storage = static_cast<int>(Expect(a[0], Kind::kStorage, "the tensor's storage").i);
  t.offset = Expect(a[1], Kind::kInt, "the storage offset").i;
  for (int k : {2, 3}) {
    const Value dims = Expect(a[k], Kind::kTuple, k == 2 ? "the size" : "the stride");
    for (uint32_t d : lists_[dims.i]) {
      const int64_t x = Expect(d, Kind::kInt, "a size or stride").i;
      if (x < 0) Fail(StrCat("a negative size or stride (", x, ") is not read"));
      (k == 2 ? t.size : t.stride).push_back(x);
    }
  }
  if (t.size.size() != t.stride.size()) {
    Fail(StrCat("size has ", t.size.size(), " dimensions, stride ", t.stride.size()));
  }
  // Every element the view reaches lies in the storage.
  const StorageRef& s = storages_[t.storage];
  int64_t numel = 1, last = t.offset;
  bool overflow = t.offset < 0;
  for (size_t d = 0; d < t.size.size(); ++d) {
    int64_t reach = 0;
    overflow |= __builtin_mul_overflow(numel, t.size[d], &numel);
    if (t.size[d] > 0) {
      overflow |= __builtin_mul_overflow(t.size[d] - 1, t.stride[d], &reach);
      overflow |= __builtin_add_overflow(last, reach, &last);
    }
  }
  if (overflow || (numel > 0 && last >= s.numel)) {
    Fail(StrCat("a tensor of size ", Shape(t.size), " stride ", Shape(t.stride), " at offset ",
                t.offset, " reaches past its storage '", s.key, "' of ", s.numel, " elements"));
  }
  stack_.back() = New(Kind::kTensor, tensors_.size());
  tensors_.push_back(std::move(t));
}

void Unpickler::PersistentId() {
  // ('storage', torch.<Type>Storage, key, location, numel)
  const std::vector<uint32_t> pid = lists_[Expect(Pop(), Kind::kTuple, "the persistent id").i];
  if (pid.size() != 5 || values_[pid[0]].kind != Kind::kString ||
      str(values_[pid[0]]) != "storage") {
    Fail("a persistent id must be ('storage', type, key, location, numel)");
  }
  const Value type = Expect(pid[1], Kind::kGlobal, "the storage type");
  if (type.global != Global::kStorageType) Fail(StrCat(Quote(str(type)), " is not a storage type"));
  const std::string key = str(Expect(pid[2], Kind::kString, "the storage key"));
  Expect(pid[3], Kind::kString, "the storage location");
  const int64_t numel = Expect(pid[4], Kind::kInt, "the storage size").i;
  if (numel < 0) Fail(StrCat("storage ", Quote(key), " has ", numel, " elements"));
  if (key.empty() || key.find_first_of("/\\") != std::string::npos || key == "." || key == "..") {
    Fail(StrCat("storage key ", Quote(key), " is not a plain name"));
  }
  auto [it, fresh] = storage_by_key_.emplace(key, static_cast<int>(storages_.size()));
  if (fresh) {
    storages_.push_back({key, type.type, numel});
  } else if (storages_[it->second].type != type.type || storages_[it->second].numel != numel) {
    Fail(StrCat("storage ", Quote(key), " is read as two types or sizes"));
  }
  Push(New(Kind::kStorage, static_cast<size_t>(it->second)));
}

std::string Unpickler::KeyText(uint32_t key) const {
  // Python's equal keys (1 == True) share a text; keys other than these
  // (floats, tuples) are kept apart even when equal.
  const Value& k = values_[key];
  switch (k.kind) {
    case Kind::kString:
      return "s" + str(k);
    case Kind::kInt:
    case Kind::kBool:
      return StrCat("i", k.i);
    case Kind::kNone:
      return "n";
    default:
      return "";
  }
}

void Unpickler::SetItem(uint32_t dict, uint32_t key, uint32_t value) {
  Dict& d = dicts_[Expect(dict, Kind::kDict, "the target").i];
  const std::string text = KeyText(key);
  if (!text.empty()) {
    auto [it, fresh] = d.index.emplace(text, d.entries.size());
    if (!fresh) {
      d.entries[it->second].second = value;  // Python keeps the first key, takes the last value
      return;
    }
  }
  d.entries.emplace_back(key, value);
}

// ------------------------------------------------------------------ tensors

// Copies the elements a view reaches, in row-major order, converting each
// (kBool: any byte but 0 is 1, as torch reads a bool).
template <typename Out, typename In, bool kBool = false>
void Gather(const unsigned char* src, const TensorRef& r, Out* dst, int64_t n) {
  const int rank = static_cast<int>(r.size.size());
  std::vector<int64_t> idx(rank, 0);
  int64_t at = r.offset;
  for (int64_t i = 0; i < n; ++i) {
    In v;
    std::memcpy(&v, src + at * static_cast<int64_t>(sizeof(In)), sizeof(In));
    dst[i] = kBool ? static_cast<Out>(v != 0) : static_cast<Out>(v);
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[d] < r.size[d]) {
        at += r.stride[d];
        break;
      }
      at -= (r.size[d] - 1) * r.stride[d];
      idx[d] = 0;
    }
  }
}

void GatherInto(const unsigned char* src, const StorageType& type, const TensorRef& r, Tensor& t) {
  const int64_t n = t.numel();
  if (n == 0) return;
  auto* i64 = static_cast<int64_t*>(t.raw_data());
  switch (type.elem) {
    case Elem::kI32:
      return Gather<int64_t, int32_t>(src, r, i64, n);
    case Elem::kI16:
      return Gather<int64_t, int16_t>(src, r, i64, n);
    case Elem::kI8:
      return Gather<int64_t, int8_t>(src, r, i64, n);
    case Elem::kU8:
      return Gather<int64_t, uint8_t>(src, r, i64, n);
    case Elem::kBool:
      return Gather<int64_t, uint8_t, true>(src, r, i64, n);
    case Elem::kSame:
      break;
  }
  switch (type.bytes) {
    case 2:
      return Gather<uint16_t, uint16_t>(src, r, static_cast<uint16_t*>(t.raw_data()), n);
    case 4:
      return Gather<uint32_t, uint32_t>(src, r, static_cast<uint32_t*>(t.raw_data()), n);
    default:
      return Gather<uint64_t, uint64_t>(src, r, static_cast<uint64_t*>(t.raw_data()), n);
  }
}

bool IsContiguous(const TensorRef& r) {
  int64_t expect = 1;
  for (size_t d = r.size.size(); d-- > 0;) {
    if (r.size[d] != 1 && r.stride[d] != expect) return false;
    expect *= r.size[d];
  }
  return true;
}

// Reads the tensors of the chosen dict from the archive's storages.
class TensorLoader {
 public:
  TensorLoader(const ZipReader& zip, std::string archive, const Unpickler& vm)
      : zip_(zip), archive_(std::move(archive)), vm_(vm) {}

  Tensor Load(const std::string& name, const TensorRef& r) {
    const std::string sig = StrCat(r.storage, "|", r.offset, "|", Shape(r.size), Shape(r.stride));
    auto seen = loaded_.find(sig);
    if (seen != loaded_.end()) return seen->second;  // the same view twice: shared
    const StorageRef& s = vm_.storage(r.storage);
    const StorageType& type = kStorageTypes[s.type];
    const std::string pre = StrCat(zip_.path(), ": tensor '", name, "': ");
    const ZipEntry* e = zip_.Find(StrCat(archive_, "/data/", s.key));
    if (!e) throw Error(StrCat(pre, "no entry ", archive_, "/data/", s.key, " for its storage"));
    int64_t bytes = 0;
    if (__builtin_mul_overflow(s.numel, static_cast<int64_t>(type.bytes), &bytes) ||
        static_cast<uint64_t>(bytes) != e->size) {
      throw Error(StrCat(pre, e->name, " holds ", e->size, " bytes, its ", type.name, " of ",
                         s.numel, " elements needs ", bytes));
    }
    const Shape shape(r.size);
    Tensor t;
    if (e->method == 0 && type.elem == Elem::kSame && r.offset == 0 && IsContiguous(r) &&
        shape.numel() == s.numel) {
      Account(s, shape.numel(), pre);
      t = Tensor::Empty(shape, type.dtype);
      if (e->size > 0) zip_.ReadStored(*e, t.raw_data());
    } else {
      if (cached_key_ != s.key) {
        cached_ = zip_.Read(*e);  // grows only as a deflated entry inflates
        cached_key_ = s.key;
      }
      Account(s, shape.numel(), pre);
      t = Tensor::Empty(shape, type.dtype);
      GatherInto(reinterpret_cast<const unsigned char*>(cached_.data()), type, r, t);
    }
    loaded_.emplace(sig, t);
    return t;
  }

 private:
  // The tensors made may hold at most twice the elements of the storages
  // read (+1M): views, tied weights and broadcasts fit; a pickle that
  // views one storage many times over to exhaust memory does not.
  void Account(const StorageRef& s, int64_t numel, const std::string& pre) {
    if (read_.insert(s.key).second) storage_elems_ += s.numel;
    if (__builtin_add_overflow(tensor_elems_, numel, &tensor_elems_) ||
        tensor_elems_ > 2 * storage_elems_ + (1 << 20)) {
      throw Error(StrCat(pre, "the tensors so far hold ", tensor_elems_, " elements from ",
                         storage_elems_, " stored ones: views repeat a storage too often"));
    }
  }

  const ZipReader& zip_;
  std::string archive_;
  const Unpickler& vm_;
  std::map<std::string, Tensor> loaded_;
  std::set<std::string> read_;
  int64_t storage_elems_ = 0, tensor_elems_ = 0;
  std::string cached_key_, cached_;
};

// ------------------------------------------------------------------ the file

// The archive's folder: the one "<archive>/data.pkl" entry.
std::string ArchiveName(const ZipReader& zip) {
  std::string archive;
  std::string names;
  for (const ZipEntry& e : zip.entries()) {
    if (names.size() < 200) names += StrCat(names.empty() ? "" : ", ", Quote(e.name));
    const size_t slash = e.name.find('/');
    if (slash == std::string::npos || e.name.compare(slash, std::string::npos, "/data.pkl") != 0)
      continue;
    if (!archive.empty()) {
      throw Error(StrCat(zip.path(), ": two data.pkl entries ('", archive, "/data.pkl' and '",
                         e.name, "')"));
    }
    archive = e.name.substr(0, slash);
  }
  if (archive.empty()) {
    throw Error(StrCat(zip.path(), ": a zip archive but not one torch.save wrote: no ",
                       "<archive>/data.pkl among its ", zip.entries().size(), " entries (", names,
                       ")"));
  }
  return archive;
}

void CheckArchive(const ZipReader& zip, const std::string& archive) {
  if (zip.Find(archive + "/constants.pkl")) {
    throw Error(StrCat(zip.path(),
                       ": a TorchScript archive (torch.jit.save), not a state dict: save the "
                       "weights with torch.save(model.state_dict(), path)"));
  }
  if (const ZipEntry* b = zip.Find(archive + "/byteorder")) {
    const std::string order = b->size <= 16 ? zip.Read(*b) : "?";
    if (order != "little") {
      throw Error(StrCat(zip.path(), ": byteorder ", Quote(order),
                         ": only little-endian archives are read"));
    }
  }
}

// The dict of tensors in the saved object; `wrapper` names the entry it
// came from, if any.
const Dict& StateDict(const Unpickler& vm, uint32_t root, const std::string& path,
                      std::string* wrapper) {
  const Value& r = vm.at(root);
  if (r.kind != Kind::kDict) {
    throw Error(StrCat(path, ": the saved object is ", AKind(r.kind),
                       ", not a dict of tensors (torch.save(model.state_dict(), path))"));
  }
  // The first entry that is not a tensor under a string key, or "".
  auto not_tensors = [&](const Dict& d) -> std::string {
    for (const auto& [k, v] : d.entries) {
      if (vm.at(k).kind != Kind::kString) return StrCat(AKind(vm.at(k).kind), " key");
      if (vm.at(v).kind != Kind::kTensor) {
        return StrCat("entry ", Quote(vm.str(vm.at(k))), " is ", AKind(vm.at(v).kind));
      }
    }
    return "";
  };
  const Dict& top = vm.dict(r);
  const std::string why = not_tensors(top);
  if (why.empty()) return top;
  for (const char* key : {"state_dict", "model", "model_state_dict"}) {
    for (const auto& [k, v] : top.entries) {
      const Value& kv = vm.at(k);
      if (kv.kind != Kind::kString || vm.str(kv) != key || vm.at(v).kind != Kind::kDict) continue;
      if (!not_tensors(vm.dict(vm.at(v))).empty()) continue;
      *wrapper = key;
      return vm.dict(vm.at(v));
    }
  }
  throw Error(StrCat(path, ": the saved dict is not a state dict (its ", why,
                     ") and has no 'state_dict', 'model' or 'model_state_dict' entry that is"));
}

// torch < 1.6 (and _use_new_zipfile_serialization=False) wrote a bare
// pickle stream: PROTO, then the magic number as a LONG1.
void RefuseLegacy(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return;  // ZipReader names the error
  unsigned char head[2] = {0, 0};
  const size_t n = std::fread(head, 1, 2, f);
  std::fclose(f);
  if (n == 2 && head[0] == 0x80 && head[1] <= 5) {
    throw Error(StrCat(path,
                       ": PyTorch's legacy format (a bare pickle: torch < 1.6, or "
                       "_use_new_zipfile_serialization=False), which is not read: re-save it with "
                       "torch.save(torch.load(path, weights_only=True), new_path) in PyTorch 1.6 "
                       "or newer"));
  }
}

}  // namespace

SafetensorsFile LoadPth(const std::string& path) {
  RefuseLegacy(path);
  const ZipReader zip(path);
  const std::string archive = ArchiveName(zip);
  CheckArchive(zip, archive);
  const std::string pkl_name = archive + "/data.pkl";
  const ZipEntry& pkl_entry = *zip.Find(pkl_name);
  if (pkl_entry.size > kMaxPickleBytes) {  // values are indexed by 32 bits
    throw Error(StrCat(path, ": ", pkl_name, " is ", pkl_entry.size, " bytes, over the ",
                       kMaxPickleBytes, " a state dict's pickle could need"));
  }
  const std::string pkl = zip.Read(pkl_entry);
  Unpickler vm(pkl, StrCat(path, ": ", pkl_name));
  const uint32_t root = vm.Run();

  SafetensorsFile out;
  std::string wrapper;
  const Dict& dict = StateDict(vm, root, path, &wrapper);
  out.metadata["format"] = "pth";
  if (!wrapper.empty()) out.metadata["pth.wrapper"] = wrapper;
  TensorLoader loader(zip, archive, vm);
  for (const auto& [k, v] : dict.entries) {
    const std::string& name = vm.str(vm.at(k));
    out.tensors.emplace_back(name, loader.Load(name, vm.tensor(vm.at(v))));
  }
  return out;
}

}  // namespace cnnflow
