// Exit-confidence statistics of each row's softmax, summed in double: the GPU twin sums in float
// and is checked against these values.
#include <cmath>

#include "kernels/kernels.h"

namespace helios::kernels {

void ref_exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1,
                    float* top1_prob, float* margin, float* entropy) {
  for (int32_t r = 0; r < n_rows; ++r) {
    const float* x = logits + static_cast<int64_t>(r) * n_vocab;
    int32_t best = 0;
    for (int32_t i = 1; i < n_vocab; ++i) if (x[i] > x[best]) best = i;
    float second = -INFINITY;
    for (int32_t i = 0; i < n_vocab; ++i) if (i != best && x[i] > second) second = x[i];
    const float m = x[best];
    // sum = Σ e^(x−m); entropy = log(sum) − Σ (x−m)·e^(x−m) / sum
    double sum = 0, weighted = 0;
    for (int32_t i = 0; i < n_vocab; ++i) {
      const double d = static_cast<double>(x[i]) - m;
      const double e = std::exp(d);
      sum += e;
      if (e > 0) weighted += d * e;  // a masked logit (−inf) adds nothing, not −inf·0
    }
    top1[r] = best;
    top1_prob[r] = static_cast<float>(1.0 / sum);
    margin[r] = n_vocab > 1 ? static_cast<float>((1.0 - std::exp(static_cast<double>(second) - m)) / sum)
                            : 1.0f;
    entropy[r] = static_cast<float>(std::log(sum) - weighted / sum);
  }
}

}  // namespace helios::kernels
