// The fuzz entries of the data and checkpoint parsers (fuzz_targets.h).
// They need only the parsers' own sources, so scripts/fuzz.sh builds them
// without the kernels (fuzz/CMakeLists.txt).
#include <algorithm>
#include <fstream>
#include <set>
#include <string_view>

#include "fuzz/fuzz_targets.h"
#include "fuzz/scratch.h"
#include "loaders/idx_dataset.h"
#include "loaders/image_decoder.h"
#include "loaders/record.h"
#include "loaders/ts_format.h"
#include "loaders/wav.h"
#include "ops/error.h"
#include "ops/io/json.h"
#include "ops/io/pth.h"
#include "ops/io/safetensors.h"
#include "pipeline/checkpoint.h"

namespace cnnflow::fuzz {
namespace fs = std::filesystem;
namespace {

// IDX: the input is [u16 LE n][n bytes: the labels file][the images file],
// each gzip-compressed or plain, as IdxDataset::Open reads them.
}  // namespace

void FuzzIdx(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const size_t n = std::min<size_t>(data[0] | data[1] << 8, size - 2);
  const std::string labels = WriteScratch("labels.idx", data + 2, n);
  const std::string images = WriteScratch("images.idx", data + 2 + n, size - 2 - n);
  const auto ds = IdxDataset::Open(images, labels);
  std::vector<float> sample(static_cast<size_t>(ds->rows() * ds->cols()));
  const int64_t count = std::min<int64_t>(ds->size(), 16);
  for (int64_t i = 0; i < count; ++i) {
    const ReadResult r = ds->Read(ds->size() - 1 - i, ReadContext{}, sample.data());
    if (r.label < 0 || r.label >= ds->num_classes()) Finding("IDX label out of [0, num_classes)");
  }
}

// A decoded record's invariants, then its payload as the LMDB source would
// use it: raw bytes read in full, JPEG/PNG bytes decoded.
namespace {

void CheckRecord(const RecordView& r) {
  if (r.size > 0 && r.data == nullptr) Finding("record: size > 0 but no data");
  Touch(r.data, r.size);
  if (r.encoding == RecordEncoding::kRaw) {
    if (static_cast<uint64_t>(r.numel()) * RecordDTypeSize(r.dtype) != r.size) {
      Finding("record: raw payload size != numel * dtype size");
    }
    return;
  }
  std::vector<uint8_t> hwc;
  const ImageResult image = DecodeImage(r.data, r.size, 0, &hwc);
  if (!image.ok()) throw Error("record payload: " + image.error);
}

}  // namespace

void FuzzCnnflowRecord(const uint8_t* data, size_t size) {
  RecordView r;
  const std::string_view value(reinterpret_cast<const char*>(data), size);
  const RecordStatus status = DecodeCnnflowRecord(value, &r);
  if (!status.ok()) throw Error("cnnflow record: " + status.message());
  CheckRecord(r);
  // What decoded must encode again, to the same bytes (but the dtype byte of
  // an encoded record, which the encoder always writes as u8).
  std::string again = EncodeCnnflowRecord(r);
  if (r.encoding != RecordEncoding::kRaw && again.size() > 6) again[6] = value[6];
  if (again != value) Finding("cnnflow record: decode + encode changed the bytes");
}

void FuzzCaffeDatum(const uint8_t* data, size_t size) {
  RecordView r;
  const std::string_view value(reinterpret_cast<const char*>(data), size);
  const RecordStatus status = DecodeCaffeDatum(value, &r);
  if (!status.ok()) throw Error("caffe datum: " + status.message());
  CheckRecord(r);
  RecordView copy = r;  // re-points gathered float_data at the copy's own
  if (copy.size != r.size) Finding("caffe datum: a copied view has another size");
  Touch(copy.data, copy.size);
  // DecodeRecord's dispatch must agree for values it detects as a Datum.
  if (DetectRecordFormat(value) == RecordFormat::kCaffeDatum) (void)DecodeRecord(value, &r);
}

// JPEG / PNG: the header read, DecodeImage at the channel counts and scales
// the sources use, and the image sources' decode + augment step (reflect
// padding, alternating flip, trivial_augment, color_jitter, erase). The
// parameters come from the input's size, so real files serve as seeds as they are.
void FuzzImage(const uint8_t* data, size_t size) {
  const ImageResult header = ReadImageHeader(data, size);
  static const int kChannels[] = {0, 1, 3};
  static const int kMinSide[] = {0, 0, 8, 24};
  const int channels = kChannels[size % 3];
  const int min_side = kMinSide[(size / 3) % 4];
  std::vector<uint8_t> hwc;
  const ImageResult r = DecodeImage(data, size, channels, &hwc, min_side);
  if (r.ok()) {
    if (!header.ok()) Finding("image: decodes but its header does not read: " + header.error);
    if (r.width <= 0 || r.height <= 0 || (r.channels != 1 && r.channels != 3)) {
      Finding("image: decoded with a bad size or channel count");
    }
    if (hwc.size() != static_cast<size_t>(r.width) * r.height * r.channels) {
      Finding("image: pixel buffer size != width * height * channels");
    }
  }
  static const ImageSampleDecoder* decoder = [] {
    Args args;
    args.Set("pad", int64_t{2});
    args.Set("random_crop", true);
    args.Set("hflip", std::string("alternate"));
    args.Set("pad_mode", std::string("reflect"));
    args.Set("resize_min_side", int64_t{20});
    args.Set("trivial_augment", true);
    args.Set("color_jitter", std::vector<double>{0.4, 0.4, 0.4, 0.1});
    args.Set("erase", 0.5);
    args.FillDefaults(AddImageAugmentParams(Schema("fuzz")));
    return new ImageSampleDecoder(Shape{3, 16, 16}, args);
  }();
  std::vector<float> sample(3 * 16 * 16);
  const std::string error =
      // The sample index from the size too, so the inputs reach every
      // trivial_augment op and color_jitter order.
      decoder->DecodeEncoded(data, size, ReadContext{1, 0, (size & 1) != 0},
                             static_cast<int64_t>(size >> 1), sample.data());
  if (error.empty() != r.ok()) Finding("image: DecodeImage and the sample decoder disagree");
  if (!r.ok()) throw Error("image: " + r.error);
}

void FuzzTs(const uint8_t* data, size_t size) {
  const TsFile f = ParseTs(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.ts");
  (void)f;
}

void FuzzWav(const uint8_t* data, size_t size) {
  WavInfo info;
  std::vector<float> samples;
  const std::string error = DecodeWav(data, size, &info, &samples);
  if (!error.empty()) throw Error("WAV: " + error);
  if (static_cast<int64_t>(samples.size()) != info.frames) Finding("WAV: samples != frames");
  for (float s : samples) {
    if (!(s >= -1.f && s < 1.f)) Finding("WAV: a sample outside [-1, 1)");
  }
}

void FuzzSafetensors(const uint8_t* data, size_t size) {
  const SafetensorsFile f = LoadSafetensors(WriteScratch("fuzz.safetensors", data, size));
  for (const auto& [name, t] : f.tensors) {
    if (t.nbytes() > size) Finding("safetensors: tensor '" + name + "' larger than the file");
  }
}

// A .pth as torch.save writes it (a zip of a pickle and storages). The reader
// makes at most twice the elements of the storages it read (+1M), and a
// storage is at most what deflate can expand the file to. Names of the same
// view share one tensor: each counts once.
void FuzzPth(const uint8_t* data, size_t size) {
  const SafetensorsFile f = LoadPth(WriteScratch("fuzz.pth", data, size));
  std::set<const void*> seen;
  uint64_t elements = 0;
  for (const auto& [name, t] : f.tensors) {
    if (seen.insert(t.raw_data()).second) elements += static_cast<uint64_t>(t.numel());
  }
  if (elements > 2 * 1032 * static_cast<uint64_t>(size) + (1 << 20)) {
    Finding("pth: the tensors hold more elements than the file can");
  }
}

// The sidecar of checkpoints/step-000000001: its data file is a real
// checkpoint's, written once (fuzz/corpus/checkpoint_sidecar/ holds its
// sidecar, so the fuzzer starts from one that loads).
void FuzzCheckpointSidecar(const uint8_t* data, size_t size) {
  static const std::string sidecar = [] {
    const fs::path dir = Scratch() / "run";
    CheckpointState s;
    s.epoch = 1;
    s.global_step = 1;
    s.seed = 7;
    s.config_hash = "0123456789abcdef";
    s.metrics_columns = {"loss"};
    s.metrics_rows = {{0.5}};
    Tensor w = Tensor::Full(Shape{2, 3}, 0.0);
    const Tensor m = Tensor::Full(Shape{2, 3}, 0.25);
    for (int64_t i = 0; i < 6; ++i) w.Set(i, static_cast<double>(i) - 2.5);
    const std::string data_path =
        WriteCheckpoint(dir.string(), s, {{"fc.weight", w}}, {{"fc.weight.momentum", m}}, 0);
    // The fuzzer's input replaces this sidecar; a copy stays beside it (the
    // seed fuzz/corpus/checkpoint_sidecar/valid.json is that copy).
    const std::string path =
        data_path.substr(0, data_path.size() - std::string(".safetensors").size()) + ".json";
    fs::copy_file(path, Scratch() / "valid-sidecar.json", fs::copy_options::overwrite_existing);
    return path;
  }();
  {
    std::ofstream out(sidecar, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  (void)LoadCheckpoint(sidecar);
}

void FuzzJson(const uint8_t* data, size_t size) {
  const Json v = ParseJson(std::string(reinterpret_cast<const char*>(data), size));
  // Written and read back (compact and pretty), the value is the same.
  for (int indent : {-1, 2}) {
    const std::string text = WriteJson(v, indent);
    Json back;
    try {
      back = ParseJson(text);
    } catch (const Error& e) {
      Finding(std::string("JSON: written text does not parse: ") + e.what());
    }
    if (!(back == v)) Finding("JSON: write + parse changed the value");
  }
  if (v.is_number()) {  // typed reads either succeed or throw Error
    try {
      (void)v.AsInt64();
    } catch (const Error&) {
    }
    try {
      (void)v.AsUint64();
    } catch (const Error&) {
    }
    (void)v.AsDouble();
  }
}

}  // namespace cnnflow::fuzz
