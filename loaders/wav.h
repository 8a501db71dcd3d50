// RIFF/WAVE audio files of 16-bit integer PCM (WAVE_FORMAT_PCM, or
// WAVE_FORMAT_EXTENSIBLE with the PCM sub-format), as the spoken-digit set
// ships them. Chunks other than `fmt ` and `data` (LIST, fact, cue, ...) are
// skipped, honouring RIFF's pad byte after odd-sized chunks. Samples become
// floats s / 32768 in [-1, 1); a file with several channels is mixed down
// to mono by averaging its channels (keeps all the signal, where channel 0
// alone could be the silent one).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cnnflow {

struct WavInfo {
  int sample_rate = 0;
  int channels = 0;  // in the file; the decoded samples are mono
  int bits = 0;
  int64_t frames = 0;  // samples per channel
};

// Decodes a whole WAVE file held in memory into mono floats (*samples is
// resized to info->frames). Returns "" or what is wrong, with the byte
// offset where it helps: not RIFF/WAVE, a truncated chunk or data chunk
// ("the data chunk says N bytes, M are left"), a format other than PCM (the
// format tag and its name), a bit depth other than 16, no fmt or data chunk.
// `samples` may be null to read only the header.
std::string DecodeWav(const uint8_t* bytes, size_t size, WavInfo* info,
                      std::vector<float>* samples);

// Reads the file at `path` and decodes it: mono samples in [-1, 1). Throws
// Error "WAV 'PATH': what" (a missing file included).
std::vector<float> ReadWav(const std::string& path, WavInfo* info = nullptr);

}  // namespace cnnflow
