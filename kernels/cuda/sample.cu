// Sampling rows of logits on the device (ref_sample_rows' twin): the adjusted, tempered logits
// sorted by one stable device-wide radix sort over every row at once (each key holds its row above
// the logit, so rows stay apart and ties keep ascending ids), then one block per row walks the order
// with block scans to the top-p cut, the min-p cut and the draw. A device-wide sort keeps the whole
// GPU at work for one row (a segmented sort gives each row one block: some 150K keys sorted by one
// SM at batch 1). No float atomics: the result depends on the data alone.
#include <cub/cub.cuh>

#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/kernels.h"

namespace helios::kernels {
namespace {

constexpr int kThreads = 256;
constexpr size_t kAlign = 256;

#define HD __host__ __device__ __forceinline__

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// --- Sort keys: (row << 32) | ~ascending(logit), sorted ascending: rows in order, and within a
// row the logits descending.

// The logit tempered, as softmax_logit takes it (NaN as -inf, so never drawn while a number is
// left; +inf, or an overflow over a tiny temperature, as FLT_MAX), and -0 as +0 (the bits order -0
// below +0; the host's comparisons take them as equal, leaving the tie to the ids).
HD float tempered(float z, float temperature) {
  z = cuda::softmax_logit(z);
  const float k = cuda::softmax_logit(temperature == 0.0f ? z : z / temperature);
  return k == 0.0f ? 0.0f : k;
}

HD uint64_t sort_key(int32_t row, float key) {
  return (static_cast<uint64_t>(row) << 32) | ~cuda::order_key(key);
}

HD float key_logit(uint64_t key) {
  const uint32_t ascending = ~static_cast<uint32_t>(key);
  return cuda::bit_cast<float>((ascending & 0x80000000u) ? (ascending & 0x7FFFFFFFu) : ~ascending);
}

// The key bits the sort reads: the logit's 32 and as many above as the last row's index needs.
int sort_end_bit(int32_t n_rows) {
  int bits = 32;
  while ((uint64_t{1} << (bits - 32)) < static_cast<uint64_t>(n_rows)) ++bits;
  return bits;
}

// The workspace, cut in the same places by the size query and the launch: keys and ids twice (the
// sort's double buffer) and the sort's own storage.
struct SampleWorkspace {
  uint64_t* keys[2] = {nullptr, nullptr};
  int32_t* ids[2] = {nullptr, nullptr};
  void* sort_storage = nullptr;
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
  for (int b = 0; b < 2; ++b) w.keys[b] = static_cast<uint64_t*>(take(n * sizeof(uint64_t)));
  for (int b = 0; b < 2; ++b) w.ids[b] = static_cast<int32_t*>(take(n * sizeof(int32_t)));
  w.sort_storage = take(sort_bytes);
  w.total = at;
  return w;
}

// Rows a launch can take: the sort's item count is int32, and the rows are a grid's y dimension.
bool launchable(int32_t n_rows, int32_t n_vocab) {
  return n_rows > 0 && n_vocab > 0 && n_rows <= 65535 && static_cast<int64_t>(n_rows) * n_vocab <= INT32_MAX;
}

cudaError_t sort_storage_bytes(int32_t n_rows, int32_t n_vocab, size_t* bytes) {
  cub::DoubleBuffer<uint64_t> keys(nullptr, nullptr);
  cub::DoubleBuffer<int32_t> ids(nullptr, nullptr);
  return cub::DeviceRadixSort::SortPairs(nullptr, *bytes, keys, ids, n_rows * n_vocab, 0, sort_end_bit(n_rows));
}

// Rounded op by op (no fused multiply-add), as the host's Sampler computes it.
__device__ __forceinline__ float adjusted(const LogitAdjust& a, float x, float repetition_penalty) {
  float y = __fadd_rn(x, a.bias);
  if (a.repeat) y = y > 0 ? __fdiv_rn(y, repetition_penalty) : __fmul_rn(y, repetition_penalty);
  return __fsub_rn(y, a.subtract);
}

// keys from logits / temperature (as they are when greedy), ids = 0..n_vocab-1; grid (chunks, rows).
__global__ void tempered_kernel(const float* logits, int32_t n_vocab, const SampleRow* rows, uint64_t* keys,
                                int32_t* ids) {
  const int32_t r = blockIdx.y;
  const int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n_vocab) return;
  const SampleRow row = rows[r];
  const float x = logits[static_cast<int64_t>(row.logits_row) * n_vocab + i];
  const size_t at = static_cast<size_t>(r) * n_vocab + i;
  keys[at] = sort_key(r, tempered(x, row.temperature));
  ids[at] = i;
}

// The adjusted tokens' keys (each token once per row): one block per row.
__global__ void adjust_kernel(const float* logits, int32_t n_vocab, const SampleRow* rows, const LogitAdjust* adjust,
                              uint64_t* keys) {
  const int32_t r = blockIdx.x;
  const SampleRow row = rows[r];
  for (int32_t a = row.adjust_begin + threadIdx.x; a < row.adjust_end; a += blockDim.x) {
    const int32_t t = adjust[a].token;
    if (t < 0 || t >= n_vocab) continue;
    const float y = adjusted(adjust[a], logits[static_cast<int64_t>(row.logits_row) * n_vocab + t], row.repetition_penalty);
    keys[static_cast<size_t>(r) * n_vocab + t] = sort_key(r, tempered(y, row.temperature));
  }
}

// Greedy rows only: each row's largest key, the lowest id on ties, into the first id of its sorted
// order, the only entry select_kernel reads for a greedy row; one block per row.
__global__ void __launch_bounds__(kThreads) argmax_kernel(const uint64_t* keys, int32_t n_vocab, int32_t* sorted_ids) {
  __shared__ float warp_key[kThreads / 32];
  __shared__ int32_t warp_id[kThreads / 32];
  const uint64_t* k = keys + static_cast<size_t>(blockIdx.x) * n_vocab;
  float best = -INFINITY;
  int32_t id = INT_MAX;  // until the thread's first key (no key is NaN: tempered() made it -inf)
  for (int32_t i = threadIdx.x; i < n_vocab; i += kThreads) {  // ascending i: a tie keeps the first
    const float v = key_logit(k[i]);
    if (v > best || id == INT_MAX) {
      best = v;
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
    sorted_ids[static_cast<size_t>(blockIdx.x) * n_vocab] = id;
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

// One block per row, over its sorted keys and ids (a few blocks at once: registers before
// occupancy, so none spill).
__global__ void __launch_bounds__(kThreads, 1) select_kernel(const float* logits, int32_t n_vocab, const SampleRow* rows,
                                                          const uint64_t* sorted_keys, const int32_t* sorted_ids,
                                                          bool all_greedy, int32_t* token, float* logprob) {
  __shared__ SelectShared sh;
  const int32_t r = blockIdx.x;
  const SampleRow row = rows[r];
  const uint64_t* keys = sorted_keys + static_cast<size_t>(r) * n_vocab;
  auto z = [&](int32_t i) { return key_logit(keys[i]); };
  const int32_t* id = sorted_ids + static_cast<size_t>(r) * n_vocab;
  int32_t chosen = id[0];  // greedy: the largest adjusted logit, the lowest id on ties
  if (row.temperature != 0.0f && !all_greedy) {  // all_greedy: nothing was sorted, only id[0] is set
    const int32_t n = row.top_k > 0 ? min(row.top_k, n_vocab) : n_vocab;
    const float max_z = z(0);
    double sum = 0;
    for (int32_t i = threadIdx.x; i < n; i += kThreads) sum += static_cast<double>(expf(z(i) - max_z));
    sum = cuda::block_sum(sum, sh.sums);
    auto prob = [&](int32_t i) { return static_cast<float>(static_cast<double>(expf(z(i) - max_z)) / sum); };

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
  for (int32_t i = threadIdx.x; i < n_vocab; i += kThreads) m = fmaxf(m, cuda::softmax_logit(x[i]));
  m = cuda::block_max(m, sh.maxes);
  double s = 0;
  if (m != -INFINITY) {  // the same m in every thread
    for (int32_t i = threadIdx.x; i < n_vocab; i += kThreads) s += static_cast<double>(expf(cuda::softmax_logit(x[i]) - m));
    s = cuda::block_sum(s, sh.sums);
  }
  if (threadIdx.x == 0) {  // kernels::LogSoftmax's rule: x − m first, then the log term; no number: uniform
    token[r] = chosen;
    logprob[r] = m == -INFINITY ? static_cast<float>(-log(static_cast<double>(n_vocab)))
                                : static_cast<float>((static_cast<double>(cuda::softmax_logit(x[chosen])) - m) - log(s));
  }
}

}  // namespace

uint64_t sample_sort_key(int32_t row, float logit, float temperature) {
  return sort_key(row, tempered(logit, temperature));
}
float sample_sort_key_logit(uint64_t key) { return key_logit(key); }
int sample_sort_end_bit(int32_t n_rows) { return sort_end_bit(n_rows); }

size_t sample_rows_workspace_bytes(int32_t n_rows, int32_t n_vocab) {
  size_t sort_bytes = 0;
  if (!launchable(n_rows, n_vocab) || sort_storage_bytes(n_rows, n_vocab, &sort_bytes) != cudaSuccess) return 0;
  return lay_out(nullptr, n_rows, n_vocab, sort_bytes).total;
}

int launch_sample_rows(const float* logits, int32_t n_vocab, const SampleRow* rows, int32_t n_rows,
                       const LogitAdjust* adjust, void* workspace, size_t workspace_bytes, int32_t* token,
                       float* logprob, void* stream, bool all_greedy) {
  if (n_rows <= 0 || n_vocab <= 0) return 0;
  if (!launchable(n_rows, n_vocab)) return static_cast<int>(cudaErrorInvalidValue);
  size_t sort_bytes = 0;
  if (const cudaError_t e = sort_storage_bytes(n_rows, n_vocab, &sort_bytes); e != cudaSuccess) {
    return static_cast<int>(e);
  }
  const SampleWorkspace w = lay_out(workspace, n_rows, n_vocab, sort_bytes);
  if (workspace_bytes < w.total) return static_cast<int>(cudaErrorInvalidValue);
  cudaStream_t s = cuda::as_stream(stream);
  const dim3 grid((n_vocab + kThreads - 1) / kThreads, n_rows);
  tempered_kernel<<<grid, kThreads, 0, s>>>(logits, n_vocab, rows, w.keys[0], w.ids[0]);
  adjust_kernel<<<n_rows, kThreads, 0, s>>>(logits, n_vocab, rows, adjust, w.keys[0]);
  if (int e = cuda::launch_status(); e != 0) return e;
  cub::DoubleBuffer<uint64_t> keys(w.keys[0], w.keys[1]);
  cub::DoubleBuffer<int32_t> ids(w.ids[0], w.ids[1]);
  if (all_greedy) {  // select_kernel reads only each row's first id
    argmax_kernel<<<n_rows, kThreads, 0, s>>>(w.keys[0], n_vocab, w.ids[1]);
    ids.selector = 1;
  } else {
    const cudaError_t sorted = cub::DeviceRadixSort::SortPairs(w.sort_storage, sort_bytes, keys, ids, n_rows * n_vocab,
                                                               0, sort_end_bit(n_rows), s);
    if (sorted != cudaSuccess) return static_cast<int>(sorted);
  }
  select_kernel<<<n_rows, kThreads, 0, s>>>(logits, n_vocab, rows, keys.Current(), ids.Current(), all_greedy, token,
                                            logprob);
  return cuda::launch_status();
}

}  // namespace helios::kernels
