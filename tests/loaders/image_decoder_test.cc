// DecodeImage / ReadImageHeader: PNGs of every colour type and bit depth
// (written here with libpng's encoder) decode to the pixels written; JPEGs
// decode as TurboJPEG does; truncated, corrupt and unknown data come back
// as error values, never a crash.

#include "loaders/image_decoder.h"

#include <gtest/gtest.h>
#include <png.h>
#include <zlib.h>

#include <csetjmp>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "loaders/jpeg_decoder.h"
#include "tests/loaders/png_fixture.h"

namespace cnnflow {
namespace {

using testing::WritePng;
using Pixels = std::vector<uint8_t>;

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// Distinct values in every channel and position (catches swapped axes or
// channels), HWC.
Pixels Pattern(int w, int h, int c, int seed = 0) {
  Pixels p(static_cast<size_t>(w) * h * c);
  for (size_t i = 0; i < p.size(); ++i)
    p[i] = static_cast<uint8_t>((i * 37 + seed * 101 + i / 7) % 256);
  return p;
}

Pixels Decode(const std::string& bytes, int out_channels, ImageResult* result = nullptr) {
  Pixels out;
  const ImageResult r = DecodeImage(Bytes(bytes), bytes.size(), out_channels, &out);
  EXPECT_TRUE(r.ok()) << r.error;
  if (result != nullptr) *result = r;
  return out;
}

constexpr int kW = 7, kH = 5;  // not square, not a multiple of 8

TEST(ImageDecoderTest, DetectsFormatsByMagicBytes) {
  const std::string png = WritePng(1, 1, PNG_COLOR_TYPE_GRAY, 8, {7});
  const Pixels px = Pattern(4, 4, 3);
  const std::string jpeg = EncodeJpeg(px.data(), 4, 4, 3);
  EXPECT_EQ(DetectImageFormat(Bytes(png), png.size()), ImageFormat::kPng);
  EXPECT_EQ(DetectImageFormat(Bytes(jpeg), jpeg.size()), ImageFormat::kJpeg);
  const std::string gif = "GIF89a....";
  EXPECT_EQ(DetectImageFormat(Bytes(gif), gif.size()), ImageFormat::kUnknown);
  EXPECT_EQ(DetectImageFormat(Bytes(png), 7), ImageFormat::kUnknown);  // signature cut
}

TEST(ImageDecoderTest, Png8BitGrayAndRgbDecodeToThePixelsWritten) {
  const Pixels gray = Pattern(kW, kH, 1), rgb = Pattern(kW, kH, 3, 1);
  ImageResult r;
  EXPECT_EQ(Decode(WritePng(kW, kH, PNG_COLOR_TYPE_GRAY, 8, gray), 0, &r), gray);
  EXPECT_EQ(r.format, ImageFormat::kPng);
  EXPECT_EQ(r.width, kW);
  EXPECT_EQ(r.height, kH);
  EXPECT_EQ(r.channels, 1);
  EXPECT_EQ(Decode(WritePng(kW, kH, PNG_COLOR_TYPE_RGB, 8, rgb), 0, &r), rgb);
  EXPECT_EQ(r.channels, 3);
}

TEST(ImageDecoderTest, PngChannelConversionsReplicateGrayAndTakeOpenCvLuma) {
  const Pixels gray = Pattern(kW, kH, 1), rgb = Pattern(kW, kH, 3, 2);
  const Pixels as_rgb = Decode(WritePng(kW, kH, PNG_COLOR_TYPE_GRAY, 8, gray), 3);
  ASSERT_EQ(as_rgb.size(), gray.size() * 3);
  for (size_t i = 0; i < gray.size(); ++i) {
    for (int c = 0; c < 3; ++c) ASSERT_EQ(as_rgb[i * 3 + c], gray[i]) << i;
  }
  // The reference: OpenCV's RGB -> gray on the pixels written.
  cv::Mat ref;
  cv::cvtColor(cv::Mat(kH, kW, CV_8UC3, const_cast<uint8_t*>(rgb.data())), ref, cv::COLOR_RGB2GRAY);
  const Pixels luma = Decode(WritePng(kW, kH, PNG_COLOR_TYPE_RGB, 8, rgb), 1);
  EXPECT_EQ(luma, Pixels(ref.data, ref.data + ref.total()));
}

TEST(ImageDecoderTest, PngAlphaIsDropped) {
  const Pixels rgba = Pattern(kW, kH, 4, 3), ga = Pattern(kW, kH, 2, 4);
  Pixels rgb, gray;
  for (size_t i = 0; i < rgba.size(); i += 4) rgb.insert(rgb.end(), &rgba[i], &rgba[i] + 3);
  for (size_t i = 0; i < ga.size(); i += 2) gray.push_back(ga[i]);
  ImageResult r;
  EXPECT_EQ(Decode(WritePng(kW, kH, PNG_COLOR_TYPE_RGB_ALPHA, 8, rgba), 0, &r), rgb);
  EXPECT_EQ(r.channels, 3);
  EXPECT_EQ(Decode(WritePng(kW, kH, PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga), 0, &r), gray);
  EXPECT_EQ(r.channels, 1);
  Pixels gray3;
  for (uint8_t g : gray) gray3.insert(gray3.end(), 3, g);
  EXPECT_EQ(Decode(WritePng(kW, kH, PNG_COLOR_TYPE_GRAY_ALPHA, 8, ga), 3), gray3);
}

TEST(ImageDecoderTest, PalettePngsExpandToTheirColours) {
  const std::vector<uint8_t> palette = {10, 20, 30, 200, 100, 0, 0,  255,
                                        7,  90, 91, 92,  255, 1, 128};
  const std::vector<uint8_t> trns = {0, 128, 255};  // transparency is dropped, not composited
  Pixels index(kW * kH), expected;
  for (size_t i = 0; i < index.size(); ++i) {
    index[i] = static_cast<uint8_t>((i * 3 + i / kW) % 5);
    expected.insert(expected.end(), &palette[index[i] * 3], &palette[index[i] * 3] + 3);
  }
  EXPECT_EQ(Decode(WritePng(kW, kH, PNG_COLOR_TYPE_PALETTE, 8, index, false, palette, trns), 0),
            expected);
  // 4-bit palette: two indices a byte, high nibble first; rows padded.
  const int rowbytes = (kW + 1) / 2;
  Pixels packed(static_cast<size_t>(rowbytes) * kH, 0);
  for (int y = 0; y < kH; ++y) {
    for (int x = 0; x < kW; ++x) {
      packed[y * rowbytes + x / 2] |= static_cast<uint8_t>(index[y * kW + x] << (x % 2 ? 0 : 4));
    }
  }
  EXPECT_EQ(Decode(WritePng(kW, kH, PNG_COLOR_TYPE_PALETTE, 4, packed, false, palette), 0),
            expected);
}

TEST(ImageDecoderTest, SixteenBitPngsKeepTheHighByte) {
  for (const int color : {PNG_COLOR_TYPE_GRAY, PNG_COLOR_TYPE_RGB, PNG_COLOR_TYPE_RGB_ALPHA}) {
    const int samples = color == PNG_COLOR_TYPE_GRAY ? 1 : color == PNG_COLOR_TYPE_RGB ? 3 : 4;
    Pixels be16, expected;
    for (int i = 0; i < kW * kH * samples; ++i) {
      const uint16_t v = static_cast<uint16_t>(i * 2749 + 13);
      be16.push_back(static_cast<uint8_t>(v >> 8));
      be16.push_back(static_cast<uint8_t>(v & 0xFF));
      if (samples != 4 || i % 4 != 3) expected.push_back(static_cast<uint8_t>(v >> 8));
    }
    EXPECT_EQ(Decode(WritePng(kW, kH, color, 16, be16), 0), expected) << "colour type " << color;
  }
}

TEST(ImageDecoderTest, LowBitDepthGrayScalesTo8Bits) {
  for (const int depth : {1, 2, 4}) {
    const int max = (1 << depth) - 1;
    const int per_byte = 8 / depth;
    const int rowbytes = (kW + per_byte - 1) / per_byte;
    Pixels packed(static_cast<size_t>(rowbytes) * kH, 0), expected;
    for (int y = 0; y < kH; ++y) {
      for (int x = 0; x < kW; ++x) {
        const int v = (x + 2 * y) % (max + 1);
        const int shift = 8 - depth * (x % per_byte + 1);
        packed[y * rowbytes + x / per_byte] |= static_cast<uint8_t>(v << shift);
        expected.push_back(static_cast<uint8_t>(v * 255 / max));
      }
    }
    EXPECT_EQ(Decode(WritePng(kW, kH, PNG_COLOR_TYPE_GRAY, depth, packed), 0), expected)
        << depth << "-bit";
  }
}

TEST(ImageDecoderTest, InterlacedPngsDecodeAsNonInterlaced) {
  const int w = 13, h = 11;  // every Adam7 pass has pixels
  const Pixels rgb = Pattern(w, h, 3, 5);
  const std::string adam7 = WritePng(w, h, PNG_COLOR_TYPE_RGB, 8, rgb, /*interlace=*/true);
  ASSERT_NE(adam7, WritePng(w, h, PNG_COLOR_TYPE_RGB, 8, rgb));
  EXPECT_EQ(Decode(adam7, 3), rgb);
}

TEST(ImageDecoderTest, ReadsHeadersWithoutDecoding) {
  const std::string png = WritePng(kW, kH, PNG_COLOR_TYPE_GRAY_ALPHA, 8, Pattern(kW, kH, 2));
  const ImageResult p = ReadImageHeader(Bytes(png), png.size());
  ASSERT_TRUE(p.ok()) << p.error;
  EXPECT_EQ(p.format, ImageFormat::kPng);
  EXPECT_EQ(p.width, kW);
  EXPECT_EQ(p.height, kH);
  EXPECT_EQ(p.channels, 2);
  const Pixels px = Pattern(16, 9, 3);
  const std::string jpeg = EncodeJpeg(px.data(), 16, 9, 3);
  const ImageResult j = ReadImageHeader(Bytes(jpeg), jpeg.size());
  ASSERT_TRUE(j.ok()) << j.error;
  EXPECT_EQ(j.format, ImageFormat::kJpeg);
  EXPECT_EQ(j.width, 16);
  EXPECT_EQ(j.height, 9);
  EXPECT_EQ(j.channels, 3);
}

TEST(ImageDecoderTest, JpegDecodesAsTurboJpegIncludingScaledDecode) {
  const int w = 64, h = 48;
  const Pixels px = Pattern(w, h, 3);
  const std::string jpeg = EncodeJpeg(px.data(), w, h, 3, 90);
  JpegDecoder reference;
  for (const int target : {0, 20}) {
    for (const int channels : {1, 3}) {
      const JpegScale s = JpegDecoder::PickScale(w, h, target);
      Pixels expected(static_cast<size_t>(s.width) * s.height * channels);
      ASSERT_TRUE(
          reference
              .Decode(Bytes(jpeg), jpeg.size(), channels, expected.data(), expected.size(), target)
              .ok());
      Pixels got;
      const ImageResult r = DecodeImage(Bytes(jpeg), jpeg.size(), channels, &got, target);
      ASSERT_TRUE(r.ok()) << r.error;
      EXPECT_EQ(r.format, ImageFormat::kJpeg);
      EXPECT_EQ(r.width, s.width);
      EXPECT_EQ(r.height, s.height);
      EXPECT_EQ(got, expected) << "target " << target << ", channels " << channels;
    }
  }
  EXPECT_LT(JpegDecoder::PickScale(w, h, 20).width, w);  // the scaled path was taken
}

TEST(ImageDecoderTest, BadRequestsAndUnknownDataAreErrors) {
  Pixels out;
  EXPECT_EQ(DecodeImage(nullptr, 0, 3, &out).error, "empty image data");
  const std::string gif = "GIF89a\x01\x00\x01\x00";
  const ImageResult r = DecodeImage(Bytes(gif), gif.size(), 3, &out);
  EXPECT_NE(r.error.find("unknown image format (the data starts with 47 49 46 38)"),
            std::string::npos)
      << r.error;
  const std::string png = WritePng(2, 2, PNG_COLOR_TYPE_GRAY, 8, {1, 2, 3, 4});
  EXPECT_NE(DecodeImage(Bytes(png), png.size(), 2, &out).error.find("out_channels"),
            std::string::npos);
}

TEST(ImageDecoderTest, TruncatedPngsAreErrorsAtEveryLength) {
  const std::string png = WritePng(kW, kH, PNG_COLOR_TYPE_RGB, 8, Pattern(kW, kH, 3));
  Pixels out;
  // Every cut that removes more than the 12-byte IEND chunk loses image data.
  for (size_t n = 0; n + 12 < png.size(); ++n) {
    const std::string cut = png.substr(0, n);
    const ImageResult r = DecodeImage(Bytes(cut), cut.size(), 3, &out);
    EXPECT_FALSE(r.ok()) << n << " bytes decoded";
    if (n >= 8) {  // a PNG signature: the PNG decoder's message
      EXPECT_TRUE(r.error.rfind("truncated PNG", 0) == 0 || r.error.rfind("corrupt PNG", 0) == 0)
          << n << ": " << r.error;
    }
  }
  const ImageResult r = DecodeImage(Bytes(png), png.size() / 2, 3, &out);
  // The chunk list is checked before libpng reads it, so the message also
  // names the chunk the data ends in.
  EXPECT_EQ(
      r.error.rfind(
          "truncated PNG: the data ends after " + std::to_string(png.size() / 2) + " bytes", 0),
      0u)
      << r.error;
}

// The offset of `type`'s chunk data in a PNG, or npos.
size_t ChunkData(const std::string& png, const char* type) {
  const size_t at = png.find(type);
  return at == std::string::npos ? at : at + 4;
}

void FixCrc(std::string* png, size_t data_offset) {
  const auto* p = Bytes(*png);
  const uint32_t len = uint32_t{p[data_offset - 8]} << 24 | uint32_t{p[data_offset - 7]} << 16 |
                       uint32_t{p[data_offset - 6]} << 8 | p[data_offset - 5];
  const uLong crc = crc32(0, p + data_offset - 4, len + 4);
  for (int i = 0; i < 4; ++i)
    (*png)[data_offset + len + i] = static_cast<char>(crc >> (24 - 8 * i));
}

TEST(ImageDecoderTest, CorruptPngsAreErrorValues) {
  const Pixels rgb = Pattern(kW, kH, 3);
  const std::string good = WritePng(kW, kH, PNG_COLOR_TYPE_RGB, 8, rgb);
  Pixels out;
  // A flipped bit in the compressed data (zlib's check or the chunk's CRC
  // finds it), and a wrong CRC on intact data.
  std::string data_bad = good;
  const size_t idat = ChunkData(good, "IDAT");
  ASSERT_NE(idat, std::string::npos);
  data_bad[idat + 3] ^= 0x10;
  ImageResult r = DecodeImage(Bytes(data_bad), data_bad.size(), 3, &out);
  EXPECT_EQ(r.error.rfind("corrupt PNG: ", 0), 0u) << r.error;
  std::string crc_bad = good;
  crc_bad[ChunkData(good, "IHDR") + 13] ^= 0x01;  // IHDR's CRC follows its 13 data bytes
  r = DecodeImage(Bytes(crc_bad), crc_bad.size(), 3, &out);
  EXPECT_EQ(r.error, "corrupt PNG: IHDR: CRC error");
  // The same with a valid CRC: zlib finds the damage (or the pixels differ;
  // either way no crash). Damaging the zlib header is always caught.
  std::string zlib_bad = good;
  zlib_bad[idat] = 0x00;
  FixCrc(&zlib_bad, idat);
  r = DecodeImage(Bytes(zlib_bad), zlib_bad.size(), 3, &out);
  EXPECT_EQ(r.error.rfind("corrupt PNG: ", 0), 0u) << r.error;
  // A header claiming a huge image is refused before anything is allocated.
  for (const uint32_t side : {30000u, 70000u}) {
    std::string huge = good;
    const size_t ihdr = ChunkData(good, "IHDR");
    for (int i = 0; i < 4; ++i) {
      huge[ihdr + i] = huge[ihdr + 4 + i] = static_cast<char>(side >> (24 - 8 * i));
    }
    FixCrc(&huge, ihdr);
    r = DecodeImage(Bytes(huge), huge.size(), 3, &out);
    EXPECT_EQ(r.error.rfind("corrupt PNG: ", 0), 0u) << side << ": " << r.error;
    EXPECT_LT(out.capacity(), size_t{1} << 20) << side;
    if (side > kMaxImageSide) {
      EXPECT_FALSE(ReadImageHeader(Bytes(huge), huge.size()).ok());
    }
  }
  // Every single-byte corruption: an error or an image, never a crash.
  int errors = 0;
  for (size_t i = 8; i < good.size(); ++i) {
    std::string bad = good;
    bad[i] = static_cast<char>(~bad[i]);
    const ImageResult b = DecodeImage(Bytes(bad), bad.size(), 3, &out);
    if (!b.ok()) {
      ++errors;
    } else {
      EXPECT_EQ(out.size(), static_cast<size_t>(b.width) * b.height * 3);
    }
  }
  EXPECT_GT(errors, static_cast<int>(good.size()) / 2);
  // And the decoder still works afterwards.
  EXPECT_EQ(Decode(good, 3), rgb);
}

TEST(ImageDecoderTest, TruncatedAndCorruptJpegsAreErrorValues) {
  const Pixels px = Pattern(32, 24, 3);
  const std::string jpeg = EncodeJpeg(px.data(), 32, 24, 3);
  Pixels out;
  const std::string cut = jpeg.substr(0, jpeg.size() / 2);
  ImageResult r = DecodeImage(Bytes(cut), cut.size(), 3, &out);
  EXPECT_EQ(r.format, ImageFormat::kJpeg);
  EXPECT_EQ(r.error.rfind("corrupt JPEG", 0), 0u) << r.error;
  std::string header_cut = jpeg.substr(0, 40);
  r = DecodeImage(Bytes(header_cut), header_cut.size(), 3, &out);
  EXPECT_EQ(r.error.rfind("corrupt JPEG", 0), 0u) << r.error;
  for (size_t i = 3; i < jpeg.size(); i += 7) {  // never a crash
    std::string bad = jpeg;
    bad[i] = static_cast<char>(bad[i] ^ 0x5A);
    const ImageResult b = DecodeImage(Bytes(bad), bad.size(), 3, &out);
    if (b.ok()) {
      EXPECT_EQ(out.size(), static_cast<size_t>(b.width) * b.height * 3);
    }
  }
  EXPECT_EQ(Decode(jpeg, 3).size(), px.size());
}

TEST(ImageDecoderTest, DecodesFromManyThreadsAtOnce) {
  const Pixels rgb = Pattern(40, 30, 3);
  const std::string png = WritePng(40, 30, PNG_COLOR_TYPE_RGB, 8, rgb, true);
  const std::string jpeg = EncodeJpeg(rgb.data(), 40, 30, 3);
  const Pixels jpeg_pixels = Decode(jpeg, 3);
  std::vector<int> failures(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      Pixels out;
      for (int i = 0; i < 50; ++i) {
        const bool use_png = (i + t) % 2 == 0;
        const std::string& bytes = use_png ? png : jpeg;
        const ImageResult r = DecodeImage(Bytes(bytes), bytes.size(), 3, &out);
        if (!r.ok() || out != (use_png ? rgb : jpeg_pixels)) ++failures[t];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures, std::vector<int>(4, 0));
}

}  // namespace
}  // namespace cnnflow
