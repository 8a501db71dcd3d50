#include <algorithm>
#include <cmath>
#include <vector>

#include "ops/cpu/parallel.h"
#include "ops/loss.h"

namespace cnnflow {

LossResult SoftmaxCrossEntropy(const Tensor& logits, const int64_t* labels, Tensor* dlogits,
                               double grad_scale, double label_smoothing, const LabelMix* mix) {
  if (logits.rank() != 2) {
    throw ShapeError(StrCat("softmax cross-entropy expects logits [N, K], got ", logits.shape()));
  }
  const int64_t n = logits.dim(0), k = logits.dim(1);
  CNNFLOW_ENFORCE(k > 0, "softmax cross-entropy over ", k, " classes");
  CNNFLOW_ENFORCE(label_smoothing >= 0.0 && label_smoothing <= 1.0,
                  "label_smoothing must be in [0, 1], got ", label_smoothing);
  if (dlogits != nullptr) {
    CNNFLOW_ENFORCE(dlogits->shape() == logits.shape() && dlogits->dtype() == logits.dtype(),
                    "dlogits ", dlogits->shape(), " ", DTypeName(dlogits->dtype()), " for logits ",
                    logits.shape(), " ", DTypeName(logits.dtype()));
  }
  // Checked up front: throwing from inside the parallel loop would leave
  // dlogits half written.
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] < 0 || labels[i] >= k) {
      throw Error(StrCat("label ", labels[i], " at index ", i, " is out of range [0, ", k,
                         ") for logits ", logits.shape()));
    }
    if (mix != nullptr &&
        (mix->other[i] < 0 || mix->other[i] >= k || !(mix->weight[i] >= 0) || mix->weight[i] > 1)) {
      throw Error(StrCat("mixed label ", mix->other[i], " with weight ", mix->weight[i],
                         " at index ", i, " is out of range ([0, ", k, "), [0, 1])"));
    }
  }
  LossResult result;
  if (n == 0) return result;
  const double scale = grad_scale < 0 ? 1.0 / static_cast<double>(n) : grad_scale;
  const double eps = label_smoothing;
  const double off = eps / static_cast<double>(k);  // target mass of every class
  const double on = 1.0 - eps + off;                // target mass of the label

  // Per-chunk partial sums, added in chunk order: deterministic.
  const int64_t chunks = cpu::NumChunks(n, std::max<int64_t>(1, 4096 / k));
  std::vector<double> loss_part(chunks, 0.0);
  std::vector<int64_t> correct_part(chunks, 0);
  DispatchFloat(logits.dtype(), [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    const T* z = logits.data<T>();
    T* dz = dlogits != nullptr ? dlogits->data<T>() : nullptr;
    cpu::ForChunks(n, chunks, [&](int64_t c, int64_t r0, int64_t r1) {
      double loss = 0;
      int64_t correct = 0;
      for (int64_t r = r0; r < r1; ++r) {
        const T* row = z + r * k;
        int64_t arg = 0;
        for (int64_t j = 1; j < k; ++j) {
          if (row[j] > row[arg]) arg = j;
        }
        const double mx = static_cast<double>(row[arg]);
        double sum_exp = 0, sum_z = 0;
        for (int64_t j = 0; j < k; ++j) {
          const double v = static_cast<double>(row[j]);
          sum_exp += std::exp(v - mx);
          sum_z += v;
        }
        const double lse = mx + std::log(sum_exp);
        const int64_t y = labels[r];
        // -sum_j target_j * log p_j with log p_j = z_j - lse.
        double nll = lse - static_cast<double>(row[y]);
        int64_t y2 = y;  // the mixed-in label and its weight
        double w2 = 0;
        if (mix != nullptr) {
          y2 = mix->other[r];
          w2 = 1.0 - static_cast<double>(mix->weight[r]);
          nll = (1.0 - w2) * nll + w2 * (lse - static_cast<double>(row[y2]));
        }
        loss += eps > 0 ? (1.0 - eps) * nll + off * (static_cast<double>(k) * lse - sum_z) : nll;
        correct += arg == (w2 > 0.5 ? y2 : y) ? 1 : 0;
        if (dz != nullptr) {
          T* drow = dz + r * k;
          for (int64_t j = 0; j < k; ++j) {
            const double p = std::exp(static_cast<double>(row[j]) - lse);
            double target = j == y ? on : off;
            if (mix != nullptr) {
              target = off;
              if (j == y) target += (1.0 - eps) * (1.0 - w2);
              if (j == y2) target += (1.0 - eps) * w2;
            }
            drow[j] = static_cast<T>(scale * (p - target));
          }
        }
      }
      loss_part[c] = loss;
      correct_part[c] = correct;
    });
  });
  double total = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    total += loss_part[c];
    result.correct += correct_part[c];
  }
  result.loss = total / static_cast<double>(n);
  return result;
}

}  // namespace cnnflow
