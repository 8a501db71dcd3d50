// JpegDecoder / EncodeJpeg: round trips within JPEG tolerance, headers,
// DCT-domain scaling, bad data as error values, per-thread handles.
#include "loaders/jpeg_decoder.h"

#include <gtest/gtest.h>
#include <turbojpeg.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ops/error.h"
#include "ops/random.h"

namespace cnnflow {
namespace {

using Pixels = std::vector<uint8_t>;

// Smooth content (what JPEG codes well): gradients plus a low-frequency wave.
Pixels Gradient(int w, int h, int c) {
  Pixels p(static_cast<size_t>(w) * h * c);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const double fx = w > 1 ? static_cast<double>(x) / (w - 1) : 0;
      const double fy = h > 1 ? static_cast<double>(y) / (h - 1) : 0;
      const double v[3] = {255 * fx, 255 * fy, 127.5 + 100 * std::sin(3 * fx + 2 * fy)};
      for (int ch = 0; ch < c; ++ch) {
        const double val = c == 1 ? 0.5 * (v[0] + v[1]) : v[ch];
        p[(static_cast<size_t>(y) * w + x) * c + ch] = static_cast<uint8_t>(std::lround(val));
      }
    }
  }
  return p;
}

// Sharp edges: cells of `cell` pixels, alternating two colours per channel.
Pixels Checkerboard(int w, int h, int c, int cell) {
  Pixels p(static_cast<size_t>(w) * h * c);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const bool on = ((x / cell) + (y / cell)) % 2 == 0;
      for (int ch = 0; ch < c; ++ch) {
        p[(static_cast<size_t>(y) * w + x) * c + ch] =
            static_cast<uint8_t>(on ? 200 - 40 * ch : 30 + 30 * ch);
      }
    }
  }
  return p;
}

double MeanAbsDiff(const Pixels& a, const Pixels& b) {
  EXPECT_EQ(a.size(), b.size());
  double s = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) s += std::abs(int{a[i]} - int{b[i]});
  return a.empty() ? 0 : s / static_cast<double>(a.size());
}

const uint8_t* Bytes(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// Decodes with the default (strict) decoder; checks no byte past the image
// is written.
Pixels DecodeOrDie(const std::string& jpeg, int out_channels, int target_min_side = 0,
                   JpegResult* result = nullptr) {
  JpegDecoder dec;
  const JpegResult hdr = dec.ReadHeader(Bytes(jpeg), jpeg.size());
  EXPECT_TRUE(hdr.ok()) << hdr.error;
  const JpegScale s = JpegDecoder::PickScale(hdr.width, hdr.height, target_min_side);
  const size_t n = static_cast<size_t>(s.width) * s.height * out_channels;
  Pixels buf(n + 16, 0xAB);
  const JpegResult r =
      dec.Decode(Bytes(jpeg), jpeg.size(), out_channels, buf.data(), n, target_min_side);
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_TRUE(r.warning.empty()) << r.warning;
  EXPECT_EQ(r.width, s.width);
  EXPECT_EQ(r.height, s.height);
  EXPECT_EQ(r.channels, out_channels);
  for (size_t i = n; i < buf.size(); ++i)
    EXPECT_EQ(buf[i], 0xAB) << "wrote past the image at " << i;
  buf.resize(n);
  if (result != nullptr) *result = r;
  return buf;
}

TEST(JpegDecoderTest, RgbRoundTripWithinJpegTolerance) {
  for (auto [w, h] : {std::pair{32, 32}, {37, 23}, {1, 1}, {17, 64}, {101, 67}}) {
    SCOPED_TRACE(testing::Message() << w << "x" << h);
    const Pixels src = Gradient(w, h, 3);
    const std::string jpeg = EncodeJpeg(src.data(), w, h, 3, 95, /*subsample_chroma=*/false);
    ASSERT_GT(jpeg.size(), 100u);
    EXPECT_EQ(static_cast<uint8_t>(jpeg[0]), 0xFF);
    EXPECT_EQ(static_cast<uint8_t>(jpeg[1]), 0xD8);
    const Pixels out = DecodeOrDie(jpeg, 3);
    EXPECT_LT(MeanAbsDiff(src, out), 1.5);
  }
  // Sharp edges at quality 100, 4:4:4 and 4:2:0 (chroma halved: looser).
  const Pixels board = Checkerboard(40, 24, 3, 8);
  EXPECT_LT(MeanAbsDiff(board, DecodeOrDie(EncodeJpeg(board.data(), 40, 24, 3, 100, false), 3)),
            1.0);
  EXPECT_LT(MeanAbsDiff(board, DecodeOrDie(EncodeJpeg(board.data(), 40, 24, 3, 100, true), 3)),
            6.0);
}

TEST(JpegDecoderTest, GrayRoundTripAndChannelConversion) {
  for (auto [w, h] : {std::pair{28, 28}, {13, 31}, {9, 2}}) {
    SCOPED_TRACE(testing::Message() << w << "x" << h);
    const Pixels src = Gradient(w, h, 1);
    const std::string jpeg = EncodeJpeg(src.data(), w, h, 1, 98);
    const Pixels gray = DecodeOrDie(jpeg, 1);
    EXPECT_LT(MeanAbsDiff(src, gray), 1.0);
    // A gray JPEG decoded as RGB replicates the gray value.
    const Pixels rgb = DecodeOrDie(jpeg, 3);
    ASSERT_EQ(rgb.size(), gray.size() * 3);
    for (size_t i = 0; i < gray.size(); ++i) {
      ASSERT_EQ(rgb[3 * i], gray[i]);
      ASSERT_EQ(rgb[3 * i + 1], gray[i]);
      ASSERT_EQ(rgb[3 * i + 2], gray[i]);
    }
  }
  // A colour JPEG decoded as gray gives its luma (BT.601).
  const Pixels src = Gradient(33, 21, 3);
  const Pixels gray = DecodeOrDie(EncodeJpeg(src.data(), 33, 21, 3, 98, false), 1);
  Pixels luma(gray.size());
  for (size_t i = 0; i < luma.size(); ++i) {
    luma[i] = static_cast<uint8_t>(
        std::lround(0.299 * src[3 * i] + 0.587 * src[3 * i + 1] + 0.114 * src[3 * i + 2]));
  }
  EXPECT_LT(MeanAbsDiff(luma, gray), 1.0);
}

TEST(JpegDecoderTest, ReadHeaderGivesDimsAndChannels) {
  JpegDecoder dec;
  const Pixels rgb = Gradient(37, 23, 3);
  const std::string a = EncodeJpeg(rgb.data(), 37, 23, 3);
  JpegResult r = dec.ReadHeader(Bytes(a), a.size());
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.width, 37);
  EXPECT_EQ(r.height, 23);
  EXPECT_EQ(r.channels, 3);
  const Pixels gray = Gradient(5, 300, 1);
  const std::string b = EncodeJpeg(gray.data(), 5, 300, 1);
  r = dec.ReadHeader(Bytes(b), b.size());
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.width, 5);
  EXPECT_EQ(r.height, 300);
  EXPECT_EQ(r.channels, 1);
}

TEST(JpegDecoderTest, PickScaleChoosesSmallestFactorKeepingMinSide) {
  // 500x375: 1/8 -> 63x47, 1/4 -> 125x94, 1/2 -> 250x188; the M/8 factors
  // between (3/8 -> 188x141, 3/4 -> 375x282) are never picked.
  auto check = [](int w, int h, int target, int num, int denom, int sw, int sh) {
    SCOPED_TRACE(testing::Message() << w << "x" << h << " target " << target);
    const JpegScale s = JpegDecoder::PickScale(w, h, target);
    EXPECT_EQ(s.num * denom, num * s.denom) << s.num << "/" << s.denom;
    EXPECT_EQ(s.width, sw);
    EXPECT_EQ(s.height, sh);
  };
  check(500, 375, 0, 1, 1, 500, 375);
  check(500, 375, 40, 1, 8, 63, 47);
  check(500, 375, 47, 1, 8, 63, 47);
  check(500, 375, 48, 1, 4, 125, 94);
  check(500, 375, 100, 1, 2, 250, 188);
  check(500, 375, 142, 1, 2, 250, 188);
  check(500, 375, 375, 1, 1, 500, 375);
  check(500, 375, 1000, 1, 1, 500, 375);  // never upscales
  check(375, 500, 100, 1, 2, 188, 250);   // min side is the width
  check(500, 375, 256, 1, 1, 500, 375);   // 3/4 would keep 282: full size, then the resize
  check(32, 32, 32, 1, 1, 32, 32);
  check(256, 256, 224, 1, 1, 256, 256);
}

TEST(JpegDecoderTest, ScaledDecodeReturnsScaledSizeAndDownscaledContent) {
  const int w = 500, h = 375;
  const Pixels src = Gradient(w, h, 3);
  const std::string jpeg = EncodeJpeg(src.data(), w, h, 3, 95, false);
  JpegResult r;
  const Pixels out = DecodeOrDie(jpeg, 3, /*target_min_side=*/90, &r);
  EXPECT_EQ(r.scale_num * 4, r.scale_denom);  // 1/4
  ASSERT_EQ(r.width, 125);
  ASSERT_EQ(r.height, 94);
  // Against a 4x4 box average of the source (the last row block is partial).
  Pixels ref(out.size());
  for (int y = 0; y < r.height; ++y) {
    for (int x = 0; x < r.width; ++x) {
      for (int c = 0; c < 3; ++c) {
        int sum = 0, n = 0;
        for (int dy = 0; dy < 4 && 4 * y + dy < h; ++dy) {
          for (int dx = 0; dx < 4 && 4 * x + dx < w; ++dx, ++n) {
            sum += src[((4 * y + dy) * w + 4 * x + dx) * 3 + c];
          }
        }
        ref[(y * r.width + x) * 3 + c] = static_cast<uint8_t>((sum + n / 2) / n);
      }
    }
  }
  EXPECT_LT(MeanAbsDiff(ref, out), 2.0);
  // Gray output scales too.
  const Pixels g = DecodeOrDie(jpeg, 1, 47, &r);
  EXPECT_EQ(r.width, 63);
  EXPECT_EQ(r.height, 47);
  EXPECT_EQ(g.size(), 63u * 47u);
}

// libjpeg's own header read (a fresh handle each time: a failed read spoils one).
JpegResult LibjpegHeader(const std::string& jpeg, size_t size) {
  JpegResult r;
  tjhandle h = tjInitDecompress();
  int subsamp = 0, colorspace = 0;
  if (tjDecompressHeader3(h, Bytes(jpeg), static_cast<unsigned long>(size), &r.width, &r.height,
                          &subsamp, &colorspace) != 0) {
    r.error = tjGetErrorStr2(h);
  } else if (r.width <= 0 || r.height <= 0) {
    r.error = "0x0";  // TurboJPEG 2.1 "reads" a bare SOI as an empty image
  } else {
    r.channels =
        colorspace == TJCS_GRAY ? 1 : (colorspace == TJCS_CMYK || colorspace == TJCS_YCCK ? 4 : 3);
  }
  tjDestroy(h);
  return r;
}

std::string EncodeProgressive(const Pixels& rgb, int w, int h) {
  tjhandle tj = tjInitCompress();
  unsigned char* out = nullptr;
  unsigned long size = 0;
  EXPECT_EQ(tjCompress2(tj, rgb.data(), w, w * 3, h, TJPF_RGB, &out, &size, TJSAMP_420, 85,
                        TJFLAG_PROGRESSIVE),
            0)
      << tjGetErrorStr2(tj);
  std::string jpeg(reinterpret_cast<const char*>(out), size);
  tjFree(out);
  tjDestroy(tj);
  return jpeg;
}

// ReadHeader walks the markers itself and asks libjpeg only when it
// declines: on every file, and every truncation of it, it must say what
// libjpeg's header parse says.
TEST(JpegDecoderTest, HeaderScanAgreesWithLibjpeg) {
  std::vector<std::pair<std::string, std::string>> files;
  const Pixels rgb = Gradient(37, 23, 3), gray = Gradient(5, 300, 1), one = Gradient(1, 1, 3);
  files.emplace_back("rgb 4:2:0", EncodeJpeg(rgb.data(), 37, 23, 3, 90));
  files.emplace_back("rgb 4:4:4",
                     EncodeJpeg(rgb.data(), 37, 23, 3, 90, /*subsample_chroma=*/false));
  files.emplace_back("gray", EncodeJpeg(gray.data(), 5, 300, 1, 75));
  files.emplace_back("1x1", EncodeJpeg(one.data(), 1, 1, 3, 50));
  files.emplace_back("progressive", EncodeProgressive(rgb, 37, 23));
  // Real camera/editor files where the machine has them (EXIF, ICC, Adobe
  // markers, restart intervals: what a synthetic file lacks).
  const std::filesystem::path walls("/usr/share/wallpapers");
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(walls, ec);
       !ec && it != std::filesystem::recursive_directory_iterator() && files.size() < 9;
       it.increment(ec)) {
    if (it->path().extension() != ".jpg") continue;
    std::ifstream in(it->path(), std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    files.emplace_back(it->path().string(), bytes.str());
  }
  JpegDecoder dec;
  for (const auto& [name, jpeg] : files) {
    SCOPED_TRACE(name);
    const JpegResult want = LibjpegHeader(jpeg, jpeg.size());
    ASSERT_TRUE(want.ok()) << want.error;
    const JpegResult got = dec.ReadHeader(Bytes(jpeg), jpeg.size());
    ASSERT_TRUE(got.ok()) << got.error;
    EXPECT_EQ(got.width, want.width);
    EXPECT_EQ(got.height, want.height);
    EXPECT_EQ(got.channels, want.channels);
    // Every cut through the headers (and a little past the first scan).
    const size_t cuts = std::min<size_t>(jpeg.size(), 4096);
    for (size_t cut = 0; cut < cuts; ++cut) {
      const JpegResult w = LibjpegHeader(jpeg, cut);
      const JpegResult g = dec.ReadHeader(Bytes(jpeg), cut);
      ASSERT_EQ(g.ok(), w.ok()) << "cut at " << cut << ": " << g.error << " / " << w.error;
      if (g.ok()) {
        ASSERT_EQ(g.width, w.width) << "cut at " << cut;
      }
    }
  }

  // Frames the scan leaves to libjpeg, which refuses them by name.
  const std::string base = files[0].second;
  const size_t sof = base.find("\xFF\xC0");
  ASSERT_NE(sof, std::string::npos);
  auto patched = [&](size_t at, char byte) {
    std::string j = base;
    j[at] = byte;
    return j;
  };
  const std::pair<const char*, std::string> refused[] = {
      {"lossless SOF3", patched(sof + 1, '\xC3')},
      {"12-bit samples", patched(sof + 4, 12)},
      {"height 0",
       [&] {
         std::string j = patched(sof + 5, 0);
         j[sof + 6] = 0;
         return j;
       }()},
      {"a second frame", base.substr(0, sof) + base.substr(sof, 19) + base.substr(sof)},
  };
  for (const auto& [what, jpeg] : refused) {
    SCOPED_TRACE(what);
    const JpegResult r = dec.ReadHeader(Bytes(jpeg), jpeg.size());
    EXPECT_FALSE(r.ok());
    EXPECT_EQ(r.error.rfind("corrupt JPEG", 0), 0u) << r.error;
    Pixels buf(37 * 23 * 3);
    EXPECT_FALSE(dec.Decode(Bytes(jpeg), jpeg.size(), 3, buf.data(), buf.size()).ok());
  }
}

TEST(JpegDecoderTest, BadDataGivesErrorValues) {
  JpegDecoder dec;
  // Big enough that half the file is past the headers (~600 bytes).
  const Pixels src = Gradient(160, 120, 3);
  const std::string jpeg = EncodeJpeg(src.data(), 160, 120, 3, 90);
  Pixels buf(160 * 120 * 3);

  JpegResult r = dec.Decode(nullptr, 0, 3, buf.data(), buf.size());
  EXPECT_EQ(r.error, "empty JPEG buffer");
  r = dec.ReadHeader(Bytes(jpeg), 0);
  EXPECT_EQ(r.error, "empty JPEG buffer");

  const std::string png = "\x89PNG\r\n\x1a\n this is not a JPEG at all, just bytes";
  r = dec.Decode(Bytes(png), png.size(), 3, buf.data(), buf.size());
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error.rfind("corrupt JPEG header: ", 0), 0u) << r.error;
  EXPECT_NE(r.error.find("Not a JPEG file"), std::string::npos) << r.error;

  // Cut to half: the header survives, the scan does not.
  const std::string half = jpeg.substr(0, jpeg.size() / 2);
  EXPECT_TRUE(dec.ReadHeader(Bytes(half), half.size()).ok());
  r = dec.Decode(Bytes(half), half.size(), 3, buf.data(), buf.size());
  EXPECT_EQ(r.error, "corrupt JPEG: Premature end of JPEG file");
  // Cut inside the header.
  r = dec.Decode(Bytes(jpeg), 20, 3, buf.data(), buf.size());
  EXPECT_EQ(r.error.rfind("corrupt JPEG header: ", 0), 0u) << r.error;

  // Random bytes over the middle of the entropy-coded data.
  std::string bad = jpeg;
  Rng rng(7);
  for (size_t i = bad.size() / 2; i < bad.size() / 2 + 64; ++i) {
    bad[i] = static_cast<char>(rng.Below(256));
  }
  r = dec.Decode(Bytes(bad), bad.size(), 3, buf.data(), buf.size());
  EXPECT_EQ(r.error.rfind("corrupt JPEG: ", 0), 0u) << r.error;
  EXPECT_GT(r.error.size(), std::string("corrupt JPEG: ").size());

  // Not bad data, bad requests: still values.
  r = dec.Decode(Bytes(jpeg), jpeg.size(), 2, buf.data(), buf.size());
  EXPECT_EQ(r.error, "invalid JPEG request: out_channels must be 1 or 3, got 2");
  r = dec.Decode(Bytes(jpeg), jpeg.size(), 3, buf.data(), buf.size() - 1);
  EXPECT_EQ(r.error, "JPEG destination buffer too small: 160x120x3 needs 57600 bytes, have 57599");

  // The handle is still good after all that.
  r = dec.Decode(Bytes(jpeg), jpeg.size(), 3, buf.data(), buf.size());
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_LT(MeanAbsDiff(src, buf), 3.0);
}

TEST(JpegDecoderTest, HandleRecoversAfterHeaderError) {
  // TurboJPEG 2.1 leaves a handle mid-header after a failed header read;
  // the next read on it returned 0x0 until the decoder reset its handle.
  JpegDecoder dec;
  const Pixels src = Gradient(50, 30, 3);
  const std::string jpeg = EncodeJpeg(src.data(), 50, 30, 3, 90);
  for (size_t cut : {size_t{20}, size_t{200}, jpeg.size() / 3}) {
    SCOPED_TRACE(cut);
    EXPECT_FALSE(dec.ReadHeader(Bytes(jpeg), cut).ok());
    const JpegResult r = dec.ReadHeader(Bytes(jpeg), jpeg.size());
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.width, 50);
    EXPECT_EQ(r.height, 30);
    Pixels buf(50 * 30 * 3);
    EXPECT_TRUE(dec.Decode(Bytes(jpeg), jpeg.size(), 3, buf.data(), buf.size()).ok());
    EXPECT_LT(MeanAbsDiff(src, buf), 3.0);
  }
}

TEST(JpegDecoderTest, LenientModeDecodesTruncatedFileWithWarning) {
  const Pixels src = Gradient(160, 120, 3);
  const std::string jpeg = EncodeJpeg(src.data(), 160, 120, 3, 90);
  const std::string half = jpeg.substr(0, jpeg.size() / 2);
  JpegDecoder dec(JpegDecodeOptions{/*warnings_are_errors=*/false});
  Pixels buf(160 * 120 * 3);
  const JpegResult r = dec.Decode(Bytes(half), half.size(), 3, buf.data(), buf.size());
  EXPECT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.warning, "Premature end of JPEG file");
  EXPECT_EQ(r.width, 160);
  // The top rows were decoded from the data that is there.
  const Pixels full = DecodeOrDie(jpeg, 3);
  const size_t top = 16 * 160 * 3;
  EXPECT_TRUE(std::equal(buf.begin(), buf.begin() + top, full.begin()));
}

TEST(JpegDecoderTest, TwoThreadsDecodeIdentically) {
  std::vector<std::string> jpegs;
  std::vector<Pixels> want;
  for (int i = 0; i < 6; ++i) {
    const int w = 20 + 13 * i, h = 16 + 7 * i, c = i % 2 ? 1 : 3;
    const Pixels src = i % 3 ? Gradient(w, h, c) : Checkerboard(w, h, c, 3 + i);
    jpegs.push_back(EncodeJpeg(src.data(), w, h, c, 80 + i));
    want.push_back(DecodeOrDie(jpegs.back(), 3, i % 2 ? 0 : 8));
  }
  std::vector<int> mismatches(2, 0);
  auto work = [&](int t) {
    JpegDecoder& dec = ThreadLocalJpegDecoder();
    for (int rep = 0; rep < 50; ++rep) {
      for (size_t i = 0; i < jpegs.size(); ++i) {
        Pixels buf(want[i].size());
        const JpegResult r =
            dec.Decode(Bytes(jpegs[i]), jpegs[i].size(), 3, buf.data(), buf.size(), i % 2 ? 0 : 8);
        if (!r.ok() || buf != want[i]) ++mismatches[t];
      }
    }
  };
  std::thread a(work, 0), b(work, 1);
  a.join();
  b.join();
  EXPECT_EQ(mismatches[0], 0);
  EXPECT_EQ(mismatches[1], 0);
  // Each thread had its own handle.
  JpegDecoder* other = nullptr;
  std::thread([&] { other = &ThreadLocalJpegDecoder(); }).join();
  EXPECT_NE(other, &ThreadLocalJpegDecoder());
}

TEST(JpegDecoderTest, EncodeRejectsBadArguments) {
  const Pixels p(12, 0);
  EXPECT_THROW(EncodeJpeg(p.data(), 2, 2, 2, 90), Error);
  EXPECT_THROW(EncodeJpeg(p.data(), 0, 2, 3, 90), Error);
  EXPECT_THROW(EncodeJpeg(p.data(), 2, 2, 3, 0), Error);
}

}  // namespace
}  // namespace cnnflow
