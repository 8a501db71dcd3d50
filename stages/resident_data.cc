#include "stages/resident_data.h"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>

#include "ops/error.h"

namespace cnnflow {
namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Every image of `data` decoded (ReadContext::decoded) into pixels [n, c,
// h, w] and its label into labels, on `threads` threads. Returns a bad
// record's description, or ""; *sizes_differ when an image is not c x h x w.
void DecodeAll(const Dataset& data, int threads, int c, int h, int w, uint8_t* pixels,
               std::vector<int64_t>* labels, std::map<int64_t, std::string>* bad,
               bool* sizes_differ) {
  const int64_t n = data.size();
  const size_t per = static_cast<size_t>(c) * h * w;
  const int64_t floats = data.sample_shape().numel();
  std::atomic<bool> differ{false};
  std::mutex bad_mu;
  tbb::task_arena arena(std::max(1, threads));
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, 64), [&](const auto& range) {
      DecodedImage img;
      std::vector<float> scratch(static_cast<size_t>(floats));  // not written
      for (int64_t i = range.begin(); i < range.end(); ++i) {
        ReadContext rc{0, 0, true, &img};
        img.hwc.clear();
        const ReadResult res = data.Read(i, rc, scratch.data());
        if (!res.ok()) {  // its pixels stay zero; load_batch never hands them out
          std::lock_guard<std::mutex> lock(bad_mu);
          (*bad)[i] = res.error;
          continue;
        }
        if (img.c != c || img.h != h || img.w != w) {
          differ = true;
          continue;
        }
        (*labels)[static_cast<size_t>(i)] = res.label;
        uint8_t* dst = pixels + static_cast<size_t>(i) * per;
        for (int y = 0; y < h; ++y) {  // HWC -> CHW
          for (int x = 0; x < w; ++x) {
            for (int ch = 0; ch < c; ++ch) {
              dst[(static_cast<size_t>(ch) * h + y) * w + x] = img.hwc[(y * w + x) * c + ch];
            }
          }
        }
      }
    });
  });
  *sizes_differ = differ;
}

}  // namespace

Tensor ResidentData::MakeBatch(Device device, const int64_t* ids, int64_t n, uint64_t seed,
                               int64_t epoch) const {
  const auto it = on_gpu_.find(device.index);
  CNNFLOW_ENFORCE(device.is_cuda() && it != on_gpu_.end(), "data.device_resident: the '", name_,
                  "' set is not on ", device.ToString());
  const CropFlipGeometry& g = format_.geometry;
  std::vector<CropFlipDraw> draws(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    draws[i] = DrawCropFlip(options_, g.h, g.w, seed, epoch, ids[i], static_cast<int32_t>(ids[i]));
  }
  return it->second->MakeBatch(draws.data(), n, format_);
}

ResidentData::Made ResidentData::Make(const std::string& name, const Dataset& data,
                                      bool normalized_by_set, const std::vector<Device>& gpus,
                                      int threads) {
  Made made;
  const AugmentOptions* options = data.train_augment();
  const Shape shape = data.sample_shape();
  if (options == nullptr || shape.rank() != 3) {
    made.why_not = StrCat("data.", name, " (", data.description(),
                          ") is not an image source whose pixels the GPU can hold");
    return made;
  }
  if (const std::string key = CropFlipUnsupported(*options); !key.empty()) {
    made.why_not = StrCat("the GPU does not make data.", name, "'s ", key, " yet");
    return made;
  }
  if (!normalized_by_set) {
    made.why_not = StrCat("data.transform's normalize does not fit data.", name, "'s channels");
    return made;
  }
  const int64_t n = data.size();
  CNNFLOW_ENFORCE(n > 0 && n <= INT32_MAX, "data.device_resident: data.", name, " has ", n,
                  " samples");
  const auto start = std::chrono::steady_clock::now();
  // The first good image tells the size; every other must have it.
  DecodedImage first;
  std::vector<float> unused(static_cast<size_t>(shape.numel()));
  std::string first_error;
  bool read_one = false;
  for (int64_t i = 0; i < n && !read_one; ++i) {
    ReadContext ctx{0, 0, true, &first};
    const ReadResult r = data.Read(i, ctx, unused.data());
    read_one = r.ok();
    if (!read_one && first_error.empty())
      first_error = StrCat(data.Key(i), " (sample ", i, "): ", r.error);
  }
  if (!read_one) {
    throw Error(StrCat("data.device_resident: no record of data.", name,
                       " decodes (the first: ", first_error, ")"));
  }
  if (first.hwc.empty()) {
    made.why_not = StrCat("data.", name, "'s source does not hand out its decoded images");
    return made;
  }
  const int c = first.c, h = first.h, w = first.w;
  const size_t per = static_cast<size_t>(c) * h * w;
  // Half the free memory of the fullest GPU, for the model and its batches.
  const size_t bytes = per * static_cast<size_t>(n);
  for (const Device& d : gpus) {
    const size_t free_bytes = ResidentImages::FreeBytes(d);
    if (bytes > free_bytes / 2) {
      made.why_not = StrCat("data.", name, " (", bytes / 1000000, " MB as uint8) is over half of ",
                            d.ToString(), "'s free memory (", free_bytes / 1000000, " MB)");
      return made;
    }
  }
  auto set = std::make_shared<ResidentData>();
  set->name_ = name;
  set->options_ = *options;
  set->labels_.resize(static_cast<size_t>(n));
  std::vector<uint8_t> pixels(bytes);  // [n, c, h, w]
  bool sizes_differ = false;
  DecodeAll(data, threads, c, h, w, pixels.data(), &set->labels_, &set->bad_, &sizes_differ);
  if (sizes_differ) {
    made.why_not = StrCat("data.", name, "'s images are not all ", h, "x", w, "x", c);
    return made;
  }
  made.decode_seconds = Seconds(start);
  set->format_.geometry = CropFlipGeometryOf(*options, c, h, w);
  CropFlipNormalisation(*options, c, &set->format_.mean, &set->format_.std);
  set->pixels_bytes_ = bytes;
  const auto upload = std::chrono::steady_clock::now();
  for (const Device& d : gpus) {
    if (set->on_gpu_.count(d.index) == 0) {
      set->on_gpu_[d.index] = std::make_unique<ResidentImages>(d, pixels.data(), n, c, h, w);
    }
  }
  made.upload_seconds = Seconds(upload);
  made.data = std::move(set);
  return made;
}

}  // namespace cnnflow
