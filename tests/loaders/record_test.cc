// Record layouts: cnnflow's own and Caffe's Datum. Datums are also built
// here by a hand-written protobuf encoder (and literal bytes), independent
// of loaders/record.cc's encoder.
#include "loaders/record.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/error.h"

namespace cnnflow {
namespace {

// Asserts that `text` contains `part` (no gmock in this binary).
#define EXPECT_CONTAINS(text, part)                                         \
  do {                                                                      \
    const std::string text_ = (text);                                       \
    EXPECT_NE(text_.find(part), std::string::npos) << "message: " << text_; \
  } while (0)

std::string Bytes(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s.push_back(static_cast<char>(b));
  return s;
}

RecordView MakeView(int64_t label, std::vector<int64_t> shape, RecordEncoding enc,
                    RecordDType dtype, const std::string& payload) {
  RecordView r;
  r.label = label;
  r.shape = std::move(shape);
  r.encoding = enc;
  r.dtype = dtype;
  r.data = reinterpret_cast<const uint8_t*>(payload.data());
  r.size = payload.size();
  return r;
}

std::string Payload(const RecordView& r) {
  return std::string(reinterpret_cast<const char*>(r.data), r.size);
}

bool PointsInto(const RecordView& r, const std::string& value) {
  const auto* b = reinterpret_cast<const uint8_t*>(value.data());
  return r.data >= b && r.data + r.size <= b + value.size();
}

std::string FloatBytes(const std::vector<float>& f) {
  return std::string(reinterpret_cast<const char*>(f.data()), f.size() * 4);
}

std::vector<float> ReadFloats(const RecordView& r) {
  std::vector<float> f(r.size / 4);
  std::memcpy(f.data(), r.data, f.size() * 4);
  return f;
}

// ---- a hand-built protobuf writer (field by field) ----
struct Proto {
  std::string bytes;
  Proto& Varint(uint64_t v) {
    do {
      uint8_t b = v & 0x7F;
      v >>= 7;
      if (v) b |= 0x80;
      bytes.push_back(static_cast<char>(b));
    } while (v);
    return *this;
  }
  Proto& Tag(int field, int wire) { return Varint(static_cast<uint64_t>(field) * 8 + wire); }
  Proto& Int(int field, int64_t v) { return Tag(field, 0).Varint(static_cast<uint64_t>(v)); }
  Proto& Len(int field, const std::string& payload) {
    Tag(field, 2).Varint(payload.size());
    bytes += payload;
    return *this;
  }
  Proto& Fixed32(int field, float f) {
    Tag(field, 5);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    for (int i = 0; i < 4; ++i) bytes.push_back(static_cast<char>((u >> (8 * i)) & 0xFF));
    return *this;
  }
  Proto& Fixed64(int field, uint64_t u) {
    Tag(field, 1);
    for (int i = 0; i < 8; ++i) bytes.push_back(static_cast<char>((u >> (8 * i)) & 0xFF));
    return *this;
  }
  Proto& PackedFloats(int field, const std::vector<float>& f) { return Len(field, FloatBytes(f)); }
};

// ------------------------------------------------------------- cnnflow layout

TEST(RecordCnnflow, RoundTripRawU8ZeroCopy) {
  std::string pixels(3 * 4 * 5, '\0');
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<char>(i * 7 + 3);
  const std::string value =
      EncodeCnnflowRecord(MakeView(9, {3, 4, 5}, RecordEncoding::kRaw, RecordDType::kU8, pixels));
  // Header: 24 fixed + 3 dims x 8, then the payload.
  ASSERT_EQ(value.size(), 24u + 24u + 60u);
  EXPECT_EQ(value.substr(0, 4), "CFR1");
  EXPECT_EQ(DetectRecordFormat(value), RecordFormat::kCnnflow);

  RecordView r;
  const RecordStatus st = DecodeCnnflowRecord(value, &r);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(r.label, 9);
  EXPECT_EQ(r.shape, (std::vector<int64_t>{3, 4, 5}));
  EXPECT_EQ(r.encoding, RecordEncoding::kRaw);
  EXPECT_EQ(r.dtype, RecordDType::kU8);
  EXPECT_EQ(r.numel(), 60);
  EXPECT_EQ(r.data, reinterpret_cast<const uint8_t*>(value.data()) + 48);  // zero-copy
  EXPECT_EQ(Payload(r), pixels);
}

TEST(RecordCnnflow, RoundTripRawF32) {
  const std::vector<float> f = {0.5f, -1.25f, 3e-7f, 1e30f, 0.f, -0.f, 42.f,
                                7.5f, -8.f,   1.f,   2.f,   3.f, 4.f,  5.f};
  const std::string payload = FloatBytes(f);
  const std::string value =
      EncodeCnnflowRecord(MakeView(-5, {2, 7}, RecordEncoding::kRaw, RecordDType::kF32, payload));
  RecordView r;
  ASSERT_TRUE(DecodeRecord(value, &r).ok());
  EXPECT_EQ(r.label, -5);
  EXPECT_EQ(r.shape, (std::vector<int64_t>{2, 7}));
  EXPECT_EQ(r.dtype, RecordDType::kF32);
  EXPECT_TRUE(PointsInto(r, value));
  EXPECT_EQ(ReadFloats(r), f);
}

TEST(RecordCnnflow, RoundTripEncodedBytes) {
  const std::string jpeg = Bytes({0xFF, 0xD8, 0xFF, 0xE0, 1, 2, 3, 4, 5, 0xFF, 0xD9});
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{}, std::vector<int64_t>{3, 32, 32}}) {
    const std::string value =
        EncodeCnnflowRecord(MakeView(3, shape, RecordEncoding::kJpeg, RecordDType::kU8, jpeg));
    RecordView r;
    const RecordStatus st = DecodeRecord(value, &r);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(r.encoding, RecordEncoding::kJpeg);
    EXPECT_EQ(r.shape, shape);
    EXPECT_EQ(r.label, 3);
    EXPECT_TRUE(PointsInto(r, value));
    EXPECT_EQ(Payload(r), jpeg);
  }
  const std::string png = Bytes({0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 0, 0});
  RecordView r;
  ASSERT_TRUE(DecodeRecord(EncodeCnnflowRecord(
                               MakeView(1, {1, 2, 2}, RecordEncoding::kPng, RecordDType::kU8, png)),
                           &r)
                  .ok());
  EXPECT_EQ(r.encoding, RecordEncoding::kPng);
}

TEST(RecordCnnflow, ShortAndCorruptValuesAreErrors) {
  const std::string pixels(12, 'x');
  const std::string good =
      EncodeCnnflowRecord(MakeView(1, {3, 2, 2}, RecordEncoding::kRaw, RecordDType::kU8, pixels));
  RecordView r;
  // Every truncation is an error (never a crash or a read past the end).
  for (size_t n = 0; n < good.size(); ++n) {
    EXPECT_FALSE(DecodeCnnflowRecord(std::string_view(good).substr(0, n), &r).ok()) << n;
  }
  EXPECT_EQ(DecodeCnnflowRecord(good.substr(0, 10), &r).message(),
            "value is 10 bytes, the header needs 24");
  EXPECT_EQ(DecodeCnnflowRecord(good.substr(0, 30), &r).message(),
            "value is 30 bytes, the header with rank 3 needs 48");
  EXPECT_EQ(DecodeCnnflowRecord(good.substr(0, good.size() - 1), &r).message(),
            "value is 59 bytes, header (48) + payload (12) = 60 (truncated)");
  EXPECT_EQ(DecodeCnnflowRecord(good + "z", &r).message(),
            "value is 61 bytes, header (48) + payload (12) = 60");

  std::string bad = good;
  bad[0] = 'X';
  EXPECT_CONTAINS(DecodeCnnflowRecord(bad, &r).message(), "bad magic 0x58 0x46 0x52 0x31");
  bad = good;
  bad[4] = 9;
  EXPECT_EQ(DecodeCnnflowRecord(bad, &r).message(), "record version 9, this build reads version 1");
  bad = good;
  bad[5] = 7;
  EXPECT_CONTAINS(DecodeCnnflowRecord(bad, &r).message(), "unknown encoding 7");
  bad = good;
  bad[6] = 3;
  EXPECT_CONTAINS(DecodeCnnflowRecord(bad, &r).message(), "unknown dtype 3");
  bad = good;
  bad[7] = 200;
  EXPECT_CONTAINS(DecodeCnnflowRecord(bad, &r).message(), "rank 200 is over the maximum 8");
  // A dim that disagrees with the payload size.
  bad = good;
  bad[24] = 4;  // channels 3 -> 4
  EXPECT_EQ(DecodeCnnflowRecord(bad, &r).message(),
            "raw payload is 12 bytes, shape [4, 2, 2] u8 needs 16");
  bad = good;
  bad[6] = 1;  // u8 -> f32
  EXPECT_EQ(DecodeCnnflowRecord(bad, &r).message(),
            "raw payload is 12 bytes, shape [3, 2, 2] f32 needs 48");
  bad = good;
  bad[31] = static_cast<char>(0x80);  // channels negative
  EXPECT_CONTAINS(DecodeCnnflowRecord(bad, &r).message(), "negative dim");
  EXPECT_TRUE(DecodeCnnflowRecord(good, &r).ok());
}

TEST(RecordCnnflow, EncoderRejectsInconsistentRecords) {
  const std::string pixels(10, 'x');
  EXPECT_THROW(
      EncodeCnnflowRecord(MakeView(0, {3, 2, 2}, RecordEncoding::kRaw, RecordDType::kU8, pixels)),
      Error);
  EXPECT_THROW(EncodeCnnflowRecord(MakeView(0, {}, RecordEncoding::kRaw, RecordDType::kU8, "")),
               Error);
  EXPECT_THROW(EncodeCnnflowRecord(MakeView(0, {1, 1, 1, 1, 1, 1, 1, 1, 10}, RecordEncoding::kRaw,
                                            RecordDType::kU8, pixels)),
               Error);
}

// ------------------------------------------------------------- Caffe Datum

TEST(RecordCaffe, LiteralDatumBytes) {
  // channels 1, height 2, width 2, data {1,2,3,4}, label 7, as protobuf writes it.
  const std::string value =
      Bytes({0x08, 0x01, 0x10, 0x02, 0x18, 0x02, 0x22, 0x04, 1, 2, 3, 4, 0x28, 0x07});
  EXPECT_EQ(DetectRecordFormat(value), RecordFormat::kCaffeDatum);
  RecordView r;
  const RecordStatus st = DecodeRecord(value, &r);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(r.label, 7);
  EXPECT_EQ(r.shape, (std::vector<int64_t>{1, 2, 2}));
  EXPECT_EQ(r.encoding, RecordEncoding::kRaw);
  EXPECT_EQ(r.dtype, RecordDType::kU8);
  EXPECT_EQ(r.data, reinterpret_cast<const uint8_t*>(value.data()) + 8);
  EXPECT_EQ(Payload(r), Bytes({1, 2, 3, 4}));
  // Our encoder writes exactly these bytes.
  const std::string pixels = Bytes({1, 2, 3, 4});
  EXPECT_EQ(
      EncodeCaffeDatum(MakeView(7, {1, 2, 2}, RecordEncoding::kRaw, RecordDType::kU8, pixels)),
      value);
}

TEST(RecordCaffe, HandBuiltDatumWithUnknownFieldsAnyOrder) {
  std::string pixels(2 * 3 * 5, '\0');
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = static_cast<char>(255 - i);
  Proto p;
  p.Int(5, 300)                        // label first (2-byte varint)
      .Int(20, 123456789)              // unknown varint (2-byte tag)
      .Fixed64(9, 0x0102030405060708)  // unknown fixed64
      .Int(3, 5)
      .Len(100, "some unknown bytes")  // unknown length-delimited
      .Int(1, 2)
      .Fixed32(8, 1.5f)  // unknown fixed32
      .Len(4, pixels)
      .Int(2, 3)
      .Int(7, 0);  // encoded = false, explicit
  RecordView r;
  const RecordStatus st = DecodeCaffeDatum(p.bytes, &r);
  ASSERT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(r.label, 300);
  EXPECT_EQ(r.shape, (std::vector<int64_t>{2, 3, 5}));
  EXPECT_EQ(r.dtype, RecordDType::kU8);
  EXPECT_TRUE(PointsInto(r, p.bytes));
  EXPECT_EQ(Payload(r), pixels);
}

TEST(RecordCaffe, NegativeLabelIsTenByteVarint) {
  Proto p;
  p.Int(1, 1).Int(2, 1).Int(3, 1).Len(4, "A").Int(5, -3);  // int32 -3 sign-extended to 64 bits
  ASSERT_EQ(p.bytes.size(), 6u + 3u + 1u + 10u);           // dims, data, label tag, label
  RecordView r;
  ASSERT_TRUE(DecodeCaffeDatum(p.bytes, &r).ok());
  EXPECT_EQ(r.label, -3);
  EXPECT_EQ(EncodeCaffeDatum(r), p.bytes);
}

TEST(RecordCaffe, FloatDataPackedUnpackedAndMixed) {
  const std::vector<float> f = {0.25f, -1.f, 3.5f, 1e-3f, 8.f, -0.5f};
  // Packed: one run, zero-copy.
  {
    Proto p;
    p.Int(1, 1).Int(2, 2).Int(3, 3).Int(5, 4).PackedFloats(6, f);
    RecordView r;
    const RecordStatus st = DecodeCaffeDatum(p.bytes, &r);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(r.dtype, RecordDType::kF32);
    EXPECT_EQ(r.label, 4);
    EXPECT_TRUE(PointsInto(r, p.bytes));
    EXPECT_EQ(ReadFloats(r), f);
  }
  // Unpacked (what Caffe's proto2 writer produces): gathered.
  {
    Proto p;
    p.Int(1, 1).Int(2, 2).Int(3, 3).Int(5, 4);
    for (float x : f) p.Fixed32(6, x);
    RecordView r;
    const RecordStatus st = DecodeCaffeDatum(p.bytes, &r);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(r.dtype, RecordDType::kF32);
    EXPECT_EQ(r.size, 24u);
    EXPECT_EQ(ReadFloats(r), f);
    // A copy owns its floats: the original's storage can go away.
    RecordView copy;
    {
      RecordView tmp = r;
      copy = tmp;
      tmp.gathered_.assign(6, 99.f);
    }
    EXPECT_EQ(ReadFloats(copy), f);
    EXPECT_EQ(EncodeCaffeDatum(
                  MakeView(4, {1, 2, 3}, RecordEncoding::kRaw, RecordDType::kF32, FloatBytes(f))),
              p.bytes);
  }
  // Mixed: a packed run, single floats, and another packed run, in order.
  {
    Proto p;
    p.Int(1, 1).Int(2, 2).Int(3, 3);
    p.PackedFloats(6, {f[0], f[1]})
        .Fixed32(6, f[2])
        .Int(5, 4)
        .Fixed32(6, f[3])
        .PackedFloats(6, {f[4], f[5]});
    RecordView r;
    const RecordStatus st = DecodeCaffeDatum(p.bytes, &r);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(ReadFloats(r), f);
  }
}

TEST(RecordCaffe, EncodedDatumKeepsBytesAndGivenShape) {
  const std::string jpeg = Bytes({0xFF, 0xD8, 0xFF, 0xDB, 9, 9, 9, 0xFF, 0xD9});
  const std::string png = Bytes({0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 0, 0, 0, 13});
  {
    Proto p;  // as Caffe's convert_imageset --encoded writes: shape 0s
    p.Len(4, jpeg).Int(5, 6).Int(7, 1);
    RecordView r;
    const RecordStatus st = DecodeRecord(p.bytes, &r);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(r.encoding, RecordEncoding::kJpeg);
    EXPECT_EQ(r.shape, (std::vector<int64_t>{0, 0, 0}));
    EXPECT_EQ(r.label, 6);
    EXPECT_EQ(Payload(r), jpeg);
    EXPECT_TRUE(PointsInto(r, p.bytes));
  }
  {
    Proto p;
    p.Int(1, 3).Int(2, 32).Int(3, 32).Len(4, png).Int(5, 2).Int(7, 1);
    RecordView r;
    ASSERT_TRUE(DecodeRecord(p.bytes, &r).ok());
    EXPECT_EQ(r.encoding, RecordEncoding::kPng);
    EXPECT_EQ(r.shape, (std::vector<int64_t>{3, 32, 32}));
    EXPECT_EQ(
        EncodeCaffeDatum(MakeView(2, {3, 32, 32}, RecordEncoding::kPng, RecordDType::kU8, png)),
        p.bytes);
  }
  {
    Proto p;
    p.Len(4, "GIF89a").Int(7, 1);
    RecordView r;
    EXPECT_EQ(DecodeRecord(p.bytes, &r).message(),
              "encoded Datum data is neither JPEG nor PNG (starts with 0x47 0x49)");
  }
}

TEST(RecordCaffe, EncoderRoundTrips) {
  const std::string u8 = "abcdefghijkl";
  const std::vector<float> f = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  const std::string jpeg = Bytes({0xFF, 0xD8, 0xFF, 1, 2});
  struct Case {
    RecordView in;
    bool packed;
  };
  const std::string fb = FloatBytes(f);
  const std::vector<Case> cases = {
      {MakeView(1, {3, 2, 2}, RecordEncoding::kRaw, RecordDType::kU8, u8), false},
      {MakeView(2, {2, 6}, RecordEncoding::kRaw, RecordDType::kU8, u8),
       false},  // [C, L] -> C, 1, L
      {MakeView(3, {1, 2, 3}, RecordEncoding::kRaw, RecordDType::kF32, fb), false},
      {MakeView(4, {1, 2, 3}, RecordEncoding::kRaw, RecordDType::kF32, fb), true},
      {MakeView(5, {}, RecordEncoding::kJpeg, RecordDType::kU8, jpeg), false},
  };
  for (const Case& c : cases) {
    const std::string value = EncodeCaffeDatum(c.in, c.packed);
    RecordView r;
    const RecordStatus st = DecodeRecord(value, &r);
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(r.label, c.in.label);
    EXPECT_EQ(r.encoding, c.in.encoding);
    EXPECT_EQ(r.dtype, c.in.dtype);
    EXPECT_EQ(Payload(r), Payload(c.in));
    if (c.in.shape.size() == 2) {
      EXPECT_EQ(r.shape, (std::vector<int64_t>{c.in.shape[0], 1, c.in.shape[1]}));
    } else if (c.in.shape.empty()) {
      EXPECT_EQ(r.shape, (std::vector<int64_t>{0, 0, 0}));
    } else {
      EXPECT_EQ(r.shape, c.in.shape);
    }
  }
  EXPECT_THROW(EncodeCaffeDatum(MakeView(int64_t{1} << 40, {3, 2, 2}, RecordEncoding::kRaw,
                                         RecordDType::kU8, u8)),
               Error);
  EXPECT_THROW(EncodeCaffeDatum(MakeView(0, {12}, RecordEncoding::kRaw, RecordDType::kU8, u8)),
               Error);
}

TEST(RecordCaffe, CorruptDatumsAreErrors) {
  RecordView r;
  {
    // data claims 900 bytes; the value is shorter.
    Proto p;
    p.Int(1, 1).Int(2, 10).Int(3, 90).Tag(4, 2).Varint(900);
    p.bytes += std::string(100, 'x');
    EXPECT_EQ(DecodeCaffeDatum(p.bytes, &r).message(),
              "Datum field 4 length 900 at byte 6 runs past the end (value is 109 bytes)");
  }
  {
    Proto p;
    p.Int(1, 1).Int(2, 1).Int(3, 1).Tag(6, 7);
    EXPECT_EQ(DecodeCaffeDatum(p.bytes, &r).message(),
              "unknown wire type 7 at byte 6 (Datum field 6)");
  }
  {
    Proto p;
    p.Int(1, 3).Int(2, 16).Int(3, 16).Len(4, std::string(700, 'x'));
    EXPECT_EQ(DecodeCaffeDatum(p.bytes, &r).message(),
              "Datum data is 700 bytes, channels x height x width = 3 x 16 x 16 = 768");
  }
  {
    Proto p;
    p.Int(1, 1).Int(2, 1).Int(3, 3).PackedFloats(6, {1.f, 2.f});
    EXPECT_EQ(DecodeCaffeDatum(p.bytes, &r).message(),
              "Datum float_data holds 2 floats, channels x height x width = 1 x 1 x 3 = 3");
  }
  {
    Proto p;
    p.Int(1, 1).Int(2, 1).Int(3, 1).Len(6, "abcde");
    EXPECT_CONTAINS(DecodeCaffeDatum(p.bytes, &r).message(), "packed float_data is 5 bytes");
  }
  {
    Proto p;
    p.Int(1, 1).Len(2, "x");  // height as bytes
    EXPECT_EQ(DecodeCaffeDatum(p.bytes, &r).message(),
              "Datum field 2 has wire type 2, expected 0 (at byte 2)");
  }
  {
    Proto p;
    p.Int(1, 1).Int(2, 1).Int(3, 1);
    EXPECT_CONTAINS(DecodeCaffeDatum(p.bytes, &r).message(), "holds neither data nor float_data");
  }
  {
    Proto p;
    p.Int(1, -1).Int(2, 1).Int(3, 1).Len(4, "a");
    EXPECT_EQ(DecodeCaffeDatum(p.bytes, &r).message(), "Datum has negative channels -1");
  }
  {
    Proto p;  // 3 x (2^31 - 1) overflows int64
    p.Int(1, 0x7FFFFFFF).Int(2, 0x7FFFFFFF).Int(3, 0x7FFFFFFF).Len(4, "a");
    EXPECT_EQ(DecodeCaffeDatum(p.bytes, &r).message(),
              "Datum shape [2147483647, 2147483647, 2147483647] overflows");
  }
  EXPECT_EQ(DecodeCaffeDatum(Bytes({0x08, 0x81}), &r).message(),
            "Datum field 1: varint at byte 1 runs past the end (value is 2 bytes)");
  EXPECT_CONTAINS(
      DecodeCaffeDatum(
          Bytes({0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01}), &r)
          .message(),
      "longer than 10 bytes");
  // Every truncation of a valid Datum decodes or fails cleanly; those that
  // cut into the data field fail.
  Proto good;
  good.Int(1, 1).Int(2, 4).Int(3, 4).Len(4, std::string(16, 'p')).Int(5, 3);
  ASSERT_TRUE(DecodeCaffeDatum(good.bytes, &r).ok());
  for (size_t n = 0; n < good.bytes.size() - 2; ++n) {
    EXPECT_FALSE(DecodeCaffeDatum(std::string_view(good.bytes).substr(0, n), &r).ok()) << n;
  }
}

// Random byte flips and truncations of valid values of both layouts never
// crash; whatever decodes ok points inside the value (or its own floats).
TEST(RecordFormatDetection, MutatedValuesNeverReadOutOfBounds) {
  const std::string pixels(24, 'q');
  const std::vector<float> f = {1.f, 2.f, 3.f, 4.f, 5.f, 6.f};
  Proto unpacked;
  unpacked.Int(1, 1).Int(2, 2).Int(3, 3).Int(5, 1);
  for (float x : f) unpacked.Fixed32(6, x);
  const std::vector<std::string> seeds = {
      EncodeCnnflowRecord(MakeView(2, {2, 3, 4}, RecordEncoding::kRaw, RecordDType::kU8, pixels)),
      EncodeCaffeDatum(MakeView(2, {2, 3, 4}, RecordEncoding::kRaw, RecordDType::kU8, pixels)),
      EncodeCaffeDatum(
          MakeView(2, {1, 2, 3}, RecordEncoding::kRaw, RecordDType::kF32, FloatBytes(f)), true),
      unpacked.bytes,
  };
  std::mt19937 rng(123);
  RecordView r;
  int ok = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    std::string v = seeds[iter % seeds.size()];
    const int flips = 1 + rng() % 3;
    for (int k = 0; k < flips; ++k) v[rng() % v.size()] = static_cast<char>(rng());
    if (rng() % 4 == 0) v.resize(rng() % v.size());
    if (!DecodeRecord(v, &r).ok()) continue;
    ++ok;
    const bool in_value = PointsInto(r, v);
    const auto* g = reinterpret_cast<const uint8_t*>(r.gathered_.data());
    const bool in_gathered = r.data == g && r.size == r.gathered_.size() * 4;
    ASSERT_TRUE(in_value || in_gathered) << iter;
  }
  EXPECT_GT(ok, 0);  // some mutations (e.g. of a pixel) stay valid
}

TEST(RecordFormatDetection, DetectsAndDispatches) {
  EXPECT_EQ(DetectRecordFormat(""), RecordFormat::kUnknown);
  EXPECT_EQ(DetectRecordFormat("CFR1"), RecordFormat::kCnnflow);
  EXPECT_EQ(DetectRecordFormat(Bytes({0x08, 0x01})), RecordFormat::kCaffeDatum);
  EXPECT_EQ(DetectRecordFormat(Bytes({0x07})), RecordFormat::kUnknown);  // field 0
  EXPECT_EQ(DetectRecordFormat(Bytes({0x0F})), RecordFormat::kUnknown);  // wire type 7
  RecordView r;
  EXPECT_EQ(DecodeRecord("", &r).message(), "value is empty");
  EXPECT_EQ(
      DecodeRecord(Bytes({0x07, 1, 2}), &r).message(),
      "value is neither a cnnflow record (magic \"CFR1\") nor a Caffe Datum (first byte 0x07)");
  EXPECT_EQ(DecodeRecord("CFR1xx", &r).message(), "value is 6 bytes, the header needs 24");
  EXPECT_STREQ(RecordFormatName(RecordFormat::kCaffeDatum), "caffe");
}

}  // namespace
}  // namespace cnnflow
