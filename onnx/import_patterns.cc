// Patterns of several ONNX nodes that are one cnnflow layer, as PyTorch's
// exporters write one module: SiLU (Sigmoid then Mul by x), GELU in its
// erf and tanh forms, and ShuffleNet's channel shuffle (Reshape, Transpose,
// Reshape). Each is found from one node and matched by the
// values it computes; a match marks its nodes skipped and its last node
// (the anchor) as the layer.
#include <cmath>

#include "onnx/importer.h"
#include "onnx/tensor_proto.h"

namespace cnnflow::onnx_io {
namespace {

// A scalar constant close to `want` (exporters write sqrt 2, 0.044715 ... as floats).
bool Near(std::optional<double> v, double want) { return v && std::abs(*v - want) < 1e-4; }

}  // namespace

void OnnxImporter::FindPatterns() {
  for (int i = 0; i < g_.node_size(); ++i) {
    if (!live_[i]) continue;
    const auto& n = g_.node(i);
    // SiLU: Sigmoid(x) read only by Mul(x, Sigmoid(x)).
    if (n.op_type() == "Sigmoid" && n.input_size() == 1 && n.output_size() == 1) {
      const int m = SoleReader(n.output(0));
      if (IsBinary(m, "Mul")) {
        const auto& mi = g_.node(m).input();
        if ((mi[0] == n.input(0) && mi[1] == n.output(0)) ||
            (mi[1] == n.input(0) && mi[0] == n.output(0))) {
          Fuse(m, {i}, "silu", Args(), n.input(0));
        }
      }
    }
    if (n.op_type() == "Erf" && n.input_size() == 1 && n.output_size() == 1) MatchGeluErf(i);
    // GELU (tanh): x * 0.5 * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x^3))),
    // found from its Tanh: walked back to x, forward to the end.
    if (n.op_type() == "Tanh" && n.input_size() == 1 && n.output_size() == 1) MatchGeluTanh(i);
    if (n.op_type() == "Transpose" && n.input_size() == 1 && n.output_size() == 1) {
      MatchChannelShuffle(i);
    }
  }
}

// GELU (erf): Div(x, sqrt 2) or Mul(x, 1/sqrt 2) -> Erf -> Add 1 ->
// Mul by x and by 0.5, in either order (or x * 0.5 made first).
void OnnxImporter::MatchGeluErf(int i) {
  const auto& n = g_.node(i);
  const int d = Producer(n.input(0));
  if (d < 0 || SoleReader(n.input(0)) != i || g_.node(d).input_size() != 2) return;
  const bool scaled = (IsBinary(d, "Div") && Near(ScalarIn(d, 1), std::sqrt(2.0))) ||
                      (IsBinary(d, "Mul") && Near(ScalarIn(d, 1), 1 / std::sqrt(2.0)));
  if (!scaled) return;
  const std::string& x = g_.node(d).input(0);
  const int p = SoleReader(n.output(0));
  if (!IsBinary(p, "Add") || !(Near(ScalarIn(p, 1), 1) || Near(ScalarIn(p, 0), 1))) return;
  const int m1 = SoleReader(g_.node(p).output(0));
  if (!IsBinary(m1, "Mul")) return;
  const auto& a = g_.node(m1).input();
  const std::string& other = a[0] == g_.node(p).output(0) ? a[1] : a[0];
  const int m2 = SoleReader(g_.node(m1).output(0));
  auto mul_of = [&](int m, const std::string& v, auto pred) {
    if (!IsBinary(m, "Mul")) return false;
    const auto& b = g_.node(m).input();
    return (b[0] == v && pred(1)) || (b[1] == v && pred(0));
  };
  Args args;
  if (other == x &&
      mul_of(m2, g_.node(m1).output(0), [&](int k) { return Near(ScalarIn(m2, k), 0.5); })) {
    Fuse(m2, {d, i, p, m1}, "gelu", args, x);
  } else if (Near(ScalarIn(m1, a[0] == other ? 0 : 1), 0.5) &&
             mul_of(m2, g_.node(m1).output(0), [&](int k) { return g_.node(m2).input(k) == x; })) {
    Fuse(m2, {d, i, p, m1}, "gelu", args, x);
  } else if (const int h = Producer(other);
             h >= 0 && SoleReader(other) == m1 &&
             mul_of(h, x, [&](int k) { return Near(ScalarIn(h, k), 0.5); })) {
    Fuse(m1, {h, d, i, p}, "gelu", args, x);
  }
}

// The tanh form as torch.onnx writes F.gelu(x, approximate='tanh'):
//   Mul(x, x) -> Mul(., x) | Pow(x, 3);  Mul(., 0.044715);  Add(x, .);
//   Mul(., sqrt(2/pi));  Tanh;  Add(., 1);  Mul(x * 0.5 | x, .) ...
// matched by the values it computes rather than a node order: the
// members are every node between x and the end that only this chain
// reads.
void OnnxImporter::MatchGeluTanh(int t) {
  std::vector<int> members;
  // Backwards: Tanh <- Mul(c, sqrt(2/pi)) <- Add(x, cube * 0.044715).
  const int s = Producer(g_.node(t).input(0));
  if (!IsBinary(s, "Mul") || SoleReader(g_.node(s).output(0)) != t) return;
  int sk = Near(ScalarIn(s, 1), std::sqrt(2 / M_PI))   ? 0
           : Near(ScalarIn(s, 0), std::sqrt(2 / M_PI)) ? 1
                                                       : -1;
  if (sk < 0) return;
  const int a = Producer(g_.node(s).input(sk));
  if (!IsBinary(a, "Add") || SoleReader(g_.node(a).output(0)) != s) return;
  // One side of the Add is x, the other 0.044715 * x^3.
  for (int xi = 0; xi < 2; ++xi) {
    const std::string& x = g_.node(a).input(xi);
    const std::string& cube_scaled = g_.node(a).input(1 - xi);
    const int c = Producer(cube_scaled);
    if (!IsBinary(c, "Mul") || SoleReader(cube_scaled) != a) continue;
    const int ck = Near(ScalarIn(c, 1), 0.044715) ? 0 : Near(ScalarIn(c, 0), 0.044715) ? 1 : -1;
    if (ck < 0) continue;
    const std::string& cube = g_.node(c).input(ck);
    std::vector<int> cube_nodes;
    if (!IsCube(cube, x, &cube_nodes)) continue;
    members = cube_nodes;
    members.insert(members.end(), {c, a, s, t});
    // Forwards: Add(tanh, 1), then the products with x and 0.5.
    const int p = SoleReader(g_.node(t).output(0));
    if (!IsBinary(p, "Add") || !(Near(ScalarIn(p, 1), 1) || Near(ScalarIn(p, 0), 1))) return;
    members.push_back(p);
    // The rest multiplies (1 + tanh) by x and by 0.5: either 0.5 * x made
    // first (a Mul of x, read only here) or two Muls after.
    const int m1 = SoleReader(g_.node(p).output(0));
    if (!IsBinary(m1, "Mul")) return;
    const auto& mi = g_.node(m1).input();
    const std::string& other = mi[0] == g_.node(p).output(0) ? mi[1] : mi[0];
    const int h = Producer(other);
    if (IsBinary(h, "Mul") && SoleReader(other) == m1 &&
        ((g_.node(h).input(0) == x && Near(ScalarIn(h, 1), 0.5)) ||
         (g_.node(h).input(1) == x && Near(ScalarIn(h, 0), 0.5)))) {
      members.push_back(h);
      Args args;
      args.Set("approximate", std::string("tanh"));
      return Fuse(m1, members, "gelu", args, x);
    }
    const int m2 = SoleReader(g_.node(m1).output(0));
    if (!IsBinary(m2, "Mul")) return;
    const auto& m2i = g_.node(m2).input();
    const std::string& last = m2i[0] == g_.node(m1).output(0) ? m2i[1] : m2i[0];
    const bool x_then_half =
        other == x && IsConst(last) && Near(ScalarIn(m2, m2i[0] == last ? 0 : 1), 0.5);
    const bool half_then_x =
        IsConst(other) && Near(ScalarIn(m1, mi[0] == other ? 0 : 1), 0.5) && last == x;
    if (!x_then_half && !half_then_x) return;
    members.push_back(m1);
    Args args;
    args.Set("approximate", std::string("tanh"));
    return Fuse(m2, members, "gelu", args, x);
  }
}

// ShuffleNet's channel_shuffle as torchvision writes it, x.view(N, g, C/g,
// ...).transpose(1, 2).reshape(N, C, ...): Reshape to [N, g, C/g, rest] ->
// Transpose (perm swaps axes 1 and 2) -> Reshape to [N, C, rest], found
// from its Transpose. The target shapes are constants, or shape arithmetic
// that is folded only as the nodes are converted (a dynamic batch), so they
// are read when the last Reshape is (ResolveChannelShuffle).
void OnnxImporter::MatchChannelShuffle(int t) {
  const auto& n = g_.node(t);
  std::vector<int64_t> perm;
  for (const auto& at : n.attribute())
    if (at.name() == "perm") perm.assign(at.ints().begin(), at.ints().end());
  const int r1 = Producer(n.input(0)), r2 = SoleReader(n.output(0));
  if (perm.size() < 3 || perm[0] != 0 || perm[1] != 2 || perm[2] != 1) return;
  for (size_t d = 3; d < perm.size(); ++d)
    if (perm[d] != static_cast<int64_t>(d)) return;
  if (!IsOp(r1, "Reshape") || !IsOp(r2, "Reshape") || SoleReader(n.input(0)) != t) return;
  if (!HasIn(r1, 1) || !HasIn(r2, 1)) return;
  const size_t rank = perm.size();
  Fuse(r2, {r1, t}, "channel_shuffle", Args(), In(r1, 0), Shape(),
       [this, r1, rank](int anchor, Fused& f) { ResolveChannelShuffle(anchor, r1, rank, f); });
}

void OnnxImporter::ResolveChannelShuffle(int anchor, int r1, size_t rank, Fused& f) {
  if (!IsConst(In(r1, 1)) || !IsConst(In(anchor, 1))) {
    Fail(anchor, "ends a Reshape -> Transpose -> Reshape whose shapes are not constants");
  }
  const std::vector<int64_t> split = IntsOf(consts_.at(In(r1, 1)));
  const std::vector<int64_t> back = IntsOf(consts_.at(In(anchor, 1)));
  const int64_t g = split.size() == rank ? split[1] : 0, k = split.size() == rank ? split[2] : 0;
  bool ok = back.size() + 1 == rank && g >= 1 && k >= 1 && IsBatchDim(split[0]) &&
            IsBatchDim(back[0]) && back[1] == g * k;
  std::vector<int64_t> sample = {g * k};  // what x must be, per sample: [C, rest...]
  for (size_t d = 3; ok && d < rank; ++d) {
    ok = split[d] >= 1 && back[d - 1] == split[d];
    sample.push_back(split[d]);
  }
  if (!ok) {
    Fail(anchor, StrCat("ends a Reshape ", Shape(split), " -> Transpose -> Reshape ", Shape(back),
                        ", which is not a channel shuffle (x.view(N, g, C/g, ...).transpose(1, "
                        "2).reshape(N, C, ...))"));
  }
  f.args.Set("groups", g);
  f.x_shape = Shape(sample);
}

// Whether `v` is x^3 (Pow(x, 3), or Mul(Mul(x, x), x) in any order),
// computed only for this chain; its nodes go to `nodes`.
bool OnnxImporter::IsCube(const std::string& v, const std::string& x,
                          std::vector<int>* nodes) const {
  const int c = Producer(v);
  if (c < 0 || g_.node(c).input_size() != 2) return false;
  const auto& in = g_.node(c).input();
  if (IsBinary(c, "Pow")) {
    const auto e = ScalarIn(c, 1);
    if (in[0] != x || !e || *e != 3) return false;
    nodes->push_back(c);
    return true;
  }
  if (!IsBinary(c, "Mul")) return false;
  for (int k = 0; k < 2; ++k) {
    if (in[k] != x) continue;
    const int sq = Producer(in[1 - k]);
    if (IsBinary(sq, "Mul") && SoleReader(in[1 - k]) == c && g_.node(sq).input(0) == x &&
        g_.node(sq).input_size() == 2 && g_.node(sq).input(1) == x) {
      nodes->insert(nodes->end(), {sq, c});
      return true;
    }
  }
  return false;
}

void OnnxImporter::Fuse(int anchor, const std::vector<int>& members, const std::string& type,
                        Args args, const std::string& x, const Shape& x_shape,
                        std::function<void(int, Fused&)> resolve) {
  if (fused_.count(anchor) || skip_.count(anchor)) return;
  for (int m : members)
    if (skip_.count(m) || fused_.count(m)) return;
  fused_[anchor] = Fused{type, std::move(args), x, x_shape, std::move(resolve)};
  skip_.insert(members.begin(), members.end());
}

}  // namespace cnnflow::onnx_io
