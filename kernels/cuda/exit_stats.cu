// Exit-confidence statistics, one block per row of logits: a pass for the top two logits, a pass
// for Σe^(x−max) and Σ(x−max)e^(x−max); probabilities and entropy follow from those.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 512;

struct Top2 {
  float v1;    // best value
  int32_t i1;  // its index (lowest on ties)
  float v2;    // best value at any other index
};

__device__ __forceinline__ Top2 merge(const Top2& a, const Top2& b) {
  const bool b_wins = b.v1 > a.v1 || (b.v1 == a.v1 && b.i1 < a.i1);
  return b_wins ? Top2{b.v1, b.i1, fmaxf(b.v2, a.v1)} : Top2{a.v1, a.i1, fmaxf(a.v2, b.v1)};
}

__global__ void __launch_bounds__(kThreads) exit_stats_kernel(const float* logits, int32_t n_vocab,
                                                              int32_t* top1, float* top1_prob,
                                                              float* margin, float* entropy) {
  cuda::inputs_ready();
  const float* x = logits + static_cast<int64_t>(blockIdx.x) * n_vocab;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  Top2 t{-INFINITY, INT32_MAX, -INFINITY};
  for (int32_t i = threadIdx.x; i < n_vocab; i += blockDim.x) {
    t = merge(t, Top2{cuda::softmax_logit(x[i]), i, -INFINITY});
  }
  for (int o = 16; o > 0; o >>= 1) {
    const Top2 other{__shfl_xor_sync(cuda::kFullMask, t.v1, o), __shfl_xor_sync(cuda::kFullMask, t.i1, o),
                     __shfl_xor_sync(cuda::kFullMask, t.v2, o)};
    t = merge(t, other);
  }
  __shared__ Top2 warp_top[kThreads / 32];
  __shared__ float scratch[32];
  if (lane == 0) warp_top[warp] = t;
  __syncthreads();
  Top2 best = warp_top[0];
  for (int w = 1; w < kThreads / 32; ++w) best = merge(best, warp_top[w]);

  const float m = best.v1;
  float sum = 0.0f, weighted = 0.0f;
  for (int32_t i = threadIdx.x; i < n_vocab; i += blockDim.x) {
    const float d = cuda::softmax_logit(x[i]) - m;
    const float e = expf(d);
    sum += e;
    if (e > 0.0f) weighted += d * e;  // a masked logit (-inf) adds nothing, not -inf*0
  }
  sum = cuda::block_sum(sum, scratch);
  weighted = cuda::block_sum(weighted, scratch);
  if (threadIdx.x == 0) {
    const int32_t r = blockIdx.x;
    top1[r] = best.i1;
    if (m == -INFINITY) {  // no number above -inf: no token is preferred (uniform_stats)
      top1_prob[r] = 1.0f / n_vocab;
      margin[r] = n_vocab > 1 ? 0.0f : 1.0f;
      entropy[r] = logf(static_cast<float>(n_vocab));
      return;
    }
    top1_prob[r] = 1.0f / sum;
    margin[r] = -expm1f(best.v2 - m) / sum;  // 1 - e^d without cancellation when the top two are close
    entropy[r] = logf(sum) - weighted / sum;
  }
}

}  // namespace

int launch_exit_stats(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* top1,
                      float* top1_prob, float* margin, float* entropy, void* stream) {
  if (n_rows <= 0 || n_vocab <= 0) return 0;
  return cuda::launch_chained("exit_stats_kernel", exit_stats_kernel, n_rows, kThreads, 0, cuda::as_stream(stream),
                              logits, n_vocab, top1, top1_prob, margin, entropy);
}

}  // namespace helios::kernels
