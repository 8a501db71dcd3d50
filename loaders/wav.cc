#include "loaders/wav.h"

#include <cstring>

#include "loaders/folder_dataset.h"
#include "ops/error.h"

namespace cnnflow {
namespace {

constexpr uint16_t kFormatPcm = 1;
constexpr uint16_t kFormatExtensible = 0xFFFE;

uint16_t Le16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t Le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 |
         static_cast<uint32_t>(p[2]) << 16 | static_cast<uint32_t>(p[3]) << 24;
}

const char* FormatName(uint16_t tag) {
  switch (tag) {
    case 1:
      return "PCM";
    case 2:
      return "Microsoft ADPCM";
    case 3:
      return "IEEE float";
    case 6:
      return "A-law";
    case 7:
      return "mu-law";
    case 0x11:
      return "IMA ADPCM";
    case 0x55:
      return "MP3";
    case kFormatExtensible:
      return "extensible";
  }
  return "unknown";
}

std::string FourCc(const uint8_t* p) {
  std::string s;
  for (int i = 0; i < 4; ++i) s += (p[i] >= 32 && p[i] < 127) ? static_cast<char>(p[i]) : '?';
  return s;
}

}  // namespace

std::string DecodeWav(const uint8_t* bytes, size_t size, WavInfo* info,
                      std::vector<float>* samples) {
  *info = WavInfo();
  if (size < 12) return StrCat("file is ", size, " bytes, too short for a RIFF/WAVE header (12)");
  if (std::memcmp(bytes, "RIFF", 4) != 0 || std::memcmp(bytes + 8, "WAVE", 4) != 0) {
    return StrCat("not a RIFF/WAVE file (starts with '", FourCc(bytes), "', form '",
                  FourCc(bytes + 8), "')");
  }
  // The RIFF size field is often wrong in the wild (streamed writers): the
  // file's real size bounds the chunks instead.
  size_t pos = 12;
  bool have_fmt = false;
  uint16_t block_align = 0;
  while (true) {
    if (size - pos < 8) {
      if (!have_fmt) return StrCat("no fmt chunk (the file ends at byte ", size, ")");
      return StrCat("no data chunk (the file ends at byte ", size, ")");
    }
    const uint8_t* chunk = bytes + pos;
    const uint32_t chunk_size = Le32(chunk + 4);
    const size_t left = size - pos - 8;
    if (std::memcmp(chunk, "fmt ", 4) == 0) {
      if (chunk_size < 16) return StrCat("fmt chunk is ", chunk_size, " bytes, needs at least 16");
      if (chunk_size > left) {
        return StrCat("truncated: the fmt chunk at byte ", pos, " says ", chunk_size, " bytes, ",
                      left, " are left");
      }
      const uint8_t* f = chunk + 8;
      uint16_t tag = Le16(f);
      info->channels = Le16(f + 2);
      info->sample_rate = static_cast<int>(Le32(f + 4));
      block_align = Le16(f + 12);
      info->bits = Le16(f + 14);
      if (tag == kFormatExtensible) {
        if (chunk_size < 40) {
          return StrCat("extensible fmt chunk is ", chunk_size, " bytes, needs 40");
        }
        tag = Le16(f + 24);  // the sub-format GUID's first two bytes
        if (tag != kFormatPcm) {
          return StrCat("format is extensible with sub-format ", tag, " (", FormatName(tag),
                        "), only 16-bit PCM is supported");
        }
      }
      if (tag != kFormatPcm) {
        return StrCat("format tag ", tag, " (", FormatName(tag),
                      ") is not PCM; only 16-bit PCM is supported");
      }
      if (info->bits != 16) {
        return StrCat(info->bits, "-bit PCM is not supported, only 16-bit");
      }
      if (info->channels < 1) return "fmt chunk says 0 channels";
      if (block_align != 2 * info->channels) {
        return StrCat("block align ", block_align, " does not match ", info->channels,
                      " channels of 16 bits");
      }
      have_fmt = true;
    } else if (std::memcmp(chunk, "data", 4) == 0) {
      if (!have_fmt) return StrCat("the data chunk at byte ", pos, " comes before any fmt chunk");
      if (chunk_size > left) {
        return StrCat("truncated: the data chunk at byte ", pos, " says ", chunk_size, " bytes, ",
                      left, " are left");
      }
      if (chunk_size % block_align != 0) {
        return StrCat("the data chunk's ", chunk_size, " bytes are not a whole number of ",
                      block_align, "-byte frames");
      }
      info->frames = chunk_size / block_align;
      if (samples == nullptr) return "";
      samples->resize(static_cast<size_t>(info->frames));
      const uint8_t* d = chunk + 8;
      const int c = info->channels;
      if (c == 1) {
        for (int64_t i = 0; i < info->frames; ++i) {
          (*samples)[i] =
              static_cast<float>(static_cast<int16_t>(Le16(d + 2 * i))) * (1.f / 32768.f);
        }
      } else {
        for (int64_t i = 0; i < info->frames; ++i) {
          int32_t sum = 0;
          for (int k = 0; k < c; ++k) sum += static_cast<int16_t>(Le16(d + 2 * (i * c + k)));
          (*samples)[i] = static_cast<float>(sum) / (32768.f * static_cast<float>(c));
        }
      }
      return "";
    }
    // Past the fmt chunk, or any other chunk: skip it and its pad byte.
    const uint64_t skip = uint64_t{chunk_size} + (chunk_size & 1u);
    if (skip > left) {
      return StrCat("truncated: the '", FourCc(chunk), "' chunk at byte ", pos, " says ",
                    chunk_size, " bytes, ", left, " are left",
                    have_fmt ? " (no data chunk before it)" : "");
    }
    pos += 8 + static_cast<size_t>(skip);
  }
}

std::vector<float> ReadWav(const std::string& path, WavInfo* info) {
  std::vector<uint8_t> bytes;
  std::string error = ReadWholeFile(path, &bytes);
  if (!error.empty()) throw Error(StrCat("WAV: ", error));
  WavInfo local;
  std::vector<float> samples;
  error = DecodeWav(bytes.data(), bytes.size(), info ? info : &local, &samples);
  if (!error.empty()) throw Error(StrCat("WAV '", path, "': ", error));
  return samples;
}

}  // namespace cnnflow
