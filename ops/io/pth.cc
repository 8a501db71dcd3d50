#include "ops/io/pth.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "ops/error.h"
#include "ops/io/pickle.h"
#include "ops/io/zip_reader.h"

namespace cnnflow {

static_assert(std::endian::native == std::endian::little,
              "torch.save data is little-endian; a big-endian host needs byte swaps here");

namespace {

// ------------------------------------------------------------------ tensors

// Copies the elements a view reaches, in row-major order, converting each
// (kBool: any byte but 0 is 1, as torch reads a bool).
template <typename Out, typename In, bool kBool = false>
void Gather(const unsigned char* src, const PickleTensor& r, Out* dst, int64_t n) {
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

void GatherInto(const unsigned char* src, const TorchStorageType& type, const PickleTensor& r,
                Tensor& t) {
  const int64_t n = t.numel();
  if (n == 0) return;
  auto* i64 = static_cast<int64_t*>(t.raw_data());
  switch (type.elem) {
    case StorageElem::kI32:
      return Gather<int64_t, int32_t>(src, r, i64, n);
    case StorageElem::kI16:
      return Gather<int64_t, int16_t>(src, r, i64, n);
    case StorageElem::kI8:
      return Gather<int64_t, int8_t>(src, r, i64, n);
    case StorageElem::kU8:
      return Gather<int64_t, uint8_t>(src, r, i64, n);
    case StorageElem::kBool:
      return Gather<int64_t, uint8_t, true>(src, r, i64, n);
    case StorageElem::kSame:
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

bool IsContiguous(const PickleTensor& r) {
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

  Tensor Load(const std::string& name, const PickleTensor& r) {
    const std::string sig = StrCat(r.storage, "|", r.offset, "|", Shape(r.size), Shape(r.stride));
    auto seen = loaded_.find(sig);
    if (seen != loaded_.end()) return seen->second;  // the same view twice: shared
    const PickleStorage& s = vm_.storage(r.storage);
    const TorchStorageType& type = kTorchStorageTypes[s.type];
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
    if (e->method == 0 && type.elem == StorageElem::kSame && r.offset == 0 && IsContiguous(r) &&
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
  void Account(const PickleStorage& s, int64_t numel, const std::string& pre) {
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
    if (names.size() < 200) names += StrCat(names.empty() ? "" : ", ", QuoteForMessage(e.name));
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
      throw Error(StrCat(zip.path(), ": byteorder ", QuoteForMessage(order),
                         ": only little-endian archives are read"));
    }
  }
}

// The dict of tensors in the saved object; `wrapper` names the entry it
// came from, if any.
const PickleDict& StateDict(const Unpickler& vm, uint32_t root, const std::string& path,
                            std::string* wrapper) {
  const PickleValue& r = vm.at(root);
  if (r.kind != PickleKind::kDict) {
    throw Error(StrCat(path, ": the saved object is ", KindWithArticle(r.kind),
                       ", not a dict of tensors (torch.save(model.state_dict(), path))"));
  }
  // The first entry that is not a tensor under a string key, or "".
  auto not_tensors = [&](const PickleDict& d) -> std::string {
    for (const auto& [k, v] : d.entries) {
      if (vm.at(k).kind != PickleKind::kString)
        return StrCat(KindWithArticle(vm.at(k).kind), " key");
      if (vm.at(v).kind != PickleKind::kTensor) {
        return StrCat("entry ", QuoteForMessage(vm.str(vm.at(k))), " is ",
                      KindWithArticle(vm.at(v).kind));
      }
    }
    return "";
  };
  const PickleDict& top = vm.dict(r);
  const std::string why = not_tensors(top);
  if (why.empty()) return top;
  for (const char* key : {"state_dict", "model", "model_state_dict"}) {
    for (const auto& [k, v] : top.entries) {
      const PickleValue& kv = vm.at(k);
      if (kv.kind != PickleKind::kString || vm.str(kv) != key || vm.at(v).kind != PickleKind::kDict)
        continue;
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
  const PickleDict& dict = StateDict(vm, root, path, &wrapper);
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
