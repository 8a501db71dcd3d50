// PNG fixtures for loader tests: encodes pixels with libpng's own encoder,
// so the decoder under test is checked against an independent writer.
#pragma once

#include <png.h>

#include <csetjmp>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace cnnflow {
namespace testing {

namespace png_fixture_detail {
inline void PngWriteTo(png_structp png, png_bytep data, size_t n) {
  static_cast<std::string*>(png_get_io_ptr(png))->append(reinterpret_cast<const char*>(data), n);
}
inline void PngFlush(png_structp) {}
}  // namespace png_fixture_detail

// Encodes rows already in PNG's sample layout (rowbytes = ceil(width *
// samples * bit_depth / 8); 16-bit samples big-endian; sub-byte samples
// packed from the high bit) with libpng. palette: RGB triples; trns: the
// palette's alpha values. Throws std::runtime_error on libpng errors.
inline std::string WritePng(int width, int height, int color_type, int bit_depth,
                            const std::vector<uint8_t>& rows, bool interlace = false,
                            const std::vector<uint8_t>& palette = {},
                            const std::vector<uint8_t>& trns = {}) {
  std::string out;
  std::vector<png_bytep> row_ptrs(static_cast<size_t>(height));
  const size_t rowbytes = rows.size() / height;
  for (int y = 0; y < height; ++y) {
    row_ptrs[y] = const_cast<png_bytep>(rows.data() + y * rowbytes);
  }
  std::vector<png_color> colors;
  for (size_t i = 0; i + 2 < palette.size(); i += 3) {
    colors.push_back({palette[i], palette[i + 1], palette[i + 2]});
  }
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, nullptr, nullptr, nullptr);
  png_infop info = png_create_info_struct(png);
  // The objects above live in this frame, which a longjmp returns to.
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    throw std::runtime_error("libpng failed to write the fixture");
  }
  png_set_write_fn(png, &out, png_fixture_detail::PngWriteTo, png_fixture_detail::PngFlush);
  png_set_IHDR(png, info, width, height, bit_depth, color_type,
               interlace ? PNG_INTERLACE_ADAM7 : PNG_INTERLACE_NONE, PNG_COMPRESSION_TYPE_DEFAULT,
               PNG_FILTER_TYPE_DEFAULT);
  if (!colors.empty()) png_set_PLTE(png, info, colors.data(), static_cast<int>(colors.size()));
  if (!trns.empty()) {
    png_set_tRNS(png, info, trns.data(), static_cast<int>(trns.size()), nullptr);
  }
  png_write_info(png, info);
  png_write_image(png, row_ptrs.data());
  png_write_end(png, nullptr);
  png_destroy_write_struct(&png, &info);
  return out;
}

}  // namespace testing
}  // namespace cnnflow
