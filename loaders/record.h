// The value formats of a data-set record (one LMDB value = one sample):
// cnnflow's own layout and Caffe's `Datum` protobuf, both decoded
// zero-copy into a RecordView whose `data` points into the value bytes.
//
// cnnflow layout (all integers little-endian):
//   offset  size      field
//   0       4         magic "CFR1"
//   4       1         version (1)
//   5       1         encoding (RecordEncoding: 0 raw, 1 JPEG, 2 PNG)
//   6       1         dtype (RecordDType: 0 u8, 1 f32; u8 for encoded)
//   7       1         rank R (0..8; 0 = shape unknown, encoded only)
//   8       8         label, int64
//   16      8         payload size in bytes, uint64
//   24      8 * R     dims, int64 ([C, H, W] or [C, L])
//   24+8R   payload   raw pixels CHW (u8 or f32), or the JPEG/PNG bytes
// The header is a multiple of 8 bytes; the value ends exactly at the end of
// the payload (a torn or short value is detected, never read past).
//
// Caffe layout: `message Datum { optional int32 channels = 1; optional int32
// height = 2; optional int32 width = 3; optional bytes data = 4; optional
// int32 label = 5; repeated float float_data = 6; optional bool encoded = 7;
// }` in the protobuf wire format, parsed by hand (no libprotobuf).
//
// Failures of the data are values (RecordStatus), not exceptions: the stage
// that reads records decides whether to skip or fail. The encoders throw
// Error for arguments that cannot be encoded (a programming error).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cnnflow {

enum class RecordEncoding : uint8_t { kRaw = 0, kJpeg = 1, kPng = 2 };
// Element type of a raw payload (encoded payloads are bytes: kU8).
enum class RecordDType : uint8_t { kU8 = 0, kF32 = 1 };
enum class RecordFormat { kUnknown, kCnnflow, kCaffeDatum };

const char* RecordEncodingName(RecordEncoding e);  // "raw", "jpeg", "png"
const char* RecordDTypeName(RecordDType t);        // "u8", "f32"
const char* RecordFormatName(RecordFormat f);      // "unknown", "cnnflow", "caffe"
size_t RecordDTypeSize(RecordDType t);             // 1, 4

// The result of decoding a record: ok, or a message that says what is wrong
// ("value is 10 bytes, the header needs 24").
class [[nodiscard]] RecordStatus {
 public:
  static RecordStatus Ok() { return RecordStatus(); }
  static RecordStatus Corrupt(std::string message) {
    RecordStatus s;
    s.message_ = std::move(message);
    if (s.message_.empty()) s.message_ = "corrupt record";
    return s;
  }
  bool ok() const { return message_.empty(); }
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

// A decoded record. `data` points INTO the value bytes (zero-copy) and is
// valid as long as they are (for LMDB: while the read transaction lives);
// it may be unaligned: read f32 payloads with memcpy. The one exception is a
// Datum whose float_data is not one packed run (Caffe writes it unpacked,
// 5 bytes per float): the floats are gathered into `gathered_` and `data`
// points there (copying a RecordView re-points `data` at the copy's own).
struct RecordView {
  int64_t label = 0;
  // [C, H, W] or [C, L]; a Datum always gives [C, H, W]; for encoded
  // payloads the shape is only what the writer stated (may be empty or 0s).
  std::vector<int64_t> shape;
  RecordEncoding encoding = RecordEncoding::kRaw;
  RecordDType dtype = RecordDType::kU8;
  const uint8_t* data = nullptr;
  size_t size = 0;  // payload bytes

  // Elements in a raw payload: the product of `shape`.
  int64_t numel() const;

  RecordView() = default;
  RecordView(const RecordView& other) { *this = other; }
  RecordView& operator=(const RecordView& other);
  RecordView(RecordView&&) = default;  // a moved vector keeps its buffer
  RecordView& operator=(RecordView&&) = default;

  std::vector<float> gathered_;  // storage for gathered float_data only
};

// Which layout a value is in: kCnnflow if it starts with "CFR1", kCaffeDatum
// if its first byte is a valid Datum field tag, else kUnknown (also for an
// empty value). Cheap: looks at the first bytes only.
RecordFormat DetectRecordFormat(std::string_view value);

// Decodes `value` in whichever layout DetectRecordFormat finds. `out`'s
// vectors are reused (no allocation in steady state).
RecordStatus DecodeRecord(std::string_view value, RecordView* out);

// cnnflow layout. The encoder throws Error if a raw payload's size is not
// numel * dtype size, a dim is negative, or the rank is over 8.
std::string EncodeCnnflowRecord(const RecordView& record);
RecordStatus DecodeCnnflowRecord(std::string_view value, RecordView* out);

// Caffe Datum. Encoding: a raw u8 record goes to `data`, a raw f32 record
// to `float_data` (unpacked like Caffe's proto2 writer, or packed), an
// encoded record to `data` with encoded = true. The shape must be [C, H, W],
// [C, L] (written as C, 1, L) or empty (encoded only; written as 0, 0, 0);
// dims must fit int32 and the label too, else Error is thrown.
std::string EncodeCaffeDatum(const RecordView& record, bool pack_floats = false);
// Decoding accepts fields in any order, packed or unpacked float_data (or a
// mix), and skips unknown fields (varint, fixed32/64, length-delimited). As
// in Caffe, non-empty `data` wins over float_data. A raw Datum must hold
// exactly channels * height * width values; an encoded one must hold JPEG
// or PNG bytes (its shape is reported as given, possibly 0s).
RecordStatus DecodeCaffeDatum(std::string_view value, RecordView* out);

}  // namespace cnnflow
