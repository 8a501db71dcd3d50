// Resizing: Resize <-> upsample (nearest as PyTorch's: asymmetric + floor;
// bilinear: linear with half_pixel or align_corners), scales or sizes as
// constants. PyTorch uses 1/scale as the coordinate ratio when a scale is
// given, in/out when a size is, as ONNX does with scales and sizes; out,
// sizes are [N, C] of the input (N is symbolic) ++ [H', W'].
#include <cstring>

#include "onnx/converter.h"
#include "onnx/exporter.h"
#include "onnx/importer.h"
#include "ops/layers/upsample.h"

namespace cnnflow::onnx_io {
namespace {

void ImportResize(OnnxImporter& im, int i, NodeAttrs& a) {
  const Val x = im.ValIn(i, 0);
  const std::string mode = a.String("mode", "nearest");
  const std::string coord = a.String("coordinate_transformation_mode", "half_pixel");
  const std::string nearest = a.String("nearest_mode", "round_prefer_floor");
  a.Float("cubic_coeff_a", -0.75);
  if (a.Int("exclude_outside", 0) != 0) im.Fail(i, "exclude_outside is not supported");
  a.Float("extrapolation_value", 0);
  a.Done();
  if (x.shape.rank() != 3) im.Fail(i, "cnnflow's upsample takes [C, H, W] samples");
  Args args;
  if (mode == "nearest") {
    if (coord != "asymmetric" || nearest != "floor") {
      im.Fail(i, StrCat("nearest with ", coord, " / ", nearest,
                        "; cnnflow's is PyTorch's (asymmetric, floor)"));
    }
  } else if (mode == "linear") {
    args.Set("mode", std::string("bilinear"));
    if (coord == "align_corners") {
      args.Set("align_corners", true);
    } else if (coord != "half_pixel" && coord != "pytorch_half_pixel") {
      im.Fail(i, StrCat("linear with ", coord, "; cnnflow takes half_pixel or align_corners"));
    }
  } else {
    im.Fail(i, StrCat("mode ", mode, "; cnnflow's upsample is nearest or (bi)linear"));
  }
  const Tensor* scales = im.HasIn(i, 2) ? &im.ConstIn(i, 2) : nullptr;
  const Tensor* sizes = im.HasIn(i, 3) ? &im.ConstIn(i, 3) : nullptr;
  if (scales != nullptr && scales->numel() == 4) {
    if (scales->At(0) != 1 || scales->At(1) != 1) im.Fail(i, "scales the batch or the channels");
    const double sh = scales->At(2), sw = scales->At(3);
    if (!(sh > 0 && sh <= 1024 && sw > 0 && sw <= 1024))
      im.Fail(i, StrCat("scales ", sh, " x ", sw, " are not in (0, 1024]"));
    args.Set("scale", sh == sw ? std::vector<double>{sh} : std::vector<double>{sh, sw});
  } else if (sizes != nullptr && sizes->numel() == 4) {
    const double h = sizes->At(2), w = sizes->At(3);
    if (!(h >= 1 && h <= (1 << 20) && w >= 1 && w <= (1 << 20)))
      im.Fail(i, "sizes are not in [1, 2^20]");
    args.Set("size", std::vector<int64_t>{static_cast<int64_t>(h), static_cast<int64_t>(w)});
  } else {
    im.Fail(i, "needs constant scales or sizes of 4 values");
  }
  im.Simple(i, "upsample", args);
}

// Resize (opset 11+): inputs X, roi (unused), scales or sizes. PyTorch
// uses 1/scale as the coordinate ratio when a scale is given, in/out when
// a size is, as ONNX does with scales / sizes.
void ExportUpsample(OnnxExporter& ex, int i) {
  const auto& l = ex.As<Upsample>(i);
  onnx::NodeProto* n = nullptr;
  if (l.scale_h() > 0) {
    const std::string scales = l.name() + "/scales";
    Tensor s = Tensor::Empty(Shape{4}, DType::kF32);
    const float values[4] = {1.f, 1.f, static_cast<float>(l.scale_h()),
                             static_cast<float>(l.scale_w())};
    std::memcpy(s.raw_data(), values, sizeof(values));
    ex.AddInitializer(scales, s);
    n = ex.Node("Resize", i, {ex.In(i), "", scales}, ex.Out(i));
  } else {
    // sizes = [N, C] of the input (N is symbolic) ++ [H', W'].
    const std::string p = l.name() + "/";
    ex.AddInts(p + "zero", {0});
    ex.AddInts(p + "two", {2});
    ex.AddInts(p + "out_hw", {l.out_h(), l.out_w()});
    ex.Node("Shape", i, {ex.In(i)}, p + "shape", "/shape");
    ex.Node("Slice", i, {p + "shape", p + "zero", p + "two"}, p + "nc", "/nc");
    ex.Int(ex.Node("Concat", i, {p + "nc", p + "out_hw"}, p + "sizes", "/sizes"), "axis", 0);
    n = ex.Node("Resize", i, {ex.In(i), "", "", p + "sizes"}, ex.Out(i));
  }
  if (l.bilinear()) {
    ex.Str(n, "mode", "linear");
    ex.Str(n, "coordinate_transformation_mode", l.align_corners() ? "align_corners" : "half_pixel");
  } else {
    ex.Str(n, "mode", "nearest");
    ex.Str(n, "coordinate_transformation_mode", "asymmetric");
    ex.Str(n, "nearest_mode", "floor");
  }
}

}  // namespace

CNNFLOW_ONNX_IMPORT(Resize, "upsample (nearest or bilinear; constant scales or sizes)",
                    ImportResize);
CNNFLOW_ONNX_EXPORT(upsample, "Resize (scales, or sizes)", ExportUpsample);

}  // namespace cnnflow::onnx_io
