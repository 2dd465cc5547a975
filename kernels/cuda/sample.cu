// Sampling rows of logits on the device (ref_sample_rows' twin): the adjusted, tempered logits
// sorted per row by a stable segmented radix sort (ties keep ascending ids), then one block per
// row walks the order with block scans to the top-p cut, the min-p cut and the draw. No float
// atomics: the result depends on the data alone.
#include <cub/cub.cuh>

#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 256;
constexpr size_t kAlign = 256;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The workspace, cut in the same places by the size query and the launch.
struct SampleWorkspace {
  float* keys_in = nullptr;
  float* keys_out = nullptr;
  int32_t* ids_in = nullptr;
  int32_t* ids_out = nullptr;
  int32_t* offsets = nullptr;  // [n_rows + 1] row starts
  void* sort_storage = nullptr;
  size_t sort_bytes = 0;
  size_t total = 0;
};

SampleWorkspace lay_out(void* base, int32_t n_rows, int32_t n_vocab, size_t sort_bytes) {
  const size_t n = static_cast<size_t>(n_rows) * n_vocab;
  auto* p = static_cast<uint8_t*>(base);
  size_t at = 0;
  auto take = [&](size_t bytes) {
    void* q = p ? p + at : nullptr;
    at += aligned(bytes);
    return q;
  };
  SampleWorkspace w;
  w.keys_in = static_cast<float*>(take(n * sizeof(float)));
  w.keys_out = static_cast<float*>(take(n * sizeof(float)));
  w.ids_in = static_cast<int32_t*>(take(n * sizeof(int32_t)));
  w.ids_out = static_cast<int32_t*>(take(n * sizeof(int32_t)));
  w.offsets = static_cast<int32_t*>(take((n_rows + 1) * sizeof(int32_t)));
  w.sort_storage = take(sort_bytes);
  w.sort_bytes = sort_bytes;
  w.total = at;
  return w;
}

size_t sort_storage_bytes(int32_t n_rows, int32_t n_vocab) {
  size_t bytes = 0;
  cub::DeviceSegmentedRadixSort::SortPairsDescending(nullptr, bytes, static_cast<const float*>(nullptr),
                                                     static_cast<float*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), n_rows * n_vocab, n_rows,
                                                     static_cast<const int32_t*>(nullptr),
                                                     static_cast<const int32_t*>(nullptr));
  return bytes;
}

// The sort key of a logit: tempered, and -0 as +0 (the radix sort orders -0 below +0; the host's
// comparisons take them as equal, leaving the tie to the ids).
__device__ __forceinline__ float sort_key(float z, float temperature) {
  const float k = temperature == 0.0f ? z : z / temperature;
  return k == 0.0f ? 0.0f : k;
}

// Rounded op by op (no fused multiply-add), as the host's Sampler computes it.
__device__ __forceinline__ float adjusted(const LogitAdjust& a, float x, float repetition_penalty) {
  float y = __fadd_rn(x, a.bias);
  if (a.repeat) y = y > 0 ? __fdiv_rn(y, repetition_penalty) : __fmul_rn(y, repetition_penalty);
  return __fsub_rn(y, a.subtract);
}

// keys = logits / temperature (as they are when greedy), ids = 0..n_vocab-1; grid (chunks, rows).
__global__ void tempered_kernel(const float* logits, int32_t n_vocab, const SampleRow* rows, float* keys,
                                int32_t* ids, int32_t* offsets, int32_t n_rows) {
  const int32_t r = blockIdx.y;
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    offsets[r] = r * n_vocab;
    if (r == n_rows - 1) offsets[n_rows] = n_rows * n_vocab;
  }
  if (i >= n_vocab) return;
  const SampleRow row = rows[r];
  const float x = logits[static_cast<int64_t>(row.logits_row) * n_vocab + i];
  const size_t at = static_cast<size_t>(r) * n_vocab + i;
  keys[at] = sort_key(x, row.temperature);
  ids[at] = i;
}

// The adjusted tokens' keys (each token once per row): one block per row.
__global__ void adjust_kernel(const float* logits, int32_t n_vocab, const SampleRow* rows, const LogitAdjust* adjust,
                              float* keys) {
  const int32_t r = blockIdx.x;
  const SampleRow row = rows[r];
  for (int32_t a = row.adjust_begin + threadIdx.x; a < row.adjust_end; a += blockDim.x) {
    const int32_t t = adjust[a].token;
    if (t < 0 || t >= n_vocab) continue;
    const float y = adjusted(adjust[a], logits[static_cast<int64_t>(row.logits_row) * n_vocab + t], row.repetition_penalty);
    keys[static_cast<size_t>(r) * n_vocab + t] = sort_key(y, row.temperature);
  }
}

// Greedy rows only: each row's largest key, the lowest id on ties, into the first id of its sorted
// order, the only entry select_kernel reads for a greedy row; one block per row.
__global__ void __launch_bounds__(kThreads) argmax_kernel(const float* keys, int32_t n_vocab, int32_t* sorted_ids) {
  __shared__ float warp_key[kThreads / 32];
  __shared__ int32_t warp_id[kThreads / 32];
  const float* k = keys + static_cast<size_t>(blockIdx.x) * n_vocab;
  float best = -INFINITY;
  int32_t id = INT_MAX;
  for (int32_t i = threadIdx.x; i < n_vocab; i += kThreads) {  // ascending i: a tie keeps the first
    if (k[i] > best || (k[i] == best && id == INT_MAX)) {
      best = k[i];
      id = i;
    }
  }
  auto take = [&](float other_key, int32_t other_id) {
    if (other_key > best || (other_key == best && other_id < id)) {
      best = other_key;
      id = other_id;
    }
  };
  for (int o = 16; o > 0; o >>= 1) {
    const float other_key = __shfl_xor_sync(cuda::kFullMask, best, o);
    take(other_key, __shfl_xor_sync(cuda::kFullMask, id, o));
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    warp_key[warp] = best;
    warp_id[warp] = id;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) take(warp_key[w], warp_id[w]);
    sorted_ids[static_cast<size_t>(blockIdx.x) * n_vocab] = id == INT_MAX ? 0 : id;  // INT_MAX: a row of NaNs
  }
}

using Scan = cub::BlockScan<double, kThreads>;

struct SelectShared {
  typename Scan::TempStorage scan;
  double sums[32];
  float maxes[32];
  double carry;
  int32_t found;
};

// The first i < end whose running Σ prob reaches target, or -1: a block scan per chunk of the
// order, stopping at the chunk where it is reached.
template <typename Prob>
__device__ int32_t first_reaching(Prob prob, int32_t end, double target, SelectShared& sh) {
  double carry = 0;
  for (int32_t base = 0; base < end; base += kThreads) {
    const int32_t i = base + threadIdx.x;
    const double p = i < end ? static_cast<double>(prob(i)) : 0.0;
    double running = 0;
    Scan(sh.scan).InclusiveSum(p, running);
    running += carry;
    if (threadIdx.x == 0) sh.found = INT_MAX;
    __syncthreads();
    if (i < end && running >= target) atomicMin(&sh.found, i);
    if (threadIdx.x == kThreads - 1) sh.carry = running;
    __syncthreads();
    const int32_t found = sh.found;
    carry = sh.carry;
    __syncthreads();  // before the next chunk rewrites them and reuses the scan's storage
    if (found != INT_MAX) return found;
  }
  return -1;
}

// One block per row, over its sorted keys and ids.
__global__ void __launch_bounds__(kThreads) select_kernel(const float* logits, int32_t n_vocab, const SampleRow* rows,
                                                          const float* sorted_keys, const int32_t* sorted_ids,
                                                          int32_t* token, float* logprob) {
  __shared__ SelectShared sh;
  const int32_t r = blockIdx.x;
  const SampleRow row = rows[r];
  const float* z = sorted_keys + static_cast<size_t>(r) * n_vocab;
  const int32_t* id = sorted_ids + static_cast<size_t>(r) * n_vocab;
  int32_t chosen = id[0];  // greedy: the largest adjusted logit, the lowest id on ties
  if (row.temperature != 0.0f) {
    const int32_t n = row.top_k > 0 ? min(row.top_k, n_vocab) : n_vocab;
    const float max_z = z[0];
    double sum = 0;
    for (int32_t i = threadIdx.x; i < n; i += kThreads) sum += static_cast<double>(expf(z[i] - max_z));
    sum = cuda::block_sum(sum, sh.sums);
    auto prob = [&](int32_t i) { return static_cast<float>(static_cast<double>(expf(z[i] - max_z)) / sum); };

    int32_t keep = n;
    if (row.top_p < 1.0f) {
      const int32_t last = first_reaching(prob, n, static_cast<double>(row.top_p), sh);
      if (last >= 0) keep = last + 1;
    }
    if (row.min_p > 0.0f) {  // probabilities fall along the order: the first below the floor ends it
      const float floor = row.min_p * prob(0);
      if (threadIdx.x == 0) sh.found = keep;
      __syncthreads();
      for (int32_t i = 1 + threadIdx.x; i < keep; i += kThreads) {
        if (!(prob(i) >= floor)) {  // as the twin's test, so that NaN (a row of -inf) ends it too
          atomicMin(&sh.found, i);
          break;
        }
      }
      __syncthreads();
      keep = sh.found;
      __syncthreads();
    }
    double total = 0;
    for (int32_t i = threadIdx.x; i < keep; i += kThreads) total += static_cast<double>(prob(i));
    total = cuda::block_sum(total, sh.sums);
    const int32_t at = first_reaching(prob, keep, row.uniform * total, sh);
    chosen = id[at >= 0 ? at : keep - 1];
  }

  // Its log-probability under the raw row.
  const float* x = logits + static_cast<int64_t>(row.logits_row) * n_vocab;
  float m = -INFINITY;
  for (int32_t i = threadIdx.x; i < n_vocab; i += kThreads) m = fmaxf(m, x[i]);
  m = cuda::block_max(m, sh.maxes);
  double s = 0;
  for (int32_t i = threadIdx.x; i < n_vocab; i += kThreads) s += static_cast<double>(expf(x[i] - m));
  s = cuda::block_sum(s, sh.sums);
  if (threadIdx.x == 0) {
    token[r] = chosen;
    logprob[r] = static_cast<float>(x[chosen] - (static_cast<double>(m) + log(s)));
  }
}

}  // namespace

size_t sample_rows_workspace_bytes(int32_t n_rows, int32_t n_vocab) {
  if (n_rows <= 0 || n_vocab <= 0) return 0;
  return lay_out(nullptr, n_rows, n_vocab, sort_storage_bytes(n_rows, n_vocab)).total;
}

int launch_sample_rows(const float* logits, int32_t n_vocab, const SampleRow* rows, int32_t n_rows,
                       const LogitAdjust* adjust, void* workspace, size_t workspace_bytes, int32_t* token,
                       float* logprob, void* stream, bool all_greedy) {
  if (n_rows <= 0 || n_vocab <= 0) return 0;
  // The sort's item count and the offsets are int32, and the rows are the grid's y dimension.
  if (static_cast<int64_t>(n_rows) * n_vocab > INT32_MAX || n_rows > 65535) {
    return static_cast<int>(cudaErrorInvalidValue);
  }
  const SampleWorkspace w = lay_out(workspace, n_rows, n_vocab, sort_storage_bytes(n_rows, n_vocab));
  if (workspace_bytes < w.total) return static_cast<int>(cudaErrorInvalidValue);
  cudaStream_t s = cuda::as_stream(stream);
  const dim3 grid((n_vocab + kThreads - 1) / kThreads, n_rows);
  tempered_kernel<<<grid, kThreads, 0, s>>>(logits, n_vocab, rows, w.keys_in, w.ids_in, w.offsets, n_rows);
  adjust_kernel<<<n_rows, kThreads, 0, s>>>(logits, n_vocab, rows, adjust, w.keys_in);
  if (int e = cuda::launch_status(); e != 0) return e;
  if (all_greedy) {
    argmax_kernel<<<n_rows, kThreads, 0, s>>>(w.keys_in, n_vocab, w.ids_out);
  } else {
    size_t sort_bytes = w.sort_bytes;
    const cudaError_t sorted = cub::DeviceSegmentedRadixSort::SortPairsDescending(
        w.sort_storage, sort_bytes, w.keys_in, w.keys_out, w.ids_in, w.ids_out, n_rows * n_vocab, n_rows, w.offsets,
        w.offsets + 1, 0, static_cast<int>(sizeof(float) * 8), s);
    if (sorted != cudaSuccess) return static_cast<int>(sorted);
  }
  select_kernel<<<n_rows, kThreads, 0, s>>>(logits, n_vocab, rows, w.keys_out, w.ids_out, token, logprob);
  return cuda::launch_status();
}

}  // namespace helios::kernels
