#include "ops/io/pickle.h"

#include <cstdio>
#include <cstring>
#include <utility>

#include "ops/error.h"
#include "ops/shape.h"

namespace cnnflow {

namespace {

const char* KindName(PickleKind k) {
  static const char* const kNames[] = {"None", "bool", "int", "float",  "str",     "tuple",
                                       "list", "dict", "set", "global", "storage", "tensor"};
  return kNames[static_cast<int>(k)];
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

}  // namespace

std::string KindWithArticle(PickleKind k) {
  const std::string name = KindName(k);
  return (name == "int" ? "an " : "a ") + name;
}

std::string QuoteForMessage(std::string_view s) {
  std::string out = "'";
  for (size_t i = 0; i < s.size() && i < 60; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char hex[8];
    std::snprintf(hex, sizeof hex, "\\x%02x", c);
    out += (c < 0x20 || c == 0x7f) ? std::string(hex) : std::string(1, static_cast<char>(c));
  }
  return out + (s.size() > 60 ? "...'" : "'");
}

// ------------------------------------------------------------------ the machine

uint32_t Unpickler::Run() {
  while (pos_ < data_.size()) {
    op_at_ = pos_;
    op_ = U8();
    if (op_ == '.') return Pop();
    Step();
  }
  throw Error(StrCat(where_, ": ends at byte ", data_.size(), " without STOP (truncated?)"));
}

// "<file>: <archive>/data.pkl byte N: opcode 0xNN NAME<sep><what>"
void Unpickler::Fail(const std::string& what, const char* sep) const {
  throw Error(StrCat(where_, " byte ", op_at_, ": ", OpName(op_), sep, what));
}

// ---- reading

std::string_view Unpickler::Bytes(uint64_t n) {
  if (n > data_.size() - pos_) {
    Fail(StrCat("needs ", n, " bytes, ", data_.size() - pos_, " are left (truncated?)"));
  }
  std::string_view b = data_.substr(pos_, n);
  pos_ += n;
  return b;
}

uint8_t Unpickler::U8() { return static_cast<uint8_t>(Bytes(1)[0]); }

uint32_t Unpickler::U32() {
  const std::string_view b = Bytes(4);
  uint32_t v;
  std::memcpy(&v, b.data(), 4);
  return v;
}

std::string_view Unpickler::Line() {
  const size_t end = data_.find('\n', pos_);
  if (end == std::string_view::npos) Fail("its line has no end (truncated?)");
  std::string_view line = data_.substr(pos_, end - pos_);
  pos_ = end + 1;
  return line;
}

// ---- values and the stack

// A new value; `side` is the size of its side table before it grows.
uint32_t Unpickler::New(PickleKind kind, size_t side) {
  values_.push_back({kind, PickleGlobal::kOrderedDict, 0, static_cast<int64_t>(side)});
  return static_cast<uint32_t>(values_.size() - 1);
}

uint32_t Unpickler::NewList(PickleKind kind, std::vector<uint32_t> items) {
  const uint32_t v = New(kind, lists_.size());
  lists_.push_back(std::move(items));
  return v;
}

uint32_t Unpickler::NewDict() {
  const uint32_t v = New(PickleKind::kDict, dicts_.size());
  dicts_.emplace_back();
  return v;
}

uint32_t Unpickler::Push(uint32_t v) {
  stack_.push_back(v);
  return v;
}

size_t Unpickler::Base() const { return marks_.empty() ? 0 : marks_.back(); }

uint32_t Unpickler::Pop() {
  if (stack_.size() <= Base()) Fail("the stack is empty (past the last MARK)");
  const uint32_t v = stack_.back();
  stack_.pop_back();
  return v;
}

uint32_t Unpickler::Top() {
  if (stack_.size() <= Base()) Fail("the stack is empty (past the last MARK)");
  return stack_.back();
}

std::vector<uint32_t> Unpickler::PopMark() {
  if (marks_.empty()) Fail("no MARK to pop to");
  std::vector<uint32_t> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()),
                              stack_.end());
  stack_.resize(marks_.back());
  marks_.pop_back();
  return items;
}

// The value (a copy: 16 bytes), failing unless it is of `kind`.
PickleValue Unpickler::Expect(uint32_t v, PickleKind kind, const char* what) const {
  if (values_[v].kind != kind) {
    Fail(StrCat(what, " is ", KindWithArticle(values_[v].kind), ", not ", KindWithArticle(kind)));
  }
  return values_[v];
}

std::vector<uint32_t>& Unpickler::ListAt(uint32_t v) {
  return lists_[Expect(v, PickleKind::kList, "the target").i];
}

// ---- the opcodes

void Unpickler::Step() {
  switch (op_) {
    case 0x80:  // PROTO: any protocol number; only the opcodes matter
      U8();
      return;
    case '(':  // MARK
      marks_.push_back(stack_.size());
      return;
    case 't':  // TUPLE
      Push(NewList(PickleKind::kTuple, PopMark()));
      return;
    case 0x85:
    case 0x86:
    case 0x87: {  // TUPLE1, TUPLE2, TUPLE3
      std::vector<uint32_t> items(op_ - 0x84);
      for (size_t k = items.size(); k-- > 0;) items[k] = Pop();
      Push(NewList(PickleKind::kTuple, std::move(items)));
      return;
    }
    case ')':  // EMPTY_TUPLE
      if (empty_tuple_ == UINT32_MAX) empty_tuple_ = NewList(PickleKind::kTuple);
      Push(empty_tuple_);
      return;
    case ']':
      Push(NewList(PickleKind::kList));
      return;
    case 0x8f:
      Push(New(PickleKind::kSet));  // EMPTY_SET: stays empty (torch allows no ADDITEMS)
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
      if (Expect(Top(), PickleKind::kDict, "the object BUILD sets the state of").type !=
          kPickleOrderedDict) {
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
  const auto number = [&](PickleKind kind, int64_t i) { values_[Push(New(kind))].i = i; };
  switch (op_) {
    case 'N':
      Push(New(PickleKind::kNone));
      return;
    case 0x88:  // NEWTRUE
    case 0x89:  // NEWFALSE
      return number(PickleKind::kBool, op_ == 0x88);
    case 'K':  // BININT1
      return number(PickleKind::kInt, U8());
    case 'M': {  // BININT2
      const uint32_t lo = U8();
      return number(PickleKind::kInt, lo | (static_cast<uint32_t>(U8()) << 8));
    }
    case 'J':  // BININT
      return number(PickleKind::kInt, static_cast<int32_t>(U32()));
    case 0x8a: {  // LONG1: n bytes, little-endian two's complement
      const uint8_t n = U8();
      if (n > 8) Fail(StrCat("a ", int{n}, "-byte integer is wider than the 64 bits read here"));
      const std::string_view b = Bytes(n);
      uint64_t u = 0;
      for (size_t k = 0; k < n; ++k) u |= uint64_t{static_cast<uint8_t>(b[k])} << (8 * k);
      if (n > 0 && n < 8 && (static_cast<uint8_t>(b[n - 1]) & 0x80)) u |= ~0ull << (8 * n);
      return number(PickleKind::kInt, static_cast<int64_t>(u));
    }
    case 'G': {  // BINFLOAT: a big-endian double, kept as its bits
      const std::string_view b = Bytes(8);
      uint64_t u = 0;
      for (size_t k = 0; k < 8; ++k) u = (u << 8) | static_cast<uint8_t>(b[k]);
      return number(PickleKind::kFloat, static_cast<int64_t>(u));
    }
    case 'X':    // BINUNICODE
    case 'U': {  // SHORT_BINSTRING
      const uint64_t n = op_ == 'X' ? U32() : U8();
      const std::string_view text = Bytes(n);
      Push(New(PickleKind::kString, strings_.size()));
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
  PickleGlobal g;
  uint8_t type = 0;
  if (full == "collections.OrderedDict") {
    g = PickleGlobal::kOrderedDict;
  } else if (full == "torch._utils._rebuild_tensor_v2") {
    g = PickleGlobal::kRebuildTensorV2;
  } else if (full == "torch._utils._rebuild_parameter") {
    g = PickleGlobal::kRebuildParameter;
  } else {
    g = PickleGlobal::kStorageType;
    while (type < std::size(kTorchStorageTypes) &&
           (module != "torch" || name != kTorchStorageTypes[type].name))
      ++type;
    if (type == std::size(kTorchStorageTypes)) {
      if (TorchAllows(full)) {
        Fail(StrCat(QuoteForMessage(full),
                    " is allowed by torch.load(weights_only=True) but not read by cnnflow, which "
                    "reads float32/64, float16, bfloat16, integer and bool tensors in dicts, "
                    "lists and tuples of plain values"),
             " ");
      }
      Fail(StrCat(QuoteForMessage(full),
                  " is not allowed (torch.load(weights_only=True) refuses it too): a weights "
                  "file needs only collections.OrderedDict, torch._utils._rebuild_tensor_v2 "
                  "and torch.*Storage (save model.state_dict(), not the model)"),
           " ");
    }
  }
  const uint32_t v = Push(New(PickleKind::kGlobal, strings_.size()));
  strings_.push_back(full);
  values_[v].global = g;
  values_[v].type = type;
}

void Unpickler::Reduce() {
  const uint32_t args = Pop();
  const PickleValue func = Expect(Top(), PickleKind::kGlobal, "the callable");
  const std::vector<uint32_t> a = lists_[Expect(args, PickleKind::kTuple, "the arguments").i];
  switch (func.global) {
    case PickleGlobal::kOrderedDict:
      if (!a.empty()) Fail("collections.OrderedDict with arguments is not read");
      stack_.back() = NewDict();
      values_[stack_.back()].type = kPickleOrderedDict;
      return;
    case PickleGlobal::kRebuildTensorV2:
      RebuildTensor(a);
      return;
    case PickleGlobal::kRebuildParameter:  // (data, requires_grad, backward_hooks): the tensor
      if (a.size() != 3) Fail("torch._utils._rebuild_parameter takes 3 arguments");
      Expect(a[0], PickleKind::kTensor, "the parameter's data");
      stack_.back() = a[0];
      return;
    case PickleGlobal::kStorageType:
      Fail(StrCat("calls ", QuoteForMessage(str(func)), ", a class only read in persistent ids"));
  }
}

void Unpickler::RebuildTensor(const std::vector<uint32_t>& a) {
  // (storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata])
  if (a.size() != 6 && a.size() != 7) {
    Fail(StrCat("torch._utils._rebuild_tensor_v2 takes 6 or 7 arguments, not ", a.size()));
  }
  PickleTensor t;
  t.storage = static_cast<int>(Expect(a[0], PickleKind::kStorage, "the tensor's storage").i);
  t.offset = Expect(a[1], PickleKind::kInt, "the storage offset").i;
  for (int k : {2, 3}) {
    const PickleValue dims = Expect(a[k], PickleKind::kTuple, k == 2 ? "the size" : "the stride");
    for (uint32_t d : lists_[dims.i]) {
      const int64_t x = Expect(d, PickleKind::kInt, "a size or stride").i;
      if (x < 0) Fail(StrCat("a negative size or stride (", x, ") is not read"));
      (k == 2 ? t.size : t.stride).push_back(x);
    }
  }
  if (t.size.size() != t.stride.size()) {
    Fail(StrCat("size has ", t.size.size(), " dimensions, stride ", t.stride.size()));
  }
  // Every element the view reaches lies in the storage.
  const PickleStorage& s = storages_[t.storage];
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
  stack_.back() = New(PickleKind::kTensor, tensors_.size());
  tensors_.push_back(std::move(t));
}

void Unpickler::PersistentId() {
  // ('storage', torch.<Type>Storage, key, location, numel)
  const std::vector<uint32_t> pid =
      lists_[Expect(Pop(), PickleKind::kTuple, "the persistent id").i];
  if (pid.size() != 5 || values_[pid[0]].kind != PickleKind::kString ||
      str(values_[pid[0]]) != "storage") {
    Fail("a persistent id must be ('storage', type, key, location, numel)");
  }
  const PickleValue type = Expect(pid[1], PickleKind::kGlobal, "the storage type");
  if (type.global != PickleGlobal::kStorageType)
    Fail(StrCat(QuoteForMessage(str(type)), " is not a storage type"));
  const std::string key = str(Expect(pid[2], PickleKind::kString, "the storage key"));
  Expect(pid[3], PickleKind::kString, "the storage location");
  const int64_t numel = Expect(pid[4], PickleKind::kInt, "the storage size").i;
  if (numel < 0) Fail(StrCat("storage ", QuoteForMessage(key), " has ", numel, " elements"));
  if (key.empty() || key.find_first_of("/\\") != std::string::npos || key == "." || key == "..") {
    Fail(StrCat("storage key ", QuoteForMessage(key), " is not a plain name"));
  }
  auto [it, fresh] = storage_by_key_.emplace(key, static_cast<int>(storages_.size()));
  if (fresh) {
    storages_.push_back({key, type.type, numel});
  } else if (storages_[it->second].type != type.type || storages_[it->second].numel != numel) {
    Fail(StrCat("storage ", QuoteForMessage(key), " is read as two types or sizes"));
  }
  Push(New(PickleKind::kStorage, static_cast<size_t>(it->second)));
}

std::string Unpickler::KeyText(uint32_t key) const {
  // Python's equal keys (1 == True) share a text; keys other than these
  // (floats, tuples) are kept apart even when equal.
  const PickleValue& k = values_[key];
  switch (k.kind) {
    case PickleKind::kString:
      return "s" + str(k);
    case PickleKind::kInt:
    case PickleKind::kBool:
      return StrCat("i", k.i);
    case PickleKind::kNone:
      return "n";
    default:
      return "";
  }
}

void Unpickler::SetItem(uint32_t dict, uint32_t key, uint32_t value) {
  PickleDict& d = dicts_[Expect(dict, PickleKind::kDict, "the target").i];
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

}  // namespace cnnflow
