#include "loaders/record.h"

#include <bit>
#include <cstdio>
#include <cstring>
#include <limits>

#include "ops/error.h"

namespace cnnflow {

static_assert(std::endian::native == std::endian::little,
              "record layouts are little-endian; a big-endian host needs byte swaps");

namespace {

constexpr char kMagic[4] = {'C', 'F', 'R', '1'};
constexpr uint8_t kVersion = 1;
constexpr size_t kFixedHeader = 24;
constexpr int kMaxRank = 8;

// Datum field numbers.
enum DatumField : uint32_t {
  kChannels = 1,
  kHeight = 2,
  kWidth = 3,
  kData = 4,
  kLabel = 5,
  kFloatData = 6,
  kEncoded = 7,
};
// Protobuf wire types.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

template <typename T>
T LoadLE(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void AppendLE(std::string* s, T v) {
  s->append(reinterpret_cast<const char*>(&v), sizeof v);
}

std::string HexByte(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "0x%02x", b);
  return buf;
}

// numel = product of dims; false on a negative dim or overflow.
bool Product(const std::vector<int64_t>& dims, int64_t* numel) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return false;
  }
  *numel = n;
  return true;
}

std::string ShapeString(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

RecordEncoding SniffEncoding(const uint8_t* p, size_t n, bool* known) {
  *known = true;
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return RecordEncoding::kJpeg;
  static constexpr uint8_t kPngSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 8 && std::memcmp(p, kPngSig, 8) == 0) return RecordEncoding::kPng;
  *known = false;
  return RecordEncoding::kRaw;
}

// ---- protobuf wire format ----

class WireReader {
 public:
  WireReader(const uint8_t* p, size_t n) : p_(p), n_(n) {}
  bool done() const { return pos_ >= n_; }
  size_t pos() const { return pos_; }
  const uint8_t* at(size_t pos) const { return p_ + pos; }

  // Reads a varint (at most 10 bytes); on failure sets *error.
  bool Varint(uint64_t* v, std::string* error) {
    const size_t start = pos_;
    uint64_t result = 0;
    for (int shift = 0; shift < 70; shift += 7) {
      if (pos_ >= n_) {
        *error = StrCat("varint at byte ", start, " runs past the end (value is ", n_, " bytes)");
        return false;
      }
      const uint8_t b = p_[pos_++];
      if (shift == 63 && b > 1) break;  // an 11th bit of payload: overflow
      result |= static_cast<uint64_t>(b & 0x7F) << shift;
      if (!(b & 0x80)) {
        *v = result;
        return true;
      }
    }
    *error = StrCat("varint at byte ", start, " is longer than 10 bytes");
    return false;
  }

  // Skips n bytes; fails if they run past the end.
  bool Skip(uint64_t n, const std::string& what, std::string* error) {
    if (n > n_ - pos_) {
      *error = StrCat(what, " runs past the end (value is ", n_, " bytes)");
      return false;
    }
    pos_ += n;
    return true;
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t pos_ = 0;
};

bool IsDatumTagByte(uint8_t b) {
  // A first-byte tag is < 0x80 for fields 1..15; Datum's fields are 1..7 but
  // unknown fields are allowed: accept any field >= 1 with a valid wire type.
  const uint32_t field = b >> 3, wire = b & 7;
  if (b & 0x80) return true;  // multi-byte tag (field >= 16), plausible
  return field >= 1 &&
         (wire == kVarint || wire == kFixed64 || wire == kLengthDelimited || wire == kFixed32);
}

void AppendVarint(std::string* s, uint64_t v) {
  while (v >= 0x80) {
    s->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  s->push_back(static_cast<char>(v));
}

void AppendTag(std::string* s, uint32_t field, uint32_t wire) {
  AppendVarint(s, (field << 3) | wire);
}

int32_t CheckedInt32(int64_t v, const char* what) {
  CNNFLOW_ENFORCE(
      v >= std::numeric_limits<int32_t>::min() && v <= std::numeric_limits<int32_t>::max(),
      "Caffe Datum ", what, " ", v, " does not fit int32");
  return static_cast<int32_t>(v);
}

}  // namespace

const char* RecordEncodingName(RecordEncoding e) {
  switch (e) {
    case RecordEncoding::kRaw:
      return "raw";
    case RecordEncoding::kJpeg:
      return "jpeg";
    case RecordEncoding::kPng:
      return "png";
  }
  return "?";
}

const char* RecordDTypeName(RecordDType t) {
  switch (t) {
    case RecordDType::kU8:
      return "u8";
    case RecordDType::kF32:
      return "f32";
  }
  return "?";
}

const char* RecordFormatName(RecordFormat f) {
  switch (f) {
    case RecordFormat::kUnknown:
      return "unknown";
    case RecordFormat::kCnnflow:
      return "cnnflow";
    case RecordFormat::kCaffeDatum:
      return "caffe";
  }
  return "?";
}

size_t RecordDTypeSize(RecordDType t) { return t == RecordDType::kF32 ? 4 : 1; }

int64_t RecordView::numel() const {
  int64_t n = 0;
  return Product(shape, &n) ? n : -1;
}

RecordView& RecordView::operator=(const RecordView& other) {
  if (this == &other) return *this;
  label = other.label;
  shape = other.shape;
  encoding = other.encoding;
  dtype = other.dtype;
  size = other.size;
  gathered_ = other.gathered_;
  const auto* g = reinterpret_cast<const uint8_t*>(other.gathered_.data());
  const bool points_into_gathered = !other.gathered_.empty() && other.data == g;
  data = points_into_gathered ? reinterpret_cast<const uint8_t*>(gathered_.data()) : other.data;
  return *this;
}

RecordFormat DetectRecordFormat(std::string_view value) {
  if (value.empty()) return RecordFormat::kUnknown;
  if (value.size() >= 4 && std::memcmp(value.data(), kMagic, 4) == 0) return RecordFormat::kCnnflow;
  if (IsDatumTagByte(static_cast<uint8_t>(value[0]))) return RecordFormat::kCaffeDatum;
  return RecordFormat::kUnknown;
}

RecordStatus DecodeRecord(std::string_view value, RecordView* out) {
  switch (DetectRecordFormat(value)) {
    case RecordFormat::kCnnflow:
      return DecodeCnnflowRecord(value, out);
    case RecordFormat::kCaffeDatum:
      return DecodeCaffeDatum(value, out);
    case RecordFormat::kUnknown:
      break;
  }
  if (value.empty()) return RecordStatus::Corrupt("value is empty");
  return RecordStatus::Corrupt(
      StrCat("value is neither a cnnflow record (magic \"CFR1\") nor a Caffe Datum "
             "(first byte ",
             HexByte(static_cast<uint8_t>(value[0])), ")"));
}

// ---- cnnflow layout ----

std::string EncodeCnnflowRecord(const RecordView& r) {
  const int rank = static_cast<int>(r.shape.size());
  CNNFLOW_ENFORCE(rank <= kMaxRank, "a record's rank is at most ", kMaxRank, ", got ",
                  ShapeString(r.shape));
  int64_t numel = 0;
  CNNFLOW_ENFORCE(Product(r.shape, &numel), "record shape ", ShapeString(r.shape),
                  " has a negative dim or overflows");
  if (r.encoding == RecordEncoding::kRaw) {
    int64_t want = -1;
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(RecordDTypeSize(r.dtype)), &want))
      want = -1;
    CNNFLOW_ENFORCE(rank > 0 && static_cast<int64_t>(r.size) == want, "raw record of shape ",
                    ShapeString(r.shape), " ", RecordDTypeName(r.dtype), " needs ", want,
                    " payload bytes, got ", r.size);
  }
  CNNFLOW_ENFORCE(r.size == 0 || r.data != nullptr, "record payload is null");
  std::string s;
  s.reserve(kFixedHeader + 8 * rank + r.size);
  s.append(kMagic, 4);
  s.push_back(static_cast<char>(kVersion));
  s.push_back(static_cast<char>(r.encoding));
  s.push_back(static_cast<char>(r.encoding == RecordEncoding::kRaw ? r.dtype : RecordDType::kU8));
  s.push_back(static_cast<char>(rank));
  AppendLE<int64_t>(&s, r.label);
  AppendLE<uint64_t>(&s, r.size);
  for (int64_t d : r.shape) AppendLE<int64_t>(&s, d);
  if (r.size) s.append(reinterpret_cast<const char*>(r.data), r.size);
  return s;
}

RecordStatus DecodeCnnflowRecord(std::string_view value, RecordView* out) {
  const auto* p = reinterpret_cast<const uint8_t*>(value.data());
  const size_t n = value.size();
  if (n < kFixedHeader) {
    return RecordStatus::Corrupt(StrCat("value is ", n, " bytes, the header needs ", kFixedHeader));
  }
  if (std::memcmp(p, kMagic, 4) != 0) {
    return RecordStatus::Corrupt(StrCat("bad magic ", HexByte(p[0]), " ", HexByte(p[1]), " ",
                                        HexByte(p[2]), " ", HexByte(p[3]), ", expected \"CFR1\""));
  }
  if (p[4] != kVersion) {
    return RecordStatus::Corrupt(
        StrCat("record version ", int{p[4]}, ", this build reads version ", int{kVersion}));
  }
  if (p[5] > static_cast<uint8_t>(RecordEncoding::kPng)) {
    return RecordStatus::Corrupt(StrCat("unknown encoding ", int{p[5]}, " (0 raw, 1 jpeg, 2 png)"));
  }
  if (p[6] > static_cast<uint8_t>(RecordDType::kF32)) {
    return RecordStatus::Corrupt(StrCat("unknown dtype ", int{p[6]}, " (0 u8, 1 f32)"));
  }
  const int rank = p[7];
  if (rank > kMaxRank) {
    return RecordStatus::Corrupt(StrCat("rank ", rank, " is over the maximum ", kMaxRank));
  }
  const size_t header = kFixedHeader + 8 * static_cast<size_t>(rank);
  if (n < header) {
    return RecordStatus::Corrupt(
        StrCat("value is ", n, " bytes, the header with rank ", rank, " needs ", header));
  }
  const auto encoding = static_cast<RecordEncoding>(p[5]);
  const auto dtype = static_cast<RecordDType>(p[6]);
  const int64_t label = LoadLE<int64_t>(p + 8);
  const uint64_t payload = LoadLE<uint64_t>(p + 16);
  out->shape.resize(rank);
  for (int i = 0; i < rank; ++i) out->shape[i] = LoadLE<int64_t>(p + kFixedHeader + 8 * i);
  if (payload != n - header) {
    return RecordStatus::Corrupt(StrCat("value is ", n, " bytes, header (", header, ") + payload (",
                                        payload, ") = ", payload + header,
                                        payload > n - header ? " (truncated)" : ""));
  }
  int64_t numel = 0;
  if (!Product(out->shape, &numel)) {
    return RecordStatus::Corrupt(
        StrCat("shape ", ShapeString(out->shape), " has a negative dim or overflows"));
  }
  if (encoding == RecordEncoding::kRaw) {
    uint64_t want = 0;
    if (rank == 0 ||
        __builtin_mul_overflow(static_cast<uint64_t>(numel), RecordDTypeSize(dtype), &want) ||
        want != payload) {
      return RecordStatus::Corrupt(StrCat(
          "raw payload is ", payload, " bytes, shape ", ShapeString(out->shape), " ",
          RecordDTypeName(dtype), " needs ",
          rank == 0 ? std::string("a rank > 0") : std::to_string(numel * RecordDTypeSize(dtype))));
    }
  } else if (payload == 0) {
    return RecordStatus::Corrupt(StrCat(RecordEncodingName(encoding), " payload is empty"));
  }
  out->label = label;
  out->encoding = encoding;
  out->dtype = dtype;
  out->data = p + header;
  out->size = payload;
  return RecordStatus::Ok();
}

// ---- Caffe Datum ----

std::string EncodeCaffeDatum(const RecordView& r, bool pack_floats) {
  int64_t c = 0, h = 0, w = 0;
  if (r.shape.size() == 3) {
    c = r.shape[0], h = r.shape[1], w = r.shape[2];
  } else if (r.shape.size() == 2) {
    c = r.shape[0], h = 1, w = r.shape[1];
  } else {
    CNNFLOW_ENFORCE(r.shape.empty() && r.encoding != RecordEncoding::kRaw,
                    "a Caffe Datum needs shape [C, H, W] or [C, L] (empty for encoded), got ",
                    ShapeString(r.shape));
  }
  const int32_t c32 = CheckedInt32(c, "channels"), h32 = CheckedInt32(h, "height"),
                w32 = CheckedInt32(w, "width"), label32 = CheckedInt32(r.label, "label");
  CNNFLOW_ENFORCE(c32 >= 0 && h32 >= 0 && w32 >= 0, "negative dim in ", ShapeString(r.shape));
  CNNFLOW_ENFORCE(r.size == 0 || r.data != nullptr, "record payload is null");
  int64_t numel = 0;
  CNNFLOW_ENFORCE(Product({c32, h32, w32}, &numel), "Datum shape ", ShapeString(r.shape),
                  " overflows");
  const bool floats = r.encoding == RecordEncoding::kRaw && r.dtype == RecordDType::kF32;
  if (r.encoding == RecordEncoding::kRaw) {
    int64_t want = -1;
    if (__builtin_mul_overflow(numel, static_cast<int64_t>(RecordDTypeSize(r.dtype)), &want))
      want = -1;
    CNNFLOW_ENFORCE(static_cast<int64_t>(r.size) == want, "raw record of shape ",
                    ShapeString(r.shape), " ", RecordDTypeName(r.dtype), " needs ", want,
                    " payload bytes, got ", r.size);
  }
  std::string s;
  s.reserve(r.size + (floats && !pack_floats ? r.size / 4 : 0) + 48);
  // Field order as protobuf serialises: by field number.
  AppendTag(&s, kChannels, kVarint);
  AppendVarint(&s, static_cast<uint64_t>(static_cast<int64_t>(c32)));
  AppendTag(&s, kHeight, kVarint);
  AppendVarint(&s, static_cast<uint64_t>(static_cast<int64_t>(h32)));
  AppendTag(&s, kWidth, kVarint);
  AppendVarint(&s, static_cast<uint64_t>(static_cast<int64_t>(w32)));
  if (!floats) {
    AppendTag(&s, kData, kLengthDelimited);
    AppendVarint(&s, r.size);
    if (r.size) s.append(reinterpret_cast<const char*>(r.data), r.size);
  }
  AppendTag(&s, kLabel, kVarint);
  // int32 negatives are sign-extended to 10 bytes, as protobuf does.
  AppendVarint(&s, static_cast<uint64_t>(static_cast<int64_t>(label32)));
  if (floats && r.size) {
    if (pack_floats) {
      AppendTag(&s, kFloatData, kLengthDelimited);
      AppendVarint(&s, r.size);
      s.append(reinterpret_cast<const char*>(r.data), r.size);
    } else {
      for (size_t i = 0; i < r.size; i += 4) {
        AppendTag(&s, kFloatData, kFixed32);
        s.append(reinterpret_cast<const char*>(r.data) + i, 4);
      }
    }
  }
  if (r.encoding != RecordEncoding::kRaw) {
    AppendTag(&s, kEncoded, kVarint);
    AppendVarint(&s, 1);
  }
  return s;
}

namespace {

// What a Datum's fields said, as read (the last occurrence of a field wins,
// as in protobuf).
struct DatumFields {
  int64_t dims[3] = {0, 0, 0};  // channels, height, width
  int64_t label = 0;
  bool encoded = false;
  const uint8_t* data = nullptr;
  size_t data_size = 0;
  // float_data: one contiguous run stays zero-copy; a second piece switches
  // to gathering into the record's `gathered`.
  const uint8_t* floats = nullptr;
  size_t float_bytes = 0;
  bool gathering = false;

  void AddFloats(const uint8_t* src, size_t bytes, std::vector<float>& gathered) {
    if (!gathering && floats == nullptr) {
      floats = src;
      float_bytes = bytes;
      return;
    }
    if (!gathering) {
      gathering = true;
      gathered.resize(float_bytes / 4);
      std::memcpy(gathered.data(), floats, float_bytes);
    }
    const size_t old = gathered.size();
    gathered.resize(old + bytes / 4);
    std::memcpy(gathered.data() + old, src, bytes);
  }
};

// Reads the value of Datum field `field` (its tag, of wire type `wire`, read
// at byte `tag_pos`) into `f`: a known field must come in its own wire type.
RecordStatus ReadDatumField(WireReader& in, uint64_t field, uint32_t wire, size_t tag_pos,
                            DatumFields& f, std::vector<float>& gathered) {
  std::string err;
  auto wrong_wire = [&](uint32_t expected) {
    return RecordStatus::Corrupt(StrCat("Datum field ", field, " has wire type ", wire,
                                        ", expected ", expected, " (at byte ", tag_pos, ")"));
  };
  switch (wire) {
    case kVarint: {
      uint64_t v = 0;
      if (!in.Varint(&v, &err))
        return RecordStatus::Corrupt(StrCat("Datum field ", field, ": ", err));
      // int32 fields: protobuf truncates to the low 32 bits.
      const int64_t as_int32 = static_cast<int32_t>(static_cast<uint32_t>(v));
      if (field == kChannels || field == kHeight || field == kWidth) {
        f.dims[field - 1] = as_int32;
      } else if (field == kLabel) {
        f.label = as_int32;
      } else if (field == kEncoded) {
        f.encoded = v != 0;
      } else if (field == kData || field == kFloatData) {
        return wrong_wire(field == kData ? kLengthDelimited : kFixed32);
      }
      return RecordStatus::Ok();
    }
    case kFixed64:
      if (field >= kChannels && field <= kEncoded) {
        return wrong_wire(field == kFloatData ? kFixed32 : kVarint);
      }
      if (!in.Skip(8, StrCat("Datum field ", field, " (fixed64) at byte ", tag_pos), &err)) {
        return RecordStatus::Corrupt(err);
      }
      return RecordStatus::Ok();
    case kFixed32: {
      if (field >= kChannels && field <= kEncoded && field != kFloatData) {
        return wrong_wire(field == kData ? kLengthDelimited : kVarint);
      }
      const size_t at = in.pos();
      if (!in.Skip(4, StrCat("Datum field ", field, " (fixed32) at byte ", tag_pos), &err)) {
        return RecordStatus::Corrupt(err);
      }
      if (field == kFloatData) f.AddFloats(in.at(at), 4, gathered);
      return RecordStatus::Ok();
    }
    case kLengthDelimited: {
      uint64_t len = 0;
      if (!in.Varint(&len, &err)) {
        return RecordStatus::Corrupt(StrCat("Datum field ", field, " length: ", err));
      }
      const size_t at = in.pos();
      if (!in.Skip(len, StrCat("Datum field ", field, " length ", len, " at byte ", tag_pos),
                   &err)) {
        return RecordStatus::Corrupt(err);
      }
      if (field == kData) {
        f.data = in.at(at);
        f.data_size = len;
      } else if (field == kFloatData) {
        if (len % 4 != 0) {
          return RecordStatus::Corrupt(StrCat("Datum packed float_data is ", len,
                                              " bytes, not a multiple of 4 (at byte ", tag_pos,
                                              ")"));
        }
        if (len) f.AddFloats(in.at(at), len, gathered);
      } else if (field >= kChannels && field <= kEncoded) {
        return wrong_wire(kVarint);
      }
      return RecordStatus::Ok();
    }
    default:
      return RecordStatus::Corrupt(
          StrCat("unknown wire type ", wire, " at byte ", tag_pos, " (Datum field ", field, ")"));
  }
}

// The record a Datum's fields describe, its payload checked against its
// shape: encoded bytes, raw u8 data, or float_data.
RecordStatus DatumRecord(const DatumFields& f, RecordView* out) {
  for (int i = 0; i < 3; ++i) {
    if (f.dims[i] < 0) {
      return RecordStatus::Corrupt(StrCat("Datum has negative ",
                                          i == 0   ? "channels"
                                          : i == 1 ? "height"
                                                   : "width",
                                          " ", f.dims[i]));
    }
  }
  out->shape.assign(f.dims, f.dims + 3);
  int64_t numel = 0;
  if (!Product(out->shape, &numel)) {  // 3 x 31 bits can overflow int64
    return RecordStatus::Corrupt(StrCat("Datum shape ", ShapeString(out->shape), " overflows"));
  }
  const std::string shape_text = StrCat("channels x height x width = ", f.dims[0], " x ", f.dims[1],
                                        " x ", f.dims[2], " = ", numel);
  out->label = f.label;
  if (f.encoded) {
    if (f.data_size == 0) return RecordStatus::Corrupt("encoded Datum has no data");
    bool known = false;
    out->encoding = SniffEncoding(f.data, f.data_size, &known);
    if (!known) {
      return RecordStatus::Corrupt(
          StrCat("encoded Datum data is neither JPEG nor PNG (starts with ", HexByte(f.data[0]),
                 f.data_size > 1 ? " " + HexByte(f.data[1]) : "", ")"));
    }
    out->dtype = RecordDType::kU8;
    out->data = f.data;
    out->size = f.data_size;
    return RecordStatus::Ok();
  }
  out->encoding = RecordEncoding::kRaw;
  if (f.data_size > 0) {
    if (static_cast<int64_t>(f.data_size) != numel) {
      return RecordStatus::Corrupt(StrCat("Datum data is ", f.data_size, " bytes, ", shape_text));
    }
    out->dtype = RecordDType::kU8;
    out->data = f.data;
    out->size = f.data_size;
    out->gathered_.clear();
    return RecordStatus::Ok();
  }
  const size_t float_count = f.gathering ? out->gathered_.size() : f.float_bytes / 4;
  if (float_count == 0) {
    return RecordStatus::Corrupt(
        StrCat("Datum holds neither data nor float_data (", shape_text, ")"));
  }
  if (static_cast<int64_t>(float_count) != numel) {
    return RecordStatus::Corrupt(
        StrCat("Datum float_data holds ", float_count, " floats, ", shape_text));
  }
  out->dtype = RecordDType::kF32;
  out->data = f.gathering ? reinterpret_cast<const uint8_t*>(out->gathered_.data()) : f.floats;
  out->size = float_count * 4;
  return RecordStatus::Ok();
}

}  // namespace

RecordStatus DecodeCaffeDatum(std::string_view value, RecordView* out) {
  WireReader in(reinterpret_cast<const uint8_t*>(value.data()), value.size());
  DatumFields fields;
  out->gathered_.clear();
  while (!in.done()) {
    const size_t tag_pos = in.pos();
    uint64_t tag = 0;
    std::string err;
    if (!in.Varint(&tag, &err)) return RecordStatus::Corrupt("Datum " + err);
    const uint64_t field = tag >> 3;
    if (field == 0) return RecordStatus::Corrupt(StrCat("Datum field number 0 at byte ", tag_pos));
    RecordStatus s =
        ReadDatumField(in, field, static_cast<uint32_t>(tag & 7), tag_pos, fields, out->gathered_);
    if (!s.ok()) return s;
  }
  return DatumRecord(fields, out);
}

}  // namespace cnnflow
