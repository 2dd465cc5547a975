// Argmax and seeded sampling, one block per row, following ref_sample step by step: the same
// candidates in the same order, the same float exponentials, running sums in double, and the same
// uniform (sample_uniform). Only the association of the sums differs, which can change the pick
// only when u · Σp falls within rounding of a boundary between two ids.
//
// Candidates (top-k / top-p): a radix select over the 32-bit order keys of z = x / T finds the
// k-th best key; ids above it and the lowest-index ties are gathered, bitonic-sorted in shared
// memory by (z desc, id asc), and one thread walks them as the twin does.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"
#include "kernels/sample_rng.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 1024;  // = kSampleMaxCandidates: one thread per candidate in the sort
static_assert(kThreads == kSampleMaxCandidates, "the bitonic sort gives each candidate a thread");

struct Best {
  float v;
  int32_t i;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a;
}

// The index of the largest x (lowest on ties), known to every thread.
__device__ int32_t block_argmax(const float* x, int32_t n) {
  __shared__ Best warp_best[32];
  Best b{-INFINITY, INT32_MAX};
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) b = better(b, Best{x[i], i});
  for (int o = 16; o > 0; o >>= 1) {
    b = better(b, Best{__shfl_xor_sync(cuda::kFullMask, b.v, o), __shfl_xor_sync(cuda::kFullMask, b.i, o)});
  }
  __syncthreads();
  if (threadIdx.x % 32 == 0) warp_best[threadIdx.x / 32] = b;
  __syncthreads();
  Best all = warp_best[0];
  for (int w = 1; w < static_cast<int>(blockDim.x + 31) / 32; ++w) all = better(all, warp_best[w]);
  return all.i;
}

__global__ void argmax_kernel(const float* logits, int32_t n_vocab, int32_t* out) {
  const int32_t best = block_argmax(logits + static_cast<int64_t>(blockIdx.x) * n_vocab, n_vocab);
  if (threadIdx.x == 0) out[blockIdx.x] = best;
}

// Whole vocabulary in index order: each thread sums a contiguous chunk; thread 0 finds the chunk,
// then the id, where the running sum passes u · Σp.
__device__ int32_t sample_whole(const float* x, int32_t n, float temperature, float u) {
  __shared__ float scratch[32];
  __shared__ double chunk_sum[kThreads];
  float m = -INFINITY;
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, x[i] / temperature);
  m = cuda::block_max(m, scratch);
  const int32_t chunk = (n + blockDim.x - 1) / blockDim.x;
  const int32_t begin = threadIdx.x * chunk, end = min(n, begin + chunk);
  double s = 0.0;
  for (int32_t i = begin; i < end; ++i) s += expf(x[i] / temperature - m);
  chunk_sum[threadIdx.x] = s;
  __syncthreads();
  __shared__ int32_t pick;
  if (threadIdx.x == 0) {
    const int n_chunks = blockDim.x;
    double total = 0.0;
    for (int c = 0; c < n_chunks; ++c) total += chunk_sum[c];
    const double target = static_cast<double>(u) * total;
    double cum = 0.0;
    int c = 0;
    while (c < n_chunks && target >= cum + chunk_sum[c]) cum += chunk_sum[c++];
    const int32_t lo = min(n, c * chunk), hi = min(n, (c + 1) * chunk);
    int32_t found = -1;
    for (int32_t i = lo; i < hi && found < 0; ++i) {
      cum += expf(x[i] / temperature - m);
      if (target < cum) found = i;
    }
    if (found < 0) {  // past the sum by rounding: the last id with p > 0 up to here, as the twin
      found = (hi > 0 ? hi : n) - 1;
      while (found > 0 && expf(x[found] / temperature - m) == 0.0f) --found;
    }
    pick = found;
  }
  __syncthreads();
  return pick;
}

__device__ __forceinline__ uint64_t candidate_key(uint32_t key, int32_t i) {
  return (static_cast<uint64_t>(key) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}
__device__ __forceinline__ int32_t candidate_id(uint64_t c) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(c & 0xFFFFFFFFu));
}

__device__ int32_t sample_candidates(const float* x, int32_t n, const SampleParams& p, float u) {
  const int32_t k = min(min(p.top_k > 0 ? p.top_k : n, n), kSampleMaxCandidates);
  const float temp = p.temperature;
  __shared__ uint32_t hist[256];
  __shared__ uint32_t sel_bin, sel_remaining;
  __shared__ uint64_t cand[kThreads];
  __shared__ float e_s[kThreads];
  __shared__ int32_t n_cand, warp_counts[32];
  __shared__ int32_t pick;

  // radix select, 8 bits at a time from the top: the k-th largest key
  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t key = cuda::order_key(x[i] / temp);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 0xFF], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      uint32_t above = 0;
      for (int b = 255; b >= 0; --b) {
        if (above + hist[b] >= remaining) {
          sel_bin = b;
          sel_remaining = remaining - above;
          break;
        }
        above += hist[b];
      }
    }
    __syncthreads();
    prefix |= sel_bin << shift;
    mask |= 0xFFu << shift;
    remaining = sel_remaining;
  }
  const uint32_t kth = prefix;  // ids with a larger key all go in; `remaining` ties with it do

  if (threadIdx.x == 0) n_cand = 0;
  __syncthreads();
  for (int32_t i = threadIdx.x; i < n; i += blockDim.x) {
    const uint32_t key = cuda::order_key(x[i] / temp);
    if (key > kth) cand[atomicAdd(&n_cand, 1)] = candidate_key(key, i);
  }
  // ties in index order: a block-wide rank of each tied id
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t tie_base = 0;
  for (int32_t c0 = 0; c0 < n && tie_base < remaining; c0 += blockDim.x) {
    const int32_t i = c0 + threadIdx.x;
    const bool tied = i < n && cuda::order_key(x[i] / temp) == kth;
    const unsigned ballot = __ballot_sync(cuda::kFullMask, tied);
    if (lane == 0) warp_counts[warp] = __popc(ballot);
    __syncthreads();
    uint32_t offset = 0, total = 0;
    for (int w = 0; w < static_cast<int>(blockDim.x) / 32; ++w) {
      if (w < warp) offset += warp_counts[w];
      total += warp_counts[w];
    }
    const uint32_t rank = tie_base + offset + __popc(ballot & ((1u << lane) - 1));
    if (tied && rank < remaining) cand[atomicAdd(&n_cand, 1)] = candidate_key(kth, i);
    tie_base += total;
    __syncthreads();
  }
  __syncthreads();
  if (static_cast<int32_t>(threadIdx.x) >= n_cand) cand[threadIdx.x] = 0;  // sorts last
  __syncthreads();

  // bitonic sort, descending
  for (int size = 2; size <= kThreads; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      const int i = threadIdx.x, j = i ^ stride;
      if (j > i) {
        const uint64_t a = cand[i], b = cand[j];
        const bool descending = (i & size) == 0;
        if (descending ? a < b : a > b) {
          cand[i] = b;
          cand[j] = a;
        }
      }
      __syncthreads();
    }
  }

  const float z0 = x[candidate_id(cand[0])] / temp;
  if (static_cast<int32_t>(threadIdx.x) < k) e_s[threadIdx.x] = expf(x[candidate_id(cand[threadIdx.x])] / temp - z0);
  __syncthreads();
  if (threadIdx.x == 0) {
    double sum = 0.0;
    for (int32_t j = 0; j < k; ++j) sum += e_s[j];
    int32_t keep = k;
    if (p.top_p < 1.0f) {
      const double need = static_cast<double>(p.top_p) * sum;
      double mass = 0.0;
      for (int32_t j = 0; j < k; ++j) {
        mass += e_s[j];
        if (mass >= need) {
          keep = j + 1;
          break;
        }
      }
    }
    double total = 0.0;
    for (int32_t j = 0; j < keep; ++j) total += e_s[j];
    const double target = static_cast<double>(u) * total;
    double cum = 0.0;
    int32_t chosen = candidate_id(cand[keep - 1]);
    for (int32_t j = 0; j < keep; ++j) {
      cum += e_s[j];
      if (target < cum) {
        chosen = candidate_id(cand[j]);
        break;
      }
    }
    pick = chosen;
  }
  __syncthreads();
  return pick;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(const float* logits, int32_t n_vocab,
                                                          const SampleParams* params, int32_t* out) {
  const float* x = logits + static_cast<int64_t>(blockIdx.x) * n_vocab;
  const SampleParams p = params[blockIdx.x];
  int32_t id;
  if (!(p.temperature > 0.0f)) {
    id = block_argmax(x, n_vocab);
  } else {
    const float u = sample_uniform(p.seed, p.step);
    const bool whole = (p.top_k <= 0 || p.top_k >= n_vocab) && p.top_p >= 1.0f;
    id = whole ? sample_whole(x, n_vocab, p.temperature, u) : sample_candidates(x, n_vocab, p, u);
  }
  if (threadIdx.x == 0) out[blockIdx.x] = id;
}

}  // namespace

int launch_argmax(const float* logits, int32_t n_rows, int32_t n_vocab, int32_t* out, void* stream) {
  if (n_rows <= 0 || n_vocab <= 0) return 0;
  argmax_kernel<<<n_rows, 256, 0, cuda::as_stream(stream)>>>(logits, n_vocab, out);
  return cuda::launch_status();
}

int launch_sample(const float* logits, int32_t n_rows, int32_t n_vocab, const SampleParams* params,
                  int32_t* out, void* stream) {
  if (n_rows <= 0 || n_vocab <= 0) return 0;
  sample_kernel<<<n_rows, kThreads, 0, cuda::as_stream(stream)>>>(logits, n_vocab, params, out);
  return cuda::launch_status();
}

}  // namespace helios::kernels
