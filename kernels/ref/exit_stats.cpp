// Exit-confidence statistics of each row's softmax, summed in double: the GPU twin sums in float
// and is checked against these values.
#include <cmath>

#include "kernels/kernels.h"

namespace helios::kernels {

void uniform_stats(int32_t n_vocab, float& top1_prob, float& margin, float& entropy) {
  top1_prob = static_cast<float>(1.0 / n_vocab);
  margin = n_vocab > 1 ? 0.0f : 1.0f;
  entropy = static_cast<float>(std::log(static_cast<double>(n_vocab)));
}

int32_t ref_argmax(const float* x, int32_t n) {
  int32_t best = 0;
  float best_value = -INFINITY;
  for (int32_t i = 0; i < n; ++i) {
    const float v = softmax_logit(x[i]);
    if (v > best_value) {
      best = i;
      best_value = v;
    }
  }
  return best;
}

double ref_neg_log_prob(const float* row, int32_t n, int32_t token) {
  LogSoftmax ls;
  ls.max = softmax_logit(row[ref_argmax(row, n)]);
  double sum = n;  // no number above −inf: uniform
  if (ls.max != -INFINITY) {
    sum = 0;
    for (int32_t i = 0; i < n; ++i) sum += std::exp(static_cast<double>(softmax_logit(row[i])) - ls.max);
  }
  ls.log_sum = std::log(sum);
  return -ls.at(row[token]);
}

void ref_exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1,
                    float* top1_prob, float* margin, float* entropy) {
  for (int32_t r = 0; r < n_rows; ++r) {
    const float* x = logits + static_cast<int64_t>(r) * n_vocab;
    const int32_t best = ref_argmax(x, n_vocab);
    float second = -INFINITY;
    for (int32_t i = 0; i < n_vocab; ++i) if (i != best) second = std::fmax(second, softmax_logit(x[i]));
    const float m = softmax_logit(x[best]);
    top1[r] = best;
    if (m == -INFINITY) {  // no number above −inf: no token is preferred
      uniform_stats(n_vocab, top1_prob[r], margin[r], entropy[r]);
      continue;
    }
    // sum = Σ e^(x−m); entropy = log(sum) − Σ (x−m)·e^(x−m) / sum
    double sum = 0, weighted = 0;
    for (int32_t i = 0; i < n_vocab; ++i) {
      const double d = static_cast<double>(softmax_logit(x[i])) - m;
      const double e = std::exp(d);
      sum += e;
      if (e > 0) weighted += d * e;  // a masked logit (−inf) adds nothing, not −inf·0
    }
    top1_prob[r] = static_cast<float>(1.0 / sum);
    margin[r] = n_vocab > 1 ? static_cast<float>((1.0 - std::exp(static_cast<double>(second) - m)) / sum)
                            : 1.0f;
    entropy[r] = static_cast<float>(std::log(sum) - weighted / sum);
  }
}

}  // namespace helios::kernels
