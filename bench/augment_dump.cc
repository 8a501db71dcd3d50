// augment_dump: runs the augmenter's TrivialAugmentWide and ColorJitter with
// given parameters on raw images, for bench/augment_vs_torchvision.py (which
// runs torchvision on the same images and parameters). Not part of CI.
//
//   augment_dump table              14 lines: each op's name, whether it is
//                                   signed, and its 31 magnitudes
//   augment_dump < cases            one case per line, the output a raw
//                                   [c, h, w] float32 file of values in [0, 1]:
//     IN H W C OUT trivial OP MAGNITUDE
//     IN H W C OUT jitter XB XC XS XH FB FC FS FH O0 O1 O2 O3
// IN is a raw [h, w, c] uint8 image; the sample is the whole image (centre
// crop of its own size, no normalisation); for jitter XB..XH are the
// color_jitter options (0: that op off), FB..FH the drawn factors and
// O0..O3 the order.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "loaders/augment.h"
#include "loaders/image_ops.h"

int main(int argc, char** argv) {
  using namespace cnnflow;
  if (argc > 1 && std::string(argv[1]) == "table") {
    for (int op = 0; op < kTrivialOps; ++op) {
      std::printf("%s %d", TrivialOpName(static_cast<TrivialOp>(op)),
                  TrivialOpSigned(static_cast<TrivialOp>(op)) ? 1 : 0);
      for (int bin = 0; bin < kTrivialBins; ++bin) {
        std::printf(" %.9g", TrivialMagnitude(static_cast<TrivialOp>(op), bin));
      }
      std::printf("\n");
    }
    return 0;
  }
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string path, out_path, kind;
    int h, w, c;
    in >> path >> h >> w >> c >> out_path >> kind;
    std::vector<uint8_t> img(static_cast<size_t>(h) * w * c);
    std::ifstream(path, std::ios::binary).read(reinterpret_cast<char*>(img.data()), img.size());
    AugmentOptions o;
    o.out_h = h;
    o.out_w = w;
    AugmentParams p;
    if (kind == "trivial") {
      int op;
      in >> op >> p.trivial_magnitude;
      p.trivial_op = static_cast<TrivialOp>(op);
      o.trivial_augment = true;
    } else {
      for (double& x : o.color_jitter) in >> x;
      for (double& f : p.jitter) in >> f;
      for (int& k : p.jitter_order) in >> k;
    }
    std::vector<float> out(img.size());
    Augmenter(o).RunWithParams(img.data(), h, w, c, p, out.data());
    std::ofstream(out_path, std::ios::binary)
        .write(reinterpret_cast<const char*>(out.data()), out.size() * sizeof(float));
  }
  return 0;
}
